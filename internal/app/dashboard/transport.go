package dashboard

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// handlerTransport is an http.RoundTripper that serves each request on an
// http.Handler in the process — the admin API — so that the dashboard's
// calls go through every access rule of the API as they are, with no
// network hop. Answers stream: a watch's lines reach the caller as the
// handler flushes them.
type handlerTransport struct{ h http.Handler }

type remoteAddrKey struct{}

// withRemoteAddr makes the API see the calls made with ctx as coming from
// addr (the browser's address).
func withRemoteAddr(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, remoteAddrKey{}, addr)
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	in := req.Clone(ctx)
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "127.0.0.1:0"
	if a, ok := ctx.Value(remoteAddrKey{}).(string); ok && a != "" {
		in.RemoteAddr = a
	}
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			w.start(http.StatusOK)
			pw.Close()
		}()
		t.h.ServeHTTP(w, in)
	}()
	select {
	case <-w.ready:
	case <-ctx.Done():
		cancel()
		pr.Close()
		<-done
		return nil, ctx.Err()
	}
	return &http.Response{
		Status:     http.StatusText(w.status),
		StatusCode: w.status,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  w.sent,
		Body:    &pipeBody{pr: pr, cancel: cancel, done: done},
		Request: req,
	}, nil
}

// pipeWriter is the http.ResponseWriter of an in-process call: the header is
// sent when the handler first writes or flushes, the body through a pipe.
type pipeWriter struct {
	header http.Header
	pw     *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
	status int
	sent   http.Header
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) start(status int) {
	w.once.Do(func() {
		w.status = status
		w.sent = w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) WriteHeader(status int) { w.start(status) }

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.start(http.StatusOK)
	return w.pw.Write(b)
}

// Flush sends the header; the pipe hands over each write as it is made.
func (w *pipeWriter) Flush() { w.start(http.StatusOK) }

// pipeBody ends the handler's request when the caller closes the body, and
// waits for the handler to return.
type pipeBody struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
}

func (b *pipeBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b *pipeBody) Close() error {
	b.cancel()
	b.pr.Close()
	<-b.done
	return nil
}
