package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRestartKeepsMessages: each kind of server keeps a stream's messages
// over a clean restart, and the process over a SIGKILL too, on the same URL.
func TestRestartKeepsMessages(t *testing.T) {
	Each(t, func(t *testing.T, srv Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		url := srv.URL()
		_, js := Connect(t, url)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "t.a", []byte("one")); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "t.a", []byte("two")); err != nil {
			t.Fatal(err)
		}
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		if srv.URL() != url {
			t.Errorf("URL %s after restart, want %s", srv.URL(), url)
		}
		_, js2 := Connect(t, url)
		st, err := js2.Stream(ctx, "T")
		if err != nil {
			t.Fatal(err)
		}
		if n := st.CachedInfo().State.Msgs; n != 2 {
			t.Errorf("%s: %d messages, want 2", srv.Kind(), n)
		}
	})
}
