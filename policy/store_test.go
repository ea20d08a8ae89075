package policy

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemoryStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st := NewMemory()
	w, err := st.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	first, err := w.Next(ctx)
	if err != nil || first.Revision != 0 || len(first.Policy.Lanes) != 0 {
		t.Fatalf("first document %+v, %v; want the empty policy", first, err)
	}
	if _, err := st.Put(ctx, []byte("lanes:\n  alice: {strict: true}\n")); err != nil {
		t.Fatal(err)
	}
	doc, err := w.Next(ctx)
	if err != nil || !doc.Policy.Lanes["alice"].Strict || doc.Revision != 1 {
		t.Fatalf("watched %+v, %v", doc, err)
	}
	// An invalid document is refused as a whole; the previous stays in force.
	if _, err := st.Put(ctx, []byte("lanes:\n  alice: {strict: maybe}\n")); err == nil {
		t.Fatal("invalid document accepted")
	}
	got, _ := st.Get(ctx)
	if got.Revision != 1 || !got.Policy.Lanes["alice"].Strict {
		t.Fatalf("document in force changed to %+v", got)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := w.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("refused document reached the watcher: %v", err)
	}
	w.Close()
	if _, err := w.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}
