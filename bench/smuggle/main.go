// Command smuggle sends the request-smuggling table of
// internal/testkit/smuggletest to the lanes gateway, on each of its HTTP/1.1
// stacks (fast: fasthttp; std: net/http), and to nginx, each a
// reverse proxy on loopback in front of the same recording backend, and
// prints the answers side by side: the statuses of the answers on the
// connection, and whether the case passed (its first answer is one that RFC
// 9112 allows, and no smuggled request reached the backend).
//
//	go run ./bench/smuggle [-nginx /usr/sbin/nginx]
//
// bench/smuggling.sh installs nginx from Debian and runs it. Without nginx
// it prints the gateway's columns only.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/internal/testkit/smuggletest"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func main() {
	nginxBin := flag.String("nginx", "", "the nginx binary; default: nginx on PATH or /usr/sbin/nginx")
	flag.Parse()
	if err := run(*nginxBin); err != nil {
		log.Fatal("smuggle: ", err)
	}
}

func run(nginxBin string) error {
	ctx := context.Background()
	rec, err := smuggletest.NewRecorder()
	if err != nil {
		return err
	}
	defer rec.Close()

	reg := registry.NewMemory()
	defer reg.Close()
	lease, err := reg.Register(ctx, registry.Instance{ID: "rec", Service: "rec", Addr: rec.Addr}, 0)
	if err != nil {
		return err
	}
	defer lease.Close()
	e := routing.New(routing.WithRegistry(reg))
	defer e.Close()
	if err := e.Service("rec").WaitReady(ctx); err != nil {
		return err
	}
	// The gateway on each of its HTTP/1.1 stacks (gateway.Config.HTTP1).
	var proxies []struct{ name, addr string }
	for _, stack := range []string{gateway.HTTP1Fast, gateway.HTTP1Std} {
		g, err := gateway.New(gateway.Config{Engine: e, Routes: []gateway.Route{{Prefix: "/", Service: "rec"}},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HTTP1: stack})
		if err != nil {
			return err
		}
		defer g.Close()
		gl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go g.Serve(gl)
		proxies = append(proxies, struct{ name, addr string }{"lanes-" + stack, gl.Addr().String()})
	}
	if bin := findNginx(nginxBin); bin != "" {
		addr, stop, err := startNginx(bin, rec.Addr)
		if err != nil {
			return err
		}
		defer stop()
		proxies = append(proxies, struct{ name, addr string }{"nginx", addr})
	} else {
		fmt.Fprintln(os.Stderr, "smuggle: no nginx found; the gateway only")
	}

	fmt.Printf("%-42s", "case")
	for _, p := range proxies {
		fmt.Printf(" %-26s", p.name)
	}
	fmt.Println()
	fails := 0
	for _, c := range smuggletest.Cases {
		fmt.Printf("%-42s", c.Name)
		for _, p := range proxies {
			rec.Reset()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res := smuggletest.Send(cctx, p.addr, c)
			cancel()
			verdict := "ok"
			if err := smuggletest.Check(c, res, rec.Requests()); err != nil {
				verdict = "FAIL"
				fails++
				defer fmt.Printf("  %s, %s: %v\n", p.name, c.Name, err)
			}
			fmt.Printf(" %-26s", fmt.Sprintf("%s %s", verdict, short(res)))
		}
		fmt.Println()
	}
	if fails > 0 {
		fmt.Printf("\n%d failures (RFC 9112 allows the first answer's statuses in the table; see internal/testkit/smuggletest):\n", fails)
	}
	return nil
}

// short is the answers' statuses, and why reading stopped.
func short(r smuggletest.Result) string {
	s := fmt.Sprint(r.Statuses)
	if r.Status == 0 {
		s = "closed"
	}
	if r.Err != nil {
		s += " (err)"
	}
	return s
}

func findNginx(bin string) string {
	if bin != "" {
		return bin
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	return ""
}

// startNginx runs nginx as a keep-alive reverse proxy to backend on a free
// loopback port, and waits until it answers.
func startNginx(bin, backend string) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "lanes-smuggle-nginx")
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr = l.Addr().String()
	l.Close()
	conf := fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    upstream backend { server %[2]s; keepalive 16; }
    server {
        listen %[3]s;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
`, dir, backend, addr)
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "-p", dir, "-c", cf, "-g", "daemon off;")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		// SIGTERM: the master stops its workers (SIGKILL would orphan them).
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		os.RemoveAll(dir)
	}
	client := &http.Client{Timeout: time.Second} //lanes:ignore a readiness probe of the benchmark's own servers
	for i := 0; i < 100; i++ {
		if resp, err := client.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			return addr, stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("nginx did not answer on %s", addr)
}
