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
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/node/bundle"
)

// TestMeasure prints the figures docs/architecture.md quotes: the RSS of
// each shim with 20 modules, the time a new runtime takes to adopt them,
// and fill → running over 50 rounds. It asserts nothing about speed, so it
// runs only when MESHFOLD_MEASURE=1.
func TestMeasure(t *testing.T) {
	if os.Getenv("MESHFOLD_MEASURE") != "1" {
		t.Skip("set MESHFOLD_MEASURE=1 to measure")
	}
	e := newEnv(t, Backoff{Initial: time.Hour, Max: time.Hour})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	e.script("sha256:cred", needsCred, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		if err := r1.Apply(ctx(t), events.PlanModule{Name: "m" + strconv.Itoa(i), Build: "sha256:a", RunsAs: self}); err != nil {
			t.Fatal(err)
		}
	}
	var rss []int
	for i := range n {
		rss = append(rss, vmRSS(t, status(t, r1, "m"+strconv.Itoa(i)).ShimPID))
	}
	slices.Sort(rss)
	t.Logf("shim RSS with %d modules: min %d kB, median %d kB, max %d kB", n, rss[0], rss[n/2], rss[n-1])
	_ = r1.Close()
	var adopt []time.Duration
	for range 10 {
		began := time.Now()
		r, err := Open(e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The first use adopts.
		hv, _ := r.Running(ctx(t))
		adopt = append(adopt, time.Since(began))
		if len(hv) != n || hv[0].State != events.Running {
			t.Fatalf("adopted %d modules", len(hv))
		}
		_ = r.Close()
	}
	slices.Sort(adopt)
	t.Logf("adoption of %d modules by a new runtime: median %s, max %s (10 rounds)", n, adopt[5], adopt[9])

	r := e.open()
	cred := filepath.Join(e.cfg.Root, "cred")
	var fill []time.Duration
	for range 50 {
		_ = os.Remove(cred)
		if err := r.Apply(ctx(t), events.PlanModule{Name: "job", Build: "sha256:cred", RunsAs: self}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, r, "failed", func() bool { return status(t, r, "job").State == events.Failed })
		if err := os.WriteFile(cred, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		r.Filled(ctx(t), "job")
		waitFor(t, r, "running", func() bool { return status(t, r, "job").State == events.Running })
		fill = append(fill, time.Since(began))
		if err := r.Remove(ctx(t), "job"); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(fill)
	t.Logf("fill → running (runtime: wake to the shim's running status), 50 rounds: p50 %s, p99 %s", fill[25], fill[49])
	r.StopAll(ctx(t))
}

func vmRSS(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.Fields(v)[0])
			return kb
		}
	}
	return 0
}

// smapsRollup returns a process's Rss and Pss in kB (/proc/PID/smaps_rollup).
func smapsRollup(t *testing.T, pid int) (rss, pss int) {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		t.Fatal(err)
	}
	return parseRollup(string(data))
}

// parseRollup returns the Rss and Pss lines of a smaps_rollup, in kB.
func parseRollup(data string) (rss, pss int) {
	for _, l := range strings.Split(data, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "Rss:":
			rss, _ = strconv.Atoi(f[1])
		case "Pss:":
			pss, _ = strconv.Atoi(f[1])
		}
	}
	return rss, pss
}

// TestMeasureTree prints issue 22's figures: removal → last process of a
// daemonizing module gone, check start → healthy for each kind, and the
// shims' RSS and PSS with checks running. MESHFOLD_MEASURE_SHIM names a
// meshfold-shim binary to run as the shim, as in production (a binary
// named meshfold runs as `meshfold shim DIR`); by default the shim is this
// test binary.
func TestMeasureTree(t *testing.T) {
	if os.Getenv("MESHFOLD_MEASURE") != "1" {
		t.Skip("set MESHFOLD_MEASURE=1 to measure")
	}
	e := newEnv(t, Backoff{Initial: time.Hour, Max: time.Hour})
	if bin := os.Getenv("MESHFOLD_MEASURE_SHIM"); bin != "" {
		e.cfg.Shim, e.cfg.ShimEnv = []string{bin}, nil
		if filepath.Base(bin) == "meshfold" {
			e.cfg.Shim = append(e.cfg.Shim, "shim") // `meshfold shim DIR`
		}
	}
	mark := filepath.Join(t.TempDir(), "marks")
	openUp(t, filepath.Dir(mark))
	e.script("sha256:d", `( setsid `+handler(mark, "daemon")+` & ) ; exec sleep 3600`, bundle.Manifest{StopTimeout: "5s"})
	r := e.open()
	var removal []time.Duration
	for i := range 10 {
		_ = os.Remove(mark)
		if err := r.Apply(ctx(t), events.PlanModule{Name: "d", Build: "sha256:d", RunsAs: self}); err != nil {
			t.Fatal(err)
		}
		waitfor.Until(t, deadline, "the daemon up", func() bool { return slices.Contains(marks(t, mark), "daemon-up") })
		began := time.Now()
		if err := r.Remove(ctx(t), "d"); err != nil {
			t.Fatal(err)
		}
		waitfor.Until(t, deadline, "no process left", func() bool { return len(moduleProcs(t, e.cfg.Root, "d")) == 0 })
		removal = append(removal, time.Since(began))
		_ = i
	}
	slices.Sort(removal)
	t.Logf("removal → last process of a daemonizing module gone (its TERM handler takes 200 ms), 10 rounds: min %s, median %s, max %s",
		removal[0].Round(time.Millisecond), removal[5].Round(time.Millisecond), removal[9].Round(time.Millisecond))

	// Each kind of check against a target ready from the start.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	exe, _ := os.Executable()
	base := filepath.Join(t.TempDir(), "sd")
	openUp(t, filepath.Dir(base))
	if err := os.WriteFile(base+".ready", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checks := map[string]*bundle.Health{
		"exec":   {Exec: []string{"/bin/true"}, Interval: "1s"},
		"http":   {HTTP: srv.URL, Interval: "1s"},
		"tcp":    {TCP: l.Addr().String(), Interval: "1s"},
		"notify": {Notify: true, Interval: "1s"},
	}
	dir := filepath.Join(filepath.Dir(e.cfg.Root), "bundles", "n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"exec", "http", "tcp", "notify"} {
		var took []time.Duration
		for i := range 5 {
			name := kind + strconv.Itoa(i)
			if kind == "notify" {
				e.fetch.bundles["sha256:"+name] = fakeBundle{dir: dir, m: bundle.Manifest{Command: []string{exe},
					Env: map[string]string{notifyDaemonEnv: base}, Health: checks[kind]}}
			} else {
				e.script("sha256:"+name, sleeper, bundle.Manifest{Health: checks[kind]})
			}
			began := time.Now()
			if err := r.Apply(ctx(t), events.PlanModule{Name: name, Build: "sha256:" + name, RunsAs: self}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, r, name+" healthy", func() bool { return status(t, r, name).Health == events.Healthy })
			took = append(took, time.Since(began))
		}
		slices.Sort(took)
		t.Logf("%s check: apply → healthy (the target ready at once), 5 modules: min %s, median %s, max %s", kind,
			took[0].Round(time.Millisecond), took[2].Round(time.Millisecond), took[4].Round(time.Millisecond))
	}
	for i := range 5 { // shims without a check, to compare
		if err := r.Apply(ctx(t), events.PlanModule{Name: "none" + strconv.Itoa(i), Build: "sha256:d", RunsAs: self}); err != nil {
			t.Fatal(err)
		}
	}
	// The shims with their checks running (every second), a few rounds in.
	time.Sleep(3 * time.Second) // measuring: let each shim run several checks
	for _, kind := range []string{"none", "exec", "http", "tcp", "notify"} {
		var rs, ps []int
		for i := range 5 {
			rss, pss := smapsRollup(t, status(t, r, kind+strconv.Itoa(i)).ShimPID)
			rs, ps = append(rs, rss), append(ps, pss)
		}
		slices.Sort(rs)
		slices.Sort(ps)
		t.Logf("shim with a %s check: RSS %d–%d kB, PSS %d–%d kB (5 shims, 25 on the host)", kind, rs[0], rs[4], ps[0], ps[4])
	}
}
