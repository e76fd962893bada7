package process

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
)

// BenchmarkShimMemory prints issue 27's supervision figures: 100 modules
// of `sleep` running as nobody, each under its own shim, as in
// production: the shim is meshfold-shim, built here as make build builds
// it, or the program MESHFOLD_SHIM_BIN names (a binary named meshfold runs
// as `meshfold shim DIR`, the shim of earlier builds). It prints the PSS and RSS
// of every shim (min, median, max and mean, from /proc/PID/smaps_rollup)
// and the RSS and PSS of this process, the agent side, before and with
// the modules. MESHFOLD_SHIM_MODULES changes the count. It runs as root
// (modules run as another account) and ends every process it started.
func BenchmarkShimMemory(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("runs modules as nobody: needs root")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		b.Skip("no user nobody")
	}
	n := 100
	if v := os.Getenv("MESHFOLD_SHIM_MODULES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("MESHFOLD_SHIM_MODULES=%q", v)
		}
	}
	base := b.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	bin := os.Getenv("MESHFOLD_SHIM_BIN")
	if bin == "" {
		// The shim the agent starts: meshfold-shim, built static as make
		// build and make dist build it.
		bin = filepath.Join(base, "meshfold-shim")
		build := exec.Command("go", "build", "-o", bin, "../../cmd/meshfold-shim")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("build meshfold-shim: %v\n%s", err, out)
		}
	}
	shimCmd := []string{bin}
	if filepath.Base(bin) == "meshfold" {
		shimCmd = append(shimCmd, "shim") // an earlier build's shim: `meshfold shim DIR`
	}
	dir := filepath.Join(base, "bundle")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	m := bundle.Manifest{Command: []string{"run.sh"}}
	if err := m.Validate(); err != nil {
		b.Fatal(err)
	}
	fetch := &fakeFetcher{bundles: map[string]fakeBundle{"sha256:s": {dir: dir, m: m}}}
	root := filepath.Join(base, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	r, err := Open(Config{Node: "ace", Root: root, StateDir: filepath.Join(base, "state"), Fetcher: fetch,
		Shim: shimCmd, Backoff: Backoff{Initial: time.Hour, Max: time.Hour},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	// Every process started here ends: the runtime stops each module and
	// its shim; any left (a stop that failed) is killed by pid, the
	// shim's whole session first, only while the pid is still the
	// process we started (same start time).
	var started []identity
	b.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		r.StopAll(c)
		_ = r.Close()
		for _, id := range started {
			if s, err := startTime(id.PID); err == nil && s == id.Start {
				_ = syscall.Kill(-id.PID, syscall.SIGKILL)
				_ = syscall.Kill(id.PID, syscall.SIGKILL)
			}
		}
	})
	agentRSS0, agentPSS0 := rollup(b, os.Getpid())
	for i := range n {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := r.Apply(c, events.PlanModule{Name: "m" + strconv.Itoa(i), Build: "sha256:s", RunsAs: "nobody"})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		st, ok := r.Status("m" + strconv.Itoa(i))
		if !ok || st.State != events.Running {
			b.Fatalf("module m%d: %+v", i, st)
		}
		started = append(started, identity{PID: st.ShimPID, Start: st.ShimStart})
		if s, err := startTime(st.PID); err == nil {
			started = append(started, identity{PID: st.PID, Start: s})
		}
	}
	var rss, pss []int
	for i := range n {
		st, _ := r.Status("m" + strconv.Itoa(i))
		kr, kp := rollup(b, st.ShimPID)
		rss, pss = append(rss, kr), append(pss, kp)
	}
	agentRSS, agentPSS := rollup(b, os.Getpid())
	b.Logf("shim %s, %d modules of sleep as nobody", filepath.Base(bin), n)
	b.Logf("shim PSS per module: %s", spread(pss))
	b.Logf("shim RSS per module: %s", spread(rss))
	st, _ := r.Status("m0")
	b.Logf("where one shim's PSS is (m0, pid %d): %s", st.ShimPID, pssByMapping(b, st.ShimPID))
	b.Logf("agent (this process): RSS %d kB, PSS %d kB with %d modules; RSS %d kB, PSS %d kB before", agentRSS, agentPSS, n, agentRSS0, agentPSS0)
	b.ReportMetric(float64(mean(pss)), "shim-PSS-kB/module")
	b.ReportMetric(float64(mean(rss)), "shim-RSS-kB/module")
	b.ReportMetric(float64(agentRSS), "agent-RSS-kB")
}

// rollup returns process pid's Rss and Pss in kB.
func rollup(b *testing.B, pid int) (rss, pss int) {
	b.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		b.Fatal(err)
	}
	return parseRollup(string(data))
}

// pssByMapping says where process pid's PSS is, from /proc/PID/smaps:
// the binary's text and read-only data (shared by every process of the
// binary), its writable data (data and bss, private once written),
// anonymous memory (the heap, stacks and the runtime's own structures)
// and the rest (a C library where one is linked, vdso, the main thread's
// stack), in kB.
func pssByMapping(b *testing.B, pid int) string {
	b.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		b.Fatal(err)
	}
	exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	var text, writable, anon, other, privDirty int
	kind := &other
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			switch {
			case len(f) >= 6 && f[5] == exe && strings.Contains(f[1], "w"):
				kind = &writable
			case len(f) >= 6 && f[5] == exe:
				kind = &text
			case len(f) == 5 || f[5] == "[heap]":
				kind = &anon
			default:
				kind = &other
			}
			continue
		}
		if len(f) >= 2 && (f[0] == "Pss:" || f[0] == "Private_Dirty:") {
			v, _ := strconv.Atoi(f[1])
			if f[0] == "Pss:" {
				*kind += v
			} else {
				privDirty += v
			}
		}
	}
	return fmt.Sprintf("the binary's text and read-only data %d kB, its writable data %d kB, anonymous %d kB, other %d kB; private dirty %d kB",
		text, writable, anon, other, privDirty)
}

func spread(kb []int) string {
	s := slices.Sorted(slices.Values(kb))
	return "min " + strconv.Itoa(s[0]) + " kB, median " + strconv.Itoa(s[len(s)/2]) + " kB, max " + strconv.Itoa(s[len(s)-1]) +
		" kB, mean " + strconv.Itoa(mean(kb)) + " kB"
}

func mean(kb []int) int {
	sum := 0
	for _, v := range kb {
		sum += v
	}
	return sum / len(kb)
}
