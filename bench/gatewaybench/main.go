// Command gatewaybench runs the lanes gateway for bench/gateway.sh: an
// in-memory registry holding a baseline and an alice instance of the service
// "bench", a routing engine following it, and the gateway (internal/app/gateway)
// routing every path to that service.
//
//	gatewaybench -addr 127.0.0.1:0 -baseline 127.0.0.1:9001 -alice 127.0.0.1:9002 [-http1 fast|std]
//
// -http1 chooses the gateway's HTTP/1.1 stack (gateway.Config.HTTP1): fast
// (fasthttp, the default) or std (net/http).
// It prints the address it listens on, then serves until SIGINT or SIGTERM.
// With -cpuprofile it writes a CPU profile of the whole run on exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address of the gateway")
	base := flag.String("baseline", "", "address of the baseline backend")
	alice := flag.String("alice", "", "address of the alice backend")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file")
	http1 := flag.String("http1", gateway.HTTP1Fast, "the gateway's HTTP/1.1 stack: fast (fasthttp) or std (net/http)")
	plain := flag.Bool("plain", false, "serve a plain httputil.ReverseProxy to the baseline backend instead (no lanes), for comparison")
	flag.Parse()
	if *base == "" || *alice == "" {
		log.Fatal("gatewaybench: -baseline and -alice are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	reg := registry.NewMemory()
	defer reg.Close()
	for _, in := range []registry.Instance{
		{ID: "baseline-1", Service: "bench", Addr: *base},
		{ID: "alice-1", Service: "bench", Addr: *alice, Lane: "alice"},
	} {
		lease, err := reg.Register(ctx, in, 0)
		if err != nil {
			log.Fatal(err)
		}
		defer lease.Close()
	}
	e := routing.New(routing.WithRegistry(reg))
	defer e.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := gateway.New(gateway.Config{
		Engine: e,
		Routes: []gateway.Route{{Prefix: "/", Service: "bench"}},
		Logger: logger,
		HTTP1:  *http1,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := e.Service("bench").WaitReady(ctx); err != nil {
		log.Fatal(err)
	}

	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Addr().String())
	os.Stdout.Sync()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	served := make(chan error, 1)
	if *plain {
		srv := plainServer(*base)
		go func() { served <- srv.Serve(l) }()
		defer srv.Close()
	} else {
		go func() { served <- g.Serve(l) }()
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Print(err)
		}
	}
	g.Close()
}

// plainServer serves an httputil.ReverseProxy to target with the transport
// settings and the buffer pool of the gateway: the Go baseline that lanes
// adds its work to.
func plainServer(target string) *http.Server {
	u := &url.URL{Scheme: "http", Host: target}
	var p1 http.Protocols
	p1.SetHTTP1(true)
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: gateway.DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		Protocols:           &p1,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport:  tr,
		BufferPool: pool{}, // as the gateway does: without it, 32 KiB per request
	}
	return &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
}

type pool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (pool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (pool) Put(b []byte) { buffers.Put(&b) }
