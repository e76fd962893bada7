package process

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
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
