package cli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/picktest"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// TestUpStalled suspends `lanes up` (SIGSTOP) under traffic for 10s and
// for 12s, the default TTL and more, then resumes it (SIGCONT). etcd, which
// was suspended with it, expires every lease at once on the resume; the
// gateway keeps routing to the instances it knew while they register again,
// so no request fails. The instances register both ways: through the admin
// API with scoped tokens (service web) and straight into etcd (service
// direct), each with a lane instance and a baseline one, at the default
// TTL.
func TestUpStalled(t *testing.T) {
	for _, pause := range []time.Duration{10 * time.Second, 12 * time.Second} {
		t.Run(pause.String(), func(t *testing.T) { testUpStalled(t, pause) })
	}
}

// stallSender sends one request at a time through the gateway, every
// 80ms, and counts the answers.
type stallSender struct {
	name, url string
	edit      func(*http.Request)
	want      string // the backend that must answer

	mu       sync.Mutex
	sent, ok int
	failed   []string // the first failures, for the log
	nFailed  int
	wrong    int // answered by another backend (a fallback)
	lastOK   int // consecutive successes at the end
}

func (s *stallSender) run(ctx context.Context, c *http.Client) {
	tick := time.NewTicker(80 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
		if s.edit != nil {
			s.edit(req)
		}
		resp, err := c.Do(req)
		if ctx.Err() != nil {
			return
		}
		var status int
		var a answer
		if err == nil {
			status = resp.StatusCode
			var body strings.Builder
			buf := make([]byte, 512)
			for {
				n, rerr := resp.Body.Read(buf)
				body.WriteString(string(buf[:n]))
				if rerr != nil {
					break
				}
			}
			resp.Body.Close()
			a.Body = body.String()
			if i := strings.Index(a.Body, `"backend":"`); i >= 0 {
				rest := a.Body[i+len(`"backend":"`):]
				a.Backend, _, _ = strings.Cut(rest, `"`)
			}
		}
		s.mu.Lock()
		s.sent++
		switch {
		case err == nil && status == http.StatusOK:
			s.ok++
			s.lastOK++
			if a.Backend != s.want {
				s.wrong++
			}
		default:
			s.nFailed++
			s.lastOK = 0
			if len(s.failed) < 5 {
				msg := fmt.Sprint(err)
				if err == nil {
					msg = fmt.Sprintf("%d %s", status, strings.TrimSpace(a.Body))
				}
				s.failed = append(s.failed, time.Now().Format("15:04:05.000")+" "+msg)
			}
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// counts returns sent, failed, and the successes in a row at the end.
func (s *stallSender) counts() (sent, failed, lastOK int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.nFailed, s.lastOK
}

// registrations records, from an etcd watch, when each instance was last
// deleted and put again.
type registrations struct {
	mu      sync.Mutex
	deleted map[string]time.Time
	put     map[string]time.Time
	changed chan struct{} // capacity 1
}

func (r *registrations) follow(ctx context.Context, w registry.Watcher) {
	for {
		b, err := w.Next(ctx)
		if err != nil {
			return
		}
		now := time.Now()
		r.mu.Lock()
		for _, ev := range b.Events {
			key := ev.Instance.Service + "/" + ev.Instance.ID
			if ev.Type == registry.EventDelete {
				r.deleted[key] = now
			} else if !b.Reset {
				r.put[key] = now
			}
		}
		r.mu.Unlock()
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
}

// back returns the instances not deleted and registered again since,
// and when the last of the others was registered again.
func (r *registrations) back(keys []string) (missing []string, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		d, deleted := r.deleted[k]
		p := r.put[k]
		if !deleted || !p.After(d) {
			missing = append(missing, k)
			continue
		}
		if p.After(last) {
			last = p
		}
	}
	return missing, last
}

// sleepCtx waits for d, or until ctx is done (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func testUpStalled(t *testing.T, pause time.Duration) {
	// A request in flight when the process is suspended would meet the
	// gateway's response header timeout on the resume (its timer ran
	// through the pause), and one whose head was on its way the client
	// header timeout; the test is about the registry, so both are longer
	// than the pause.
	u := startUp(t, "up", "--route", "/direct=direct", "--route", "/=web",
		"--gateway-response-header-timeout", "60s", "--gateway-client-header-timeout", "60s")
	aliceTok := u.newToken(t, adminapi.TokenRequest{Lane: "alice", Name: "alice"})
	baseTok := u.newToken(t, adminapi.TokenRequest{Baseline: true, Name: "ci"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Through the admin API, at the default TTL.
	for _, r := range []struct {
		tok string
		in  registry.Instance
	}{
		{baseTok, registry.Instance{Service: "web", ID: "web-base", Addr: newBackend(t, "web-base").addr}},
		{aliceTok, registry.Instance{Service: "web", ID: "web-alice", Addr: newBackend(t, "web-alice").addr, Lane: "alice"}},
	} {
		reg := adminclient.NewRegistry(u.client(t, r.tok), adminclient.WithLogger(quiet))
		t.Cleanup(func() { reg.Close() })
		l, err := reg.Register(ctx, r.in, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	// Straight into etcd, at the default TTL.
	st, err := etcdstore.Open(ctx, u.etcdConfig(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, in := range []registry.Instance{
		{Service: "direct", ID: "direct-base", Addr: newBackend(t, "direct-base").addr},
		{Service: "direct", ID: "direct-alice", Addr: newBackend(t, "direct-alice").addr, Lane: "alice"},
	} {
		l, err := st.Register(ctx, in, registry.DefaultTTL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	keys := []string{"web/web-base", "web/web-alice", "direct/direct-base", "direct/direct-alice"}

	// A watch of its own on etcd (in this process, not suspended) tells
	// when each instance is registered again.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := st.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	regs := &registrations{deleted: map[string]time.Time{}, put: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		regs.follow(watchCtx, w)
	}()
	defer func() { stopWatch(); w.Close(); <-watched }()

	// Engines in this process (which is not suspended), as services have:
	// one on etcd (st), one on the admin API with a registration of its
	// own, as a service that joins with a token. Each picks an instance
	// of each target every 20ms.
	admin := adminclient.NewRegistry(u.client(t, baseTok), adminclient.WithLogger(quiet))
	t.Cleanup(func() { admin.Close() })
	side, err := admin.Register(ctx, registry.Instance{Service: "side", ID: "side-1", Addr: newBackend(t, "side-1").addr}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { side.Close() })
	var pickers []*picktest.Picker
	for _, r := range []struct {
		name string
		reg  registry.Registry
	}{{"etcd", st}, {"admin API", admin}} {
		e := routing.New(routing.WithRegistry(r.reg), routing.WithLogger(quiet))
		t.Cleanup(func() { e.Close() })
		for _, svc := range []string{"web", "direct"} {
			pickers = append(pickers,
				&picktest.Picker{Name: r.name + " engine: " + svc + " lane", Service: e.Service(svc), Lane: "alice", Want: svc + "-alice", Every: 20 * time.Millisecond},
				&picktest.Picker{Name: r.name + " engine: " + svc + " baseline", Service: e.Service(svc), Want: svc + "-base", Every: 20 * time.Millisecond})
		}
	}
	for _, p := range pickers {
		eventually(t, p.Name+" sees its instance", func() string {
			if r, err := p.Service.Pick(routing.Request{Lane: p.Lane}); err != nil || r.Instance.ID != p.Want {
				return fmt.Sprintf("picked %v, %v", r.Instance, err)
			}
			return ""
		})
	}

	// Four senders per target, a request every 80ms each, 20ms apart: a
	// request every 20ms per target.
	gw := u.gateway
	var senders []*stallSender
	for i := range 4 {
		senders = append(senders,
			&stallSender{name: fmt.Sprintf("web lane %d", i), url: gw + "/", edit: header("x-lane", "alice"), want: "web-alice"},
			&stallSender{name: fmt.Sprintf("web baseline %d", i), url: gw + "/", want: "web-base"},
			&stallSender{name: fmt.Sprintf("direct lane %d", i), url: gw + "/direct", edit: header("x-lane", "alice"), want: "direct-alice"},
			&stallSender{name: fmt.Sprintf("direct baseline %d", i), url: gw + "/direct", want: "direct-base"},
		)
	}
	// The client waits out the pause: a request sent to the suspended
	// gateway is answered after the resume.
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: pause + 30*time.Second}
	for _, s := range senders[:4] {
		expectBackend(t, c, s.url, s.want, s.edit)
	}
	sendCtx, stopSending := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepCtx(sendCtx, time.Duration(i/4)*20*time.Millisecond) {
				return
			}
			s.run(sendCtx, c)
		}()
	}
	for _, p := range pickers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Run(sendCtx)
		}()
	}
	defer func() { stopSending(); wg.Wait() }()
	// Traffic flows before the pause.
	eventually(t, "traffic before the pause", func() string {
		for _, s := range senders {
			if _, _, ok := s.counts(); ok < 5 {
				return s.name + " has not had 5 answers yet"
			}
		}
		return ""
	})

	if err := u.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause) // the scenario: a pause of this length
	if err := u.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()

	// etcd expires every lease on the resume (the pause is the TTL or
	// more): every instance is deleted and registered again. Then every
	// sender answers 10 times in a row.
	var last time.Time
	eventually(t, "every instance registered again", func() string {
		var missing []string
		if missing, last = regs.back(keys); len(missing) > 0 {
			return fmt.Sprintf("not deleted and registered again: %v", missing)
		}
		return ""
	})
	from := make([]int, len(senders))
	for i, s := range senders {
		from[i], _, _ = s.counts()
	}
	picked := make([]int, len(pickers))
	for i, p := range pickers {
		picked[i], _, _ = p.Counts()
	}
	eventually(t, "traffic after the registrations", func() string {
		for i, s := range senders {
			if sent, _, ok := s.counts(); sent < from[i]+10 || ok < 10 {
				return s.name + " has not had 10 answers in a row since"
			}
		}
		for i, p := range pickers {
			if n, _, _ := p.Counts(); n < picked[i]+10 {
				return p.Name + " has not picked 10 times since"
			}
		}
		return ""
	})
	stopSending()
	wg.Wait()
	total := 0
	for i := range 4 { // by target
		var sent, failed, wrong int
		var first []string
		for _, s := range senders[i:] {
			if s.url != senders[i].url || s.want != senders[i].want {
				continue
			}
			n, f, _ := s.counts()
			sent, failed, wrong = sent+n, failed+f, wrong+s.wrong
			first = append(first, s.failed...)
		}
		total += failed
		name, _, _ := strings.Cut(senders[i].name, " 0")
		t.Logf("pause %s: %s: %d of %d requests failed (%d answered by a fallback) %v", pause, name, failed, sent, wrong, first[:min(len(first), 3)])
	}
	for _, p := range pickers {
		n, failed, fallback := p.Counts()
		total += len(failed)
		t.Logf("pause %s: %s: %d of %d picks failed (%d by a fallback) %v", pause, p.Name, len(failed), n, fallback, failed[:min(len(failed), 3)])
	}
	t.Logf("pause %s: every instance registered again %.2fs after the resume", pause, last.Sub(resumed).Seconds())
	if total > 0 {
		t.Errorf("pause %s: %d requests and picks failed across the pause, want 0", pause, total)
	}
}
