package accept

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/faultln"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func dial(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTemporary: the errors of a process or machine short of something are
// waited out; a closed listener and other errors are not.
func TestTemporary(t *testing.T) {
	op := func(e error) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{op(syscall.EMFILE), true},
		{op(syscall.ENFILE), true},
		{op(syscall.ENOBUFS), true},
		{op(syscall.ENOMEM), true},
		{op(syscall.ECONNABORTED), true},
		{op(os.ErrDeadlineExceeded), true},
		{op(net.ErrClosed), false},
		{op(syscall.EBADF), false},
		{op(syscall.EINVAL), false},
		{errors.New("other"), false},
	} {
		if got := Temporary(c.err); got != c.want {
			t.Errorf("Temporary(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestBacksOffOnEMFILE: Accept waits out EMFILE and returns the next
// connection; a listener that is not wrapped returns the error.
func TestBacksOffOnEMFILE(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			fl := faultln.New(listen(t), 4, errno)
			defer fl.Close()
			dial(t, fl)
			if _, err := fl.Accept(); !errors.Is(err, errno) {
				t.Fatalf("the failing listener's Accept: %v, want %v", err, errno)
			}
			l := Wrap(fl, Options{Name: "test"})
			c, err := l.Accept()
			if err != nil {
				t.Fatalf("Accept after %v: %v, want the connection", errno, err)
			}
			c.Close()
			if n := fl.Errs.Load(); n != 4 {
				t.Errorf("%d errors seen, want 4", n)
			}
		})
	}
}

// TestCloseEndsBackoff: Close ends an Accept that waits out errors, with
// net.ErrClosed.
func TestCloseEndsBackoff(t *testing.T) {
	fl := faultln.New(listen(t), 1<<30, syscall.EMFILE)
	l := Wrap(fl, Options{Name: "test"})
	dial(t, l)
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		done <- err
	}()
	for fl.Errs.Load() < 3 { // it is in its backoff
		time.Sleep(time.Millisecond)
	}
	l.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// TestOtherErrorReturned: an error that is not temporary ends Accept.
func TestOtherErrorReturned(t *testing.T) {
	l := Wrap(faultln.New(listen(t), 1, syscall.EBADF), Options{Name: "test"})
	defer l.Close()
	dial(t, l)
	if _, err := l.Accept(); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("Accept: %v, want EBADF", err)
	}
}

// TestCapSheds: with MaxConns 2, the third connection is answered by Shed
// and closed, and counted; once one closes, the next is accepted.
func TestCapSheds(t *testing.T) {
	shed := 0
	l := Wrap(listen(t), Options{Name: "test", MaxConns: 2,
		Shed:   func(c net.Conn) { io.WriteString(c, "full\n") },
		OnShed: func() { shed++ }})
	accept := func() net.Conn {
		t.Helper()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	dial(t, l)
	a := accept()
	dial(t, l)
	b := accept()
	defer b.Close()
	if n := l.Open(); n != 2 {
		t.Fatalf("%d open, want 2", n)
	}
	third := dial(t, l)
	fourth := dial(t, l) // waits in the backlog while the third is shed
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		got <- c
	}()
	line, err := bufio.NewReader(third).ReadString('\n')
	if line != "full\n" {
		t.Fatalf("the third connection read %q, %v; want the shed answer", line, err)
	}
	if _, err := third.Read(make([]byte, 1)); err == nil {
		t.Fatal("the third connection is still open")
	}
	// The fourth is shed too, until one closes: the shed answer says so.
	if line, _ := bufio.NewReader(fourth).ReadString('\n'); line != "full\n" {
		t.Fatalf("the fourth connection read %q; want the shed answer", line)
	}
	a.Close()
	a.Close() // a second Close frees no second place
	dial(t, l)
	c := <-got
	if c == nil {
		t.Fatal("no connection accepted after one closed")
	}
	c.Close()
	if shed != 2 {
		t.Errorf("%d shed, want 2", shed)
	}
	if n := l.Open(); n != 1 {
		t.Errorf("%d open, want 1", n)
	}
}

func TestShare(t *testing.T) {
	lim := openFileLimit()
	if lim == 0 {
		t.Skip("no open-file limit here")
	}
	if got, want := Share(4, 1<<30), int(lim/4); got != want {
		t.Errorf("Share(4, big) = %d, want %d (limit %d)", got, want, lim)
	}
	if got := Share(4, 3); got != 3 {
		t.Errorf("Share(4, 3) = %d, want 3", got)
	}
	if got := Share(int(lim)+1, 10); got != 1 {
		t.Errorf("Share(limit+1, 10) = %d, want 1", got)
	}
}
