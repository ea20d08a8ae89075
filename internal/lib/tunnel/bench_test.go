package tunnel

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// BenchmarkTunnel measures an HTTP call through the tunnel (a client on
// the control plane's side calls the relay; the machine's end pipes the
// connection to the local server) against the same call over loopback,
// for a small answer and a 1 MiB one. ns/op is the call's latency with a
// kept-alive connection, MB/s the answer's throughput.
func BenchmarkTunnel(b *testing.B) {
	small := bytes.Repeat([]byte("x"), 128)
	big := bytes.Repeat([]byte("y"), 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := small
		if r.URL.Path == "/big" {
			body = big
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()

	t := &testing.T{}
	hs, s := startServer(t, "")
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, hs.URL, "secret", "", nil)
	if err != nil {
		b.Fatal(err)
	}
	done := serveLocal(c, ln.Addr().String())
	relay := <-s.relay
	defer func() {
		c.Close(5 * time.Second)
		<-done
		<-s.closed
	}()

	for _, size := range []struct {
		name, path string
		n          int
	}{{"small", "/small", len(small)}, {"1MiB", "/big", len(big)}} {
		for _, via := range []struct{ name, addr string }{{"loopback", ln.Addr().String()}, {"tunnel", relay}} {
			b.Run(size.name+"/"+via.name, func(b *testing.B) {
				tr := &http.Transport{MaxIdleConnsPerHost: 1}
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr}
				url := "http://" + via.addr + size.path
				b.SetBytes(int64(size.n))
				b.ReportAllocs()
				for b.Loop() {
					res, err := client.Get(url)
					if err != nil {
						b.Fatal(err)
					}
					n, _ := io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if n != int64(size.n) {
						b.Fatalf("read %d bytes, want %d", n, size.n)
					}
				}
			})
		}
	}
}
