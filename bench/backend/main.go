// Command backend is the upstream of bench/gateway.sh: a tiny HTTP server
// that answers every request with "ok" and names its lane in the
// X-Backend-Lane response header ("baseline" for the baseline), so that the
// benchmark can check that every response came from the right lane.
//
//	backend -addr 127.0.0.1:0 -lane alice
//
// It prints the address it listens on, then serves until killed.
//
//	backend -free-port
//
// prints a free loopback TCP port and exits (the script uses it for nginx).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	ln := flag.String("lane", "", "the lane to report; empty for the baseline")
	free := flag.Bool("free-port", false, "print a free loopback port and exit")
	flag.Parse()
	if *free {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		return
	}
	name := *ln
	if name == "" {
		name = "baseline"
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Addr().String())
	os.Stdout.Sync()
	lane := []string{name}
	ct := []string{"text/plain; charset=utf-8"}
	body := []byte("ok\n")
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h["X-Backend-Lane"] = lane
			h["Content-Type"] = ct
			w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	log.Fatal(srv.Serve(l))
}
