package netbound

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeep(t *testing.T) {
	now := time.Now()
	d := 10 * time.Second // slack: 1s
	for _, c := range []struct {
		armed time.Time
		want  bool
	}{
		{time.Time{}, false},               // none set
		{now, true},                        // the one asked
		{now.Add(-time.Second), true},      // the slack early
		{now.Add(-time.Second - 1), false}, // more than the slack early
		{now.Add(time.Millisecond), false}, // later than asked: never kept
	} {
		if got := Keep(c.armed, now, d); got != c.want {
			t.Errorf("Keep(%v before the one asked) = %v, want %v", now.Sub(c.armed), got, c.want)
		}
	}
	if s := Slack(100 * time.Millisecond); s != 10*time.Millisecond {
		t.Errorf("Slack(100ms) = %v, want 10ms", s)
	}
	if s := Slack(time.Minute); s != time.Second {
		t.Errorf("Slack(1m) = %v, want 1s", s)
	}
}

// TestWriteTimeout writes to a peer that reads nothing (a pipe): the write
// fails with a *TimeoutError that names the parties; a write the peer takes
// goes through.
func TestWriteTimeout(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	n := &Names{Peer: "instance", What: "request", Setting: "write timeout"}
	c := NewConn(a, 50*time.Millisecond, n)
	_, err := c.Write([]byte("x"))
	var te *TimeoutError
	if !errors.As(err, &te) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a peer that reads nothing: %v, want a *TimeoutError", err)
	}
	if got, want := err.Error(), "the instance took none of the request for 50ms (the write timeout)"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	done := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 2)
		n, _ := b.Read(buf)
		done <- buf[:n]
	}()
	if _, err := c.Write([]byte("ok")); err != nil {
		t.Fatalf("write to a reading peer: %v", err)
	}
	if got := string(<-done); got != "ok" {
		t.Fatalf("the peer read %q", got)
	}
}
