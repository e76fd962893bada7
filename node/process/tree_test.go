package process

import (
	"bytes"
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
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/node/bundle"
)

// moduleProcs lists the live processes whose environment names module
// and this test's root: how an operator finds what a module left.
func moduleProcs(t *testing.T, root, module string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]byte{[]byte("MESHFOLD_MODULE=" + module), []byte("MESHFOLD_ROOT=" + root)}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		vars := bytes.Split(env, []byte{0})
		if slices.ContainsFunc(vars, func(v []byte) bool { return bytes.Equal(v, want[0]) }) &&
			slices.ContainsFunc(vars, func(v []byte) bool { return bytes.Equal(v, want[1]) }) {
			if _, err := startTime(pid); err == nil { // not a zombie
				out = append(out, pid)
			}
		}
	}
	return out
}

// zombiesOf lists the zombie children of pid.
func zombiesOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(data[i+1:])
		if len(f) > 1 && f[0][0] == 'Z' && string(f[1]) == strconv.Itoa(pid) {
			n, _ := strconv.Atoi(e.Name())
			out = append(out, n)
		}
	}
	return out
}

// marks reads the lines the test's processes appended to file.
func marks(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

// handler is a shell fragment: a process that, on TERM, writes
// "<name>-term", takes 200 ms to clean up, writes "<name>-done" and exits;
// it writes "<name>-up" once its trap is set.
func handler(mark, name string) string {
	return fmt.Sprintf(`sh -c 'trap "echo %[2]s-term >> %[1]s; sleep 0.2; echo %[2]s-done >> %[1]s; exit 0" TERM; echo %[2]s-up >> %[1]s; while :; do sleep 0.05; done'`, mark, name)
}

// A daemon that leaves its module's session by a double fork (setsid)
// is still the module's: removal stops it, with TERM first.
func TestRemoveStopsDaemonizedChild(t *testing.T) {
	e := newEnv(t, Backoff{})
	mark := filepath.Join(t.TempDir(), "marks")
	openUp(t, filepath.Dir(mark))
	e.script("sha256:a", `( setsid `+handler(mark, "daemon")+` & ) ; exec sleep 3600`, bundle.Manifest{StopTimeout: "5s"})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "forker", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, deadline, "the daemon up", func() bool { return slices.Contains(marks(t, mark), "daemon-up") })
	if n := len(moduleProcs(t, e.cfg.Root, "forker")); n < 2 {
		t.Fatalf("%d processes of the module, want the main one and the daemon's", n)
	}
	began := time.Now()
	if err := r.Remove(ctx(t), "forker"); err != nil {
		t.Fatal(err)
	}
	t.Logf("removal → last process gone: %s", time.Since(began).Round(time.Millisecond))
	if left := moduleProcs(t, e.cfg.Root, "forker"); len(left) > 0 {
		t.Errorf("processes of the module left after removal: %v", left)
	}
	if got := marks(t, mark); !slices.Equal(got, []string{"daemon-up", "daemon-term", "daemon-done"}) {
		t.Errorf("the daemon's marks %v: its TERM handler did not run to its end", got)
	}
}

// A module whose main process exits leaving a daemon behind: the daemon is
// stopped (TERM, its handler runs) before the exit is reported, so a
// restart never meets the old run's daemon.
func TestExitStopsWhatMainLeft(t *testing.T) {
	e := newEnv(t, Backoff{Initial: time.Hour})
	mark := filepath.Join(t.TempDir(), "marks")
	openUp(t, filepath.Dir(mark))
	e.script("sha256:a", `( setsid `+handler(mark, "daemon")+` & ) ; while ! grep -q daemon-up `+mark+` 2>/dev/null; do sleep 0.01; done; exit 0`,
		bundle.Manifest{StopTimeout: "5s"})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "forker", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "the module failed", func() bool { return status(t, r, "forker").State == events.Failed })
	if got := marks(t, mark); !slices.Equal(got, []string{"daemon-up", "daemon-term", "daemon-done"}) {
		t.Errorf("the daemon's marks %v when the exit was reported", got)
	}
	if left := moduleProcs(t, e.cfg.Root, "forker"); len(left) > 0 {
		t.Errorf("processes of the module left after its exit: %v", left)
	}
}

// A shell script that starts children without exec and exits on TERM at
// once: each child still gets TERM and its handler runs to its end within
// the stop timeout, before any SIGKILL (the process group is no longer
// killed as soon as the main process exits).
func TestStopLetsChildrenHandleTERM(t *testing.T) {
	e := newEnv(t, Backoff{})
	mark := filepath.Join(t.TempDir(), "marks")
	openUp(t, filepath.Dir(mark))
	e.script("sha256:a", handler(mark, "c1")+` &
`+handler(mark, "c2")+` &
wait`, bundle.Manifest{StopTimeout: "5s"})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "sh", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, deadline, "both children up", func() bool {
		m := marks(t, mark)
		return slices.Contains(m, "c1-up") && slices.Contains(m, "c2-up")
	})
	if err := r.Remove(ctx(t), "sh"); err != nil {
		t.Fatal(err)
	}
	got := marks(t, mark)
	for _, c := range []string{"c1", "c2"} {
		if !slices.Contains(got, c+"-term") || !slices.Contains(got, c+"-done") {
			t.Errorf("child %s: marks %v, want its TERM handler run to its end", c, got)
		}
	}
	if left := moduleProcs(t, e.cfg.Root, "sh"); len(left) > 0 {
		t.Errorf("processes left after removal: %v", left)
	}
}

// A module that forks 1,000 short children, each orphaned at once (a
// double fork): the shim, their subreaper, reaps them all; removal leaves
// nothing.
func TestThousandOrphansReaped(t *testing.T) {
	e := newEnv(t, Backoff{})
	mark := filepath.Join(t.TempDir(), "marks")
	openUp(t, filepath.Dir(mark))
	e.script("sha256:a", `i=0; while [ $i -lt 1000 ]; do ( /bin/true & ); i=$((i+1)); done; echo forked >> `+mark+`; exec sleep 3600`,
		bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "many", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	// The forks' pace is the machine's: 1,000 fork+execs took more than
	// 30 s with two race-detector suites beside them (a landing CI); what
	// the test asserts is the reaping, not the pace.
	waitfor.Until(t, 4*deadline, "the 1,000 forks", func() bool { return slices.Contains(marks(t, mark), "forked") })
	shim := status(t, r, "many").ShimPID
	waitfor.Until(t, deadline, "no zombie below the shim", func() bool { return len(zombiesOf(shim)) == 0 })
	if err := r.Remove(ctx(t), "many"); err != nil {
		t.Fatal(err)
	}
	if left := moduleProcs(t, e.cfg.Root, "many"); len(left) > 0 {
		t.Errorf("processes left after removal: %v", left)
	}
}

// An adoption record whose pid now belongs to an unrelated process (a
// recycled pid, or one from another boot) is neither adopted nor
// signalled.
func TestAdoptionRecordOfAnUnrelatedProcess(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   func(pid int, start uint64) identity
	}{
		{"other start time", func(pid int, start uint64) identity { return identity{PID: pid, Start: start + 1, Boot: bootID()} }},
		{"other boot", func(pid int, start uint64) identity {
			return identity{PID: pid, Start: start, Boot: "00000000-0000-0000-0000-000000000000"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Backoff{})
			// The unrelated process: records every signal it gets.
			mark := filepath.Join(t.TempDir(), "signals")
			cmd := exec.Command("sh", "-c", `for s in TERM INT HUP USR1 USR2 QUIT; do trap "echo $s >> `+mark+`" $s; done; while :; do sleep 0.05; done`)
			if err := testproc.StartChild(cmd); err != nil { // dies with the test
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
			pid := cmd.Process.Pid
			start, err := startTime(pid)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(e.cfg.StateDir, "process", "web")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for name, v := range map[string]any{
				specFile:   spec{Module: "web", Build: "sha256:a", Dir: t.TempDir(), Argv: []string{"x"}},
				shimFile:   tc.id(pid, start),
				moduleFile: tc.id(pid, start),
			} {
				if err := writeJSON(dir, name, v); err != nil {
					t.Fatal(err)
				}
			}
			r := e.open()
			hv, err := r.Running(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(hv) != 1 || hv[0].State != events.Stopped {
				t.Errorf("have: %+v, want web stopped (not adopted)", hv)
			}
			if !alive(pid, start) {
				t.Fatal("the unrelated process was killed")
			}
			if got := marks(t, mark); len(got) > 0 {
				t.Errorf("the unrelated process got signals: %v", got)
			}
		})
	}
}

// A module runs with exactly its account's groups: its primary group and
// the supplementary ones of the user database, nothing of the shim's.
func TestSupplementaryGroupsAreTheAccounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a module as another user needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	ids, err := u.GroupIds()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: "nobody"}); err != nil {
		t.Fatal(err)
	}
	got := procField(t, status(t, r, "web").PID, "Groups:")
	slices.Sort(got)
	slices.Sort(ids)
	if !slices.Equal(got, ids) {
		t.Errorf("module's groups %v, want the account's %v", got, ids)
	}
}

// A module over its memory limit is killed by the kernel and says so:
// exit "oom".
func TestMemoryLimitKillsAndReportsOOM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	if err := probeCgroups(DefaultCgroupParent); err != nil {
		t.Skipf("this machine offers no cgroup with a memory controller: %v", err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		if data, _ := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); !strings.Contains(string(data), "memory") {
			t.Skip("this machine has no memory controller")
		}
	}
	e := newEnv(t, Backoff{Initial: time.Hour})
	// 200 MB held in the shell's memory, over a 32 MiB limit.
	e.script("sha256:a", `x=$(head -c 200000000 /dev/zero | tr '\0' x); echo survived ${#x}`,
		bundle.Manifest{Limits: &bundle.Limits{Memory: 32 << 20}})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "hog", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "the module failed", func() bool { return status(t, r, "hog").State == events.Failed })
	if st := status(t, r, "hog"); st.Exit != "oom" {
		t.Errorf("exit %q, want oom", st.Exit)
	}
	hv, _ := r.Running(ctx(t))
	if len(hv) != 1 || hv[0].Exit != "oom" {
		t.Errorf("have: %+v, want exit oom", hv)
	}
}

// Without cgroups (as where none can be made) the tree is the shim's
// descendants: removal still leaves no daemon. An agent that cannot make
// a cgroup says so once, at start.
func TestNoCgroupFallbackStopsDaemon(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		says bool
	}{
		{"configured off", func(c *Config) { c.NoCgroups = true }, false},
		// A parent that is a file of the hierarchy: no cgroup can be made.
		{"none can be made", func(c *Config) { c.CgroupParent = "cgroup.procs" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Backoff{})
			tc.set(&e.cfg)
			var logs syncBuf
			e.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			mark := filepath.Join(t.TempDir(), "marks")
			openUp(t, filepath.Dir(mark))
			e.script("sha256:a", `( setsid `+handler(mark, "daemon")+` & ) ; exec sleep 3600`, bundle.Manifest{StopTimeout: "5s"})
			r := e.open()
			for _, name := range []string{"other", "forker"} {
				if err := r.Apply(ctx(t), events.PlanModule{Name: name, Build: "sha256:a", RunsAs: self}); err != nil {
					t.Fatal(err)
				}
			}
			if n := strings.Count(logs.String(), "no cgroup can be made"); (n == 1) != tc.says || n > 1 {
				t.Errorf("the log says %d times that no cgroup can be made:\n%s", n, logs.String())
			}
			waitfor.Until(t, deadline, "both daemons up", func() bool { return strings.Count(strings.Join(marks(t, mark), " "), "daemon-up") == 2 })
			c, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			if err := r.Remove(c, "forker"); err != nil {
				t.Fatal(err)
			}
			if left := moduleProcs(t, e.cfg.Root, "forker"); len(left) > 0 {
				t.Errorf("processes left after removal: %v", left)
			}
			if got := marks(t, mark); !slices.Contains(got, "daemon-done") {
				t.Errorf("the daemon's marks %v: its TERM handler did not run", got)
			}
			if len(moduleProcs(t, e.cfg.Root, "other")) < 2 {
				t.Errorf("the other module's tree did not survive the removal")
			}
		})
	}
}

// Without a cgroup, a module whose shim is killed loses its subreaper:
// its daemon, out of its process group, is found by its environment and
// killed before the new shim starts the module again.
func TestLostShimDaemonKilledWithoutCgroup(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.cfg.NoCgroups = true
	mark := filepath.Join(t.TempDir(), "marks")
	openUp(t, filepath.Dir(mark))
	e.script("sha256:a", `( setsid `+handler(mark, "daemon")+` & ) ; exec sleep 3600`, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "forker", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, deadline, "the daemon up", func() bool { return slices.Contains(marks(t, mark), "daemon-up") })
	st := status(t, r, "forker")
	type member struct {
		pid   int
		start uint64
	}
	var old []member
	for _, pid := range moduleProcs(t, e.cfg.Root, "forker") {
		if start, err := startTime(pid); err == nil {
			old = append(old, member{pid, start})
		}
	}
	if len(old) < 2 {
		t.Fatalf("%d processes of the module, want its main one and its daemon", len(old))
	}
	if err := syscall.Kill(st.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "a new shim", func() bool {
		now := status(t, r, "forker")
		return now.State == events.Running && now.ShimPID != st.ShimPID
	})
	for _, m := range old {
		if alive(m.pid, m.start) {
			t.Errorf("process %d of the lost shim's module still runs", m.pid)
		}
	}
}
