package process

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
)

// notifyDaemonEnv makes the test binary a daemon written for systemd:
// READY=1 once the file named by the variable's value + ".ready" exists,
// then WATCHDOG=1 every half WATCHDOG_USEC until the file + ".hang"
// exists; once the file + ".stopping" exists it says STOPPING=1, once,
// and pings no more.
const notifyDaemonEnv = "PROCESS_TEST_NOTIFY_DAEMON"

func notifyDaemon(base string) int {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return 3
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return 4
	}
	usec, _ := strconv.Atoi(os.Getenv("WATCHDOG_USEC"))
	half := time.Duration(usec) * time.Microsecond / 2
	exists := func(suffix string) bool { _, err := os.Stat(base + suffix); return err == nil }
	for !exists(".ready") {
		time.Sleep(10 * time.Millisecond)
	}
	_, _ = c.Write([]byte("STATUS=serving\nREADY=1"))
	stopping := false
	for {
		time.Sleep(half)
		switch {
		case stopping:
		case exists(".stopping"):
			stopping = true
			_, _ = c.Write([]byte("STATUS=draining\nSTOPPING=1"))
		case !exists(".hang"):
			_, _ = c.Write([]byte("WATCHDOG=1"))
		}
	}
}

// healthSeen follows a module's health and records every value in order.
type healthSeen struct {
	t    *testing.T
	r    *Runtime
	name string
	seen []events.Health
}

// until waits for health h, recording what came before.
func (w *healthSeen) until(h events.Health) {
	w.t.Helper()
	waitFor(w.t, w.r, "health "+string(h), func() bool {
		now := status(w.t, w.r, w.name).Health
		// "" only before the checker's first word, just after a start.
		if now != "" && (len(w.seen) == 0 || w.seen[len(w.seen)-1] != now) {
			w.seen = append(w.seen, now)
		}
		return now == h
	})
}

// A module that becomes healthy a moment after it starts, with a 30 s
// grace, is healthy as soon as its check passes, not at the grace's end,
// and never unhealthy on the way; each kind of check.
func TestHealthyAsSoonAsTheCheckPasses(t *testing.T) {
	for _, kind := range []string{"exec", "http", "https", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, Backoff{})
			dir := t.TempDir()
			openUp(t, dir)
			h := &bundle.Health{Interval: "100ms", Timeout: "1s", Grace: "30s"}
			var flip func()
			switch kind {
			case "exec":
				flag := filepath.Join(dir, "ready")
				h.Exec = []string{"/bin/sh", "-c", "test -f " + flag}
				flip = func() {
					if err := os.WriteFile(flag, nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			case "http", "https": // https: a certificate no CA of the node signed
				var ready atomic.Bool
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					if !ready.Load() {
						w.WriteHeader(http.StatusServiceUnavailable)
					}
				}))
				if kind == "https" {
					srv.StartTLS()
				} else {
					srv.Start()
				}
				t.Cleanup(srv.Close)
				h.HTTP = srv.URL + "/healthz"
				flip = func() { ready.Store(true) }
			case "tcp":
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addr := l.Addr().String()
				_ = l.Close() // nothing listens until the flip
				h.TCP = addr
				flip = func() {
					l, err := net.Listen("tcp", addr)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = l.Close() })
				}
			}
			e.script("sha256:a", sleeper, bundle.Manifest{Health: h})
			r := e.open()
			if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
				t.Fatal(err)
			}
			w := &healthSeen{t: t, r: r, name: "web"}
			w.until(events.HealthStarting)
			flipped := time.Now()
			flip()
			w.until(events.Healthy)
			took := time.Since(flipped)
			t.Logf("%s check: ready → healthy %s (interval 100ms)", kind, took.Round(time.Millisecond))
			// A checker that waited out the grace would say healthy about
			// 30 s after the start: within the wait's deadline, so say it.
			if took > 10*time.Second {
				t.Errorf("healthy %s after its check could pass: the 30 s grace held it back", took.Round(time.Millisecond))
			}
			for _, s := range w.seen {
				if s == events.Unhealthy {
					t.Errorf("health went %v: unhealthy within the grace", w.seen)
				}
			}
			hv, _ := r.Running(ctx(t))
			if len(hv) != 1 || hv[0].Health != events.Healthy {
				t.Errorf("have: %+v, want health healthy", hv)
			}
		})
	}
}

// A module whose check never passes is unhealthy once the grace is over,
// not before, and, with restart, restarted through the crash backoff, starting again.
func TestNeverHealthyIsRestarted(t *testing.T) {
	e := newEnv(t, Backoff{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond})
	const grace = time.Second
	e.script("sha256:a", sleeper, bundle.Manifest{Health: &bundle.Health{
		Exec: []string{"/bin/false"}, Interval: "100ms", Grace: grace.String(), Failures: 2, Restart: true}})
	r := e.open()
	applied := time.Now() // before the start, so before the grace began
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	first := status(t, r, "web").PID
	w := &healthSeen{t: t, r: r, name: "web"}
	w.until(events.Unhealthy)
	if took := time.Since(applied); took < grace {
		t.Errorf("unhealthy %s after the apply, within its %s grace", took.Round(time.Millisecond), grace)
	}
	waitFor(t, r, "a restart", func() bool {
		st := status(t, r, "web")
		return st.Restarts >= 1 && st.State == events.Running && st.PID != first
	})
	if st := status(t, r, "web"); st.Exit != "unhealthy" {
		t.Errorf("exit %q, want unhealthy", st.Exit)
	}
	w.until(events.HealthStarting)
	if len(w.seen) < 3 || w.seen[0] != events.HealthStarting {
		t.Errorf("health went %v, want starting, unhealthy, starting", w.seen)
	}
	if alive(first, 0) {
		t.Errorf("the unhealthy process %d still runs", first)
	}
}

// Without restart an unhealthy module is left running, reported
// unhealthy.
func TestUnhealthyWithoutRestartKeepsRunning(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{Health: &bundle.Health{
		TCP: "127.0.0.1:1", Interval: "100ms", Timeout: "100ms", Failures: 1}})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	pid := status(t, r, "web").PID
	w := &healthSeen{t: t, r: r, name: "web"}
	w.until(events.Unhealthy)
	if st := status(t, r, "web"); st.State != events.Running || st.PID != pid || st.Restarts != 0 {
		t.Errorf("status %+v, want the same process running", st)
	}
}

// A daemon written for systemd: healthy on READY=1, unhealthy when its
// watchdog lapses.
func TestNotifyReadyAndWatchdog(t *testing.T) {
	e := newEnv(t, Backoff{})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(t.TempDir(), "daemon")
	openUp(t, filepath.Dir(base))
	dir := filepath.Join(filepath.Dir(e.cfg.Root), "bundles", "n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := bundle.Manifest{Command: []string{exe}, Env: map[string]string{notifyDaemonEnv: base},
		// The grace covers the daemon's start (the test binary, under
		// load); the lapse after it is counted once the grace is over.
		Health: &bundle.Health{Notify: true, Interval: "200ms", Grace: "5s", Failures: 1}}
	e.fetch.bundles["sha256:n"] = fakeBundle{dir: dir, m: m}
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "sd", Build: "sha256:n", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	w := &healthSeen{t: t, r: r, name: "sd"}
	w.until(events.HealthStarting)
	ready := time.Now()
	if err := os.WriteFile(base+".ready", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w.until(events.Healthy)
	t.Logf("notify: READY=1 → healthy %s", time.Since(ready).Round(time.Millisecond))
	if err := os.WriteFile(base+".hang", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w.until(events.Unhealthy)
	if st := status(t, r, "sd"); st.State != events.Running {
		t.Errorf("state %s, want running (no restart declared)", st.State)
	}
	if want := []events.Health{events.HealthStarting, events.Healthy, events.Unhealthy}; len(w.seen) != 3 || w.seen[0] != want[0] || w.seen[1] != want[1] {
		t.Errorf("health went %v, want %v", w.seen, want)
	}
}

// A daemon that says STOPPING=1 is judged no more: its watchdog going
// quiet while it shuts down does not make it unhealthy (systemd stops a
// unit's watchdog when it leaves the running state).
func TestNotifyStoppingEndsTheWatchdog(t *testing.T) {
	e := newEnv(t, Backoff{})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(t.TempDir(), "daemon")
	openUp(t, filepath.Dir(base))
	if err := os.WriteFile(base+".ready", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(filepath.Dir(e.cfg.Root), "bundles", "n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Long enough that a loaded machine does not lapse the watchdog
	// before the daemon says STOPPING=1 (health then stays unhealthy).
	const interval = time.Second
	e.fetch.bundles["sha256:n"] = fakeBundle{dir: dir, m: bundle.Manifest{Command: []string{exe},
		Env:    map[string]string{notifyDaemonEnv: base},
		Health: &bundle.Health{Notify: true, Interval: interval.String(), Failures: 1}}}
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "sd", Build: "sha256:n", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	w := &healthSeen{t: t, r: r, name: "sd"}
	w.until(events.Healthy)
	if err := os.WriteFile(base+".stopping", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(e.cfg.StateDir, "process", "sd", logFile)
	waitfor.Until(t, deadline, "the shim's note of STOPPING=1", func() bool {
		page, err := readLog(logPath, node.LogQuery{})
		return err == nil && slices.Contains(page.Lines, "meshfold: the module says it is stopping (STOPPING=1)")
	})
	// Three watchdog intervals without a ping: each would be a failure
	// (failures: 1) had the daemon not said it is stopping.
	quiet := time.NewTimer(3 * interval)
	defer quiet.Stop()
	for waiting := true; waiting; {
		select {
		case <-r.Changes():
			if h := status(t, r, "sd").Health; h != events.Healthy {
				t.Fatalf("health %s after STOPPING=1, want it left healthy", h)
			}
		case <-quiet.C:
			waiting = false
		}
	}
	if h := status(t, r, "sd").Health; h != events.Healthy {
		t.Errorf("health %s after STOPPING=1 and three quiet intervals, want healthy", h)
	}
}

// A daemon that says READY=1 the moment it starts, before its run's
// checker is under way, is healthy: what a run says is never dropped as
// the previous run's.
func TestNotifyReadyAtOnce(t *testing.T) {
	e := newEnv(t, Backoff{})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(t.TempDir(), "daemon")
	openUp(t, filepath.Dir(base))
	if err := os.WriteFile(base+".ready", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(filepath.Dir(e.cfg.Root), "bundles", "n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.fetch.bundles["sha256:n"] = fakeBundle{dir: dir, m: bundle.Manifest{Command: []string{exe},
		Env: map[string]string{notifyDaemonEnv: base}, Health: &bundle.Health{Notify: true, Grace: "1h"}}}
	r := e.open()
	for i := range 3 {
		name := "sd" + strconv.Itoa(i)
		if err := r.Apply(ctx(t), events.PlanModule{Name: name, Build: "sha256:n", RunsAs: self}); err != nil {
			t.Fatal(err)
		}
		(&healthSeen{t: t, r: r, name: name}).until(events.Healthy)
	}
}

// Checks run in the shim: while no agent runs they go on, and the next
// runtime adopts the health the shim found meanwhile.
func TestHealthGoesOnWithoutTheAgent(t *testing.T) {
	e := newEnv(t, Backoff{})
	flag := filepath.Join(t.TempDir(), "ready")
	openUp(t, filepath.Dir(flag))
	e.script("sha256:a", sleeper, bundle.Manifest{Health: &bundle.Health{
		Exec: []string{"/bin/sh", "-c", "test -f " + flag}, Interval: "100ms", Grace: "1h"}})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	(&healthSeen{t: t, r: r1, name: "web"}).until(events.HealthStarting)
	if err := r1.Close(); err != nil { // the agent goes away
		t.Fatal(err)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// No runtime runs: the module's log (read from its file) shows the
	// shim found it healthy.
	logPath := filepath.Join(e.cfg.StateDir, "process", "web", logFile)
	waitfor.Until(t, deadline, "the shim's healthy note", func() bool {
		page, err := readLog(logPath, node.LogQuery{})
		return err == nil && slices.Contains(page.Lines, "meshfold: healthy (exec check)")
	})
	r2 := e.open()
	if st := status(t, r2, "web"); st.Health != events.Healthy || st.State != events.Running {
		t.Errorf("adopted status %+v, want running and healthy", st)
	}
}

// An exec check's own words go into the module's log with the note of
// its fall (fresh12: `meshfold logs` said only "unhealthy after 3 failed
// exec checks: exec: status 1", not the check's "ready marker absent"),
// on one line; a check whose output holds a declared file's content has
// it left out, said so, and the content is in no line of the log.
func TestCheckOutputInTheLogNeverAFilledFile(t *testing.T) {
	e := newEnv(t, Backoff{})
	const secret = "tok-9f8e7d6c5b4a"
	if err := os.WriteFile(filepath.Join(e.cfg.Root, "token"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.script("sha256:a", sleeper, bundle.Manifest{Health: &bundle.Health{
		Exec: []string{"/bin/sh", "-c", "echo checking; echo ready marker absent >&2; exit 1"}, Interval: "100ms", Failures: 2}})
	e.script("sha256:b", sleeper, bundle.Manifest{Health: &bundle.Health{
		Exec: []string{"/bin/sh", "-c", "echo token is $(cat " + filepath.Join(e.cfg.Root, "token") + ") >&2; exit 1"}, Interval: "100ms", Failures: 2}})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(ctx(t), events.PlanModule{Name: "leak", Build: "sha256:b", RunsAs: self,
		Files: []events.File{{Path: "/token", Mode: "0600"}}}); err != nil {
		t.Fatal(err)
	}
	waitLogFunc(t, r, "web", func(l string) bool {
		return strings.Contains(l, "unhealthy after 2 failed exec checks: exec: status 1; its output: checking / ready marker absent")
	})
	waitLogFunc(t, r, "leak", func(l string) bool {
		return strings.Contains(l, "unhealthy after 2 failed exec checks: exec: status 1; its output left out: it holds part of a file the module declares")
	})
	page, err := r.Logs(ctx(t), "leak", node.LogQuery{Tail: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range page.Lines {
		if strings.Contains(l, secret) || strings.Contains(l, secret[:8]) {
			t.Errorf("the declared file's content is in the log: %q", l)
		}
	}
}
