package process

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
)

// shimEnv marks the test binary re-executed as a shim: TestMain then runs
// ShimMain instead of the tests. This is how the package's tests start
// real shims without the meshfold command.
const shimEnv = "MESHFOLD_PROCESS_TEST_SHIM"

func TestMain(m *testing.M) {
	if os.Getenv(shimEnv) == "1" {
		// A shim of a test ends with the test process (SIGTERM: it stops
		// its module first), so a test binary killed from outside leaves
		// neither behind; in production a shim outlives its agent.
		testproc.DieWithParent(syscall.SIGTERM)
		os.Exit(ShimMain(os.Args[len(os.Args)-1]))
	}
	if p := os.Getenv(fakeShimEnv); p != "" {
		os.Exit(fakeShim(p, os.Args[len(os.Args)-1]))
	}
	if os.Getenv(notifyDaemonEnv) != "" {
		os.Exit(notifyDaemon(os.Getenv(notifyDaemonEnv)))
	}
	testproc.MarkParent()
	// Under -race every process sleeps a second at exit (the race
	// runtime's atexit_sleep_ms), and the runtime waits for each shim it
	// stops to exit: the shims this binary starts skip that sleep.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

// fakeFetcher serves bundles the test wrote, by build.
type fakeFetcher struct {
	mu      sync.Mutex
	bundles map[string]fakeBundle
	pruned  [][]string
}

type fakeBundle struct {
	dir string
	m   bundle.Manifest
}

func (f *fakeFetcher) Fetch(_ context.Context, build string) (string, bundle.Manifest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.bundles[build]
	if !ok {
		return "", bundle.Manifest{}, fmt.Errorf("no bundle %s", build)
	}
	return b.dir, b.m, nil
}

func (f *fakeFetcher) Prune(_ context.Context, keep []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pruned = append(f.pruned, keep)
	return nil
}

// env is one test's runtime setup.
type env struct {
	t     *testing.T
	cfg   Config
	fetch *fakeFetcher
}

func newEnv(t *testing.T, b Backoff) *env {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	openUp(t, base)
	root := filepath.Join(base, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, fetch: &fakeFetcher{bundles: map[string]fakeBundle{}}}
	e.cfg = Config{Node: "ace", Root: root, StateDir: filepath.Join(base, "state"), Fetcher: e.fetch,
		Shim: []string{exe}, ShimEnv: []string{shimEnv + "=1"}, Backoff: b,
		Logger: slog.New(slog.NewTextHandler(tlog{t}, nil))}
	return e
}

// tlog writes log lines to the test's log.
type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// openUp makes dir and its parent searchable by every user, so a module
// running as nobody can reach a bundle under the test's temp dir.
func openUp(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// script adds a bundle whose command is the shell script body.
func (e *env) script(build, body string, m bundle.Manifest) {
	e.t.Helper()
	dir := filepath.Join(filepath.Dir(e.cfg.Root), "bundles", strings.ReplaceAll(build, ":", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		e.t.Fatal(err)
	}
	m.Command = []string{"run.sh"}
	if err := m.Validate(); err != nil {
		e.t.Fatal(err)
	}
	e.fetch.mu.Lock()
	e.fetch.bundles[build] = fakeBundle{dir: dir, m: m}
	e.fetch.mu.Unlock()
}

// open opens a runtime; cleanup stops every module it still holds.
func (e *env) open() *Runtime {
	e.t.Helper()
	r, err := Open(e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r.StopAll(ctx)
		_ = r.Close()
	})
	return r
}

const deadline = 30 * time.Second

// waitFor waits, on the runtime's change notifications, until cond
// holds.
func waitFor(t *testing.T, r *Runtime, what string, cond func() bool) {
	t.Helper()
	waitfor.UntilOn(t, deadline, what, r.Changes(), cond)
}

func status(t *testing.T, r *Runtime, name string) Status {
	t.Helper()
	st, ok := r.Status(name)
	if !ok {
		t.Fatalf("runtime holds no module %s", name)
	}
	return st
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return c
}

const sleeper = `echo "started as $(id -u) node=$MESHFOLD_NODE module=$MESHFOLD_MODULE"
exec sleep 3600`

// waitExec waits until process pid runs the program argv0 (its
// /proc/<pid>/cmdline starts with it), failing the test after 10 s.
func waitExec(t *testing.T, pid int, argv0 string) {
	t.Helper()
	var err error
	// Polling /proc: no event to wait on.
	waitfor.Value(t, 10*time.Second, fmt.Sprintf("module process %d to run %s", pid, argv0), func() (string, bool) {
		var cmd []byte
		if cmd, err = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err != nil {
			return "", true
		}
		first, _, _ := strings.Cut(string(cmd), "\x00")
		return fmt.Sprintf("%q", cmd), first == argv0
	})
	if err != nil {
		t.Fatalf("module process %d: %v", pid, err)
	}
}

// procField returns a line's fields of /proc/<pid>/status ("Uid:").
func procField(t *testing.T, pid int, key string) []string {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, key)
	return nil
}

func TestApplyStartsAsAccountInOwnGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a module as another user needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{Env: map[string]string{"COLOR": "blue"}})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: "nobody"}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r, "web")
	if st.State != events.Running || st.PID == 0 {
		t.Fatalf("status after apply: %+v", st)
	}
	if uid := procField(t, st.PID, "Uid:"); uid[0] != nobody.Uid || uid[1] != nobody.Uid {
		t.Errorf("module uid %v, want %s (nobody)", uid, nobody.Uid)
	}
	if gid := procField(t, st.PID, "Gid:"); gid[0] != nobody.Gid {
		t.Errorf("module gid %v, want %s", gid, nobody.Gid)
	}
	if pgid, _ := syscall.Getpgid(st.PID); pgid != st.PID {
		t.Errorf("module's process group %d, want its own (%d)", pgid, st.PID)
	}
	// The script ends in `exec sleep`: while that exec is under way
	// /proc/<pid>/environ reads empty, so read it once sleep runs.
	waitExec(t, st.PID, "sleep")
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.Split(string(environ), "\x00")
	for _, want := range []string{"MESHFOLD_NODE=ace", "MESHFOLD_MODULE=web", "MESHFOLD_ROOT=" + e.cfg.Root, "COLOR=blue"} {
		if !contains(vars, want) {
			t.Errorf("module environment %q lacks %s", vars, want)
		}
	}
	for _, v := range vars {
		if strings.HasPrefix(v, shimEnv) {
			t.Errorf("the shim's marker leaked into the module's environment: %s", v)
		}
	}
	hv, _ := r.Running(ctx(t))
	if len(hv) != 1 || hv[0].State != events.Running || hv[0].Account != "nobody" || hv[0].Build != "sha256:a" || hv[0].Since == nil {
		t.Errorf("have: %+v", hv)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestUnknownUserFailsApply(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r := e.open()
	err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: "no-such-user-meshfold"})
	// The failed settle's text, which audit's line cuts: the telling part
	// first, in an operator's words (it said "apply web: runs_as:
	// process: unknown user ...").
	if want := "no such user no-such-user-meshfold on this node (runs_as of module web)"; !errors.Is(err, ErrUnknownUser) || err == nil || err.Error() != want {
		t.Fatalf("apply as an unknown user: %v, want ErrUnknownUser saying %q", err, want)
	}
	if hv, _ := r.Running(ctx(t)); len(hv) != 0 {
		t.Errorf("a module whose apply failed is reported: %+v", hv)
	}
}

// self is the user the tests run as: the runs_as of modules that may run
// as the test's own user (root in CI, which then runs them as root because
// the row says so).
var self = func() string {
	u, err := user.Current()
	if err != nil {
		panic(err)
	}
	return u.Username
}()

func TestEmptyRunsAsRefusedWhenRoot(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r := e.open()
	r.asRoot = true // the refusal comes before anything that needs root
	err := r.Apply(ctx(t), events.PlanModule{Name: "who", Build: "sha256:a"})
	if !errors.Is(err, ErrNoRunsAs) || !strings.HasPrefix(err.Error(), "module who: ") || !strings.Contains(err.Error(), `unless the want says runs_as "root"`) {
		t.Fatalf("apply with no runs_as by a root agent: %v, want ErrNoRunsAs naming the module", err)
	}
	if hv, _ := r.Running(ctx(t)); len(hv) != 0 {
		t.Errorf("a module refused for its empty runs_as is reported: %+v", hv)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "process", "who")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a module refused for its empty runs_as has a shim directory: %v", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	// Root is allowed when the want says so.
	if err := r.Apply(ctx(t), events.PlanModule{Name: "who", Build: "sha256:a", RunsAs: "root"}); err != nil {
		t.Fatalf("apply with runs_as root: %v", err)
	}
	st := status(t, r, "who")
	if uid := procField(t, st.PID, "Uid:"); uid[0] != "0" {
		t.Errorf("module uid %v, want 0 (runs_as root)", uid)
	}
}

// syncBuf is a log sink tests read while the runtime writes.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An agent that is not root runs the module as itself: the have names that
// account, not the row's runs_as, and the log says so once per module.
func TestNotRootReportsOwnAccount(t *testing.T) {
	other := "daemon"
	if self == other {
		other = "nobody"
	}
	if _, err := user.Lookup(other); err != nil {
		t.Skipf("no user %s", other)
	}
	e := newEnv(t, Backoff{})
	var logs syncBuf
	e.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e.script("sha256:a", sleeper, bundle.Manifest{})
	e.script("sha256:b", sleeper, bundle.Manifest{})
	r := e.open()
	r.asRoot = false // what an agent that is not root does: run as itself
	for _, b := range []string{"sha256:a", "sha256:a", "sha256:b"} {
		if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: b, RunsAs: other}); err != nil {
			t.Fatal(err)
		}
	}
	st := status(t, r, "web")
	uid := procField(t, st.PID, "Uid:")
	if me, _ := user.Current(); uid[0] != me.Uid {
		t.Fatalf("module uid %v, want the agent's %s", uid, me.Uid)
	}
	hv, _ := r.Running(ctx(t))
	if len(hv) != 1 || hv[0].Account != self {
		t.Errorf("have %+v: want account %s (what the process runs as), not the row's %s", hv, self, other)
	}
	if got := r.RunningAs(other); got != self {
		t.Errorf("RunningAs(%s) = %s, want %s", other, got, self)
	}
	if n := strings.Count(logs.String(), "not as its runs_as"); n != 1 {
		t.Errorf("%d log lines say the module does not run as its runs_as, want 1:\n%s", n, logs.String())
	}
}

func TestFetchErrorFailsApply(t *testing.T) {
	e := newEnv(t, Backoff{})
	r := e.open()
	err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "img:nope", RunsAs: self})
	if err == nil || !strings.Contains(err.Error(), "no bundle img:nope") {
		t.Fatalf("apply of a build the fetcher lacks: %v", err)
	}
}

func TestCrashLoopBacksOffDoubling(t *testing.T) {
	e := newEnv(t, Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond})
	e.script("sha256:a", `echo "missing broker credential" >&2; exit 3`, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "job", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "five restarts", func() bool { return status(t, r, "job").Restarts >= 5 })
	st := status(t, r, "job")
	if st.Exit != "status 3" {
		t.Errorf("exit %q, want status 3", st.Exit)
	}
	page, err := r.Logs(ctx(t), "job", node.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var waits []string
	crashes := 0
	for _, l := range page.Lines {
		if l == "missing broker credential" {
			crashes++
		}
		if _, w, ok := strings.Cut(l, "next start in "); ok {
			waits = append(waits, w)
		}
	}
	want := []string{"10ms", "20ms", "40ms", "40ms"}
	if len(waits) < len(want) || !equal(waits[:len(want)], want) {
		t.Errorf("restart waits %v, want them to start %v (doubling to the cap)", waits, want)
	}
	if crashes < 5 {
		t.Errorf("the module's own stderr line appears %d times in its log, want at least 5", crashes)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// needsCred exits 1 until its credential exists, then runs.
const needsCred = `if [ ! -f "$MESHFOLD_ROOT/cred" ]; then echo "missing broker credential" >&2; exit 1; fi
echo "credential found"
trap 'echo reloaded' USR1
while :; do sleep 1; done`

func TestFillWakesModuleInBackoff(t *testing.T) {
	// A backoff of an hour: only the fill can bring the module back
	// within the test's deadline.
	e := newEnv(t, Backoff{Initial: time.Hour, Max: time.Hour})
	e.script("sha256:a", needsCred, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "job", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "the module to fail", func() bool { return status(t, r, "job").State == events.Failed })
	if err := os.WriteFile(filepath.Join(e.cfg.Root, "cred"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	r.Filled(ctx(t), "job")
	waitFor(t, r, "the module to run", func() bool {
		st := status(t, r, "job")
		return st.State == events.Running && st.Restarts == 1
	})
	t.Logf("fill → running: %s", time.Since(began))
	st := status(t, r, "job")
	if !alive(st.PID, st.PIDStart) {
		t.Fatalf("reported pid %d is not alive", st.PID)
	}
	waitLog(t, r, "job", "credential found")
}

// waitLog waits, following the module's log, until a line equals want.
func waitLog(t *testing.T, r *Runtime, module, want string) {
	t.Helper()
	followLog(t, r, module, fmt.Sprintf("%q", want), func(l string) bool { return l == want })
}

func TestFillGivesRunningModuleItsAction(t *testing.T) {
	e := newEnv(t, Backoff{})
	if err := os.WriteFile(filepath.Join(e.cfg.Root, "cred"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.script("sha256:sig", needsCred, bundle.Manifest{OnFill: "signal:SIGUSR1"})
	e.script("sha256:re", needsCred, bundle.Manifest{OnFill: "restart"})
	r := e.open()
	for _, m := range []events.PlanModule{{Name: "sig", Build: "sha256:sig", RunsAs: self}, {Name: "re", Build: "sha256:re", RunsAs: self}} {
		if err := r.Apply(ctx(t), m); err != nil {
			t.Fatal(err)
		}
		waitLog(t, r, m.Name, "credential found")
	}
	sigPID, rePID, reSince := status(t, r, "sig").PID, status(t, r, "re").PID, status(t, r, "re").Since
	r.Filled(ctx(t), "sig")
	waitLog(t, r, "sig", "reloaded")
	if st := status(t, r, "sig"); st.PID != sigPID || st.Restarts != 0 {
		t.Errorf("on_fill signal restarted the module: %+v", st)
	}
	r.Filled(ctx(t), "re")
	waitFor(t, r, "on_fill restart", func() bool {
		st := status(t, r, "re")
		return st.State == events.Running && st.PID != rePID
	})
	// An on_fill restart is counted apart from the crashes' restarts: a
	// rotated credential must not read as a crash loop (issue 26).
	if st := status(t, r, "re"); st.FillRestarts != 1 || st.Restarts != 0 {
		t.Errorf("after an on_fill restart: %d on_fill restarts and %d restarts, want 1 and 0", st.FillRestarts, st.Restarts)
	}
	// Its since is its new process's, not the state's first running.
	if st := status(t, r, "re"); !st.Since.After(reSince) {
		t.Errorf("after an on_fill restart: since %v, the same as before it (%v)", st.Since, reSince)
	}
}

func TestNewBuildReplacesOldProcess(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	e.script("sha256:b", sleeper, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	old := status(t, r, "web")
	// The same row again changes nothing.
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	if st := status(t, r, "web"); st.PID != old.PID {
		t.Fatalf("re-applying the same build restarted the module: pid %d → %d", old.PID, st.PID)
	}
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:b", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r, "web")
	if alive(old.PID, old.PIDStart) {
		t.Errorf("old build's process %d still runs", old.PID)
	}
	if st.PID == old.PID || st.Build != "sha256:b" || st.State != events.Running || !alive(st.PID, st.PIDStart) {
		t.Errorf("after the new build: %+v (old pid %d)", st, old.PID)
	}
	// The old shim is gone, and the new one answers on the module's
	// socket (the old one's exit must not take the socket with it).
	if alive(old.ShimPID, old.ShimStart) {
		t.Errorf("old shim %d still runs after the new build started", old.ShimPID)
	}
	if got, err := r.ask(ctx(t), r.mods["web"], opStatus); err != nil || got.ShimPID != st.ShimPID {
		t.Errorf("the module's socket after the new build: %+v, %v; want the new shim %d", got, err, st.ShimPID)
	}
	if err := r.Remove(ctx(t), "web"); err != nil {
		t.Fatal(err)
	}
	if alive(st.ShimPID, st.ShimStart) || alive(st.PID, st.PIDStart) {
		t.Errorf("after removal: shim alive %v, module alive %v", alive(st.ShimPID, st.ShimStart), alive(st.PID, st.PIDStart))
	}
	e.fetch.mu.Lock()
	last := e.fetch.pruned[len(e.fetch.pruned)-2]
	e.fetch.mu.Unlock()
	if !equal(last, []string{"sha256:b"}) {
		t.Errorf("prune kept %v, want only the new build", last)
	}
}

func TestRemoveStopsGroupAndForgets(t *testing.T) {
	e := newEnv(t, Backoff{})
	// Ignores SIGTERM, and has a child in its group: both must go.
	e.script("sha256:a", `trap '' TERM; sleep 3600 & echo child $!; while :; do sleep 1; done`,
		bundle.Manifest{StopTimeout: "100ms"})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "stubborn", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r, "stubborn")
	var child int
	waitLogFunc(t, r, "stubborn", func(l string) bool {
		n, ok := strings.CutPrefix(l, "child ")
		child, _ = strconv.Atoi(n)
		return ok
	})
	childStart, err := startTime(child)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Remove(ctx(t), "stubborn"); err != nil {
		t.Fatal(err)
	}
	if alive(st.PID, st.PIDStart) || alive(child, childStart) {
		t.Errorf("after removal: module alive %v, its child alive %v", alive(st.PID, st.PIDStart), alive(child, childStart))
	}
	if hv, _ := r.Running(ctx(t)); len(hv) != 0 {
		t.Errorf("removed module still reported: %+v", hv)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "process", "stubborn")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("module directory left after removal: %v", err)
	}
	if err := r.Remove(ctx(t), "stubborn"); err != nil {
		t.Errorf("removing a module that is gone: %v", err)
	}
}

func waitLogFunc(t *testing.T, r *Runtime, module string, match func(string) bool) {
	t.Helper()
	followLog(t, r, module, "the line", match)
}

// followLog follows the module's log (each read waits up to 1 s on the
// runtime's side for new lines) until a line matches.
func followLog(t *testing.T, r *Runtime, module, what string, match func(string) bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	cursor := ""
	for time.Now().Before(end) {
		page, err := r.Logs(ctx(t), module, node.LogQuery{Cursor: cursor, WaitMS: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range page.Lines {
			if match(l) {
				return
			}
		}
		cursor = page.Cursor
	}
	t.Fatalf("the log of %s never showed %s", module, what)
}

func TestNewRuntimeAdoptsRunningModules(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"one", "two"} {
		if err := r1.Apply(ctx(t), events.PlanModule{Name: n, Build: "sha256:a", RunsAs: self}); err != nil {
			t.Fatal(err)
		}
	}
	one, two := status(t, r1, "one"), status(t, r1, "two")
	// The agent goes away without stopping anything, as a kill -9 would.
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	r2 := e.open()
	t.Logf("adoption of 2 modules: %s", time.Since(began))
	for _, was := range []Status{one, two} {
		st := status(t, r2, was.Module)
		if st.State != events.Running || st.PID != was.PID || st.PIDStart != was.PIDStart || st.ShimPID != was.ShimPID {
			t.Errorf("adopted %s: %+v, want pid %d of shim %d running", was.Module, st, was.PID, was.ShimPID)
		}
	}
	// The adopted shim answers: a new build replaces the adopted process.
	e.script("sha256:b", sleeper, bundle.Manifest{})
	if err := r2.Apply(ctx(t), events.PlanModule{Name: "one", Build: "sha256:b", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	if alive(one.PID, one.PIDStart) {
		t.Errorf("adopted process %d survived its replacement", one.PID)
	}
}

func TestLostShimAtAdoption(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r1, "web")
	_ = r1.Close()
	// The shim dies hard; its module lives on, orphaned.
	if err := syscall.Kill(st.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, st.ShimPID, st.ShimStart)
	r2 := e.open()
	got := status(t, r2, "web")
	if got.State != events.Stopped {
		t.Errorf("module of a lost shim: %+v, want stopped", got)
	}
	if alive(st.PID, st.PIDStart) {
		t.Errorf("the orphaned module %d was not killed", st.PID)
	}
	// The agent applies it again: a new shim runs it.
	if err := r2.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	if now := status(t, r2, "web"); now.State != events.Running || now.PID == st.PID {
		t.Errorf("after re-apply: %+v", now)
	}
}

func TestShimKilledWhileAgentRuns(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r, "web")
	if err := syscall.Kill(st.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "a new shim", func() bool {
		now := status(t, r, "web")
		return now.State == events.Running && now.ShimPID != st.ShimPID
	})
	if alive(st.PID, st.PIDStart) {
		t.Errorf("the module of the killed shim (%d) still runs beside the new one", st.PID)
	}
	if now := status(t, r, "web"); now.Restarts != 1 {
		t.Errorf("restarts after a lost shim: %d, want 1", now.Restarts)
	}
}

// waitGone waits until pid (started at start) has exited.
func waitGone(t *testing.T, pid int, start uint64) {
	t.Helper()
	if alive(pid, start) && !waitExit(pid, deadline) {
		t.Fatalf("pid %d did not exit", pid)
	}
}

func TestStartTimeTellsRecycledPID(t *testing.T) {
	st, err := startTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("own start time: %d, %v", st, err)
	}
	if !alive(os.Getpid(), st) || alive(os.Getpid(), st+1) {
		t.Error("alive must hold for the recorded start time only")
	}
	if _, err := startTime(0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid 0: %v", err)
	}
}

// A process that ran at least Backoff.Reset starts the backoff over: a
// module that always runs a while before it exits waits Initial every
// time, where one that crashes at once waits longer each time.
func TestBackoffResetAfterARun(t *testing.T) {
	e := newEnv(t, Backoff{Initial: 10 * time.Millisecond, Max: time.Second, Reset: 50 * time.Millisecond})
	e.script("sha256:a", `sleep 0.1; exit 2`, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "job", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "three restarts", func() bool { return status(t, r, "job").Restarts >= 3 })
	page, err := r.Logs(ctx(t), "job", node.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var waits []string
	for _, l := range page.Lines {
		if _, w, ok := strings.Cut(l, "next start in "); ok {
			waits = append(waits, w)
		}
	}
	if len(waits) < 3 || !equal(waits[:3], []string{"10ms", "10ms", "10ms"}) {
		t.Errorf("restart waits %v, want 10ms each: every run lasted past the reset", waits)
	}
}

// A fill written before the running process started (the race of a
// backoff's timer with the fill's wake) gives it no on_fill action: it
// saw the file. A later fill restarts it.
func TestFillBeforeStartGivesNoAction(t *testing.T) {
	e := newEnv(t, Backoff{})
	if err := os.WriteFile(filepath.Join(e.cfg.Root, "cred"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.script("sha256:re", needsCred, bundle.Manifest{OnFill: "restart"})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "re", Build: "sha256:re", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	first := status(t, r, "re")
	// A wake stamped before the process started, as one delayed behind
	// the timer's restart would be.
	if _, err := r.send(ctx(t), r.mods["re"], request{Op: opWake, At: 1}); err != nil {
		t.Fatal(err)
	}
	waitLog(t, r, "re", "meshfold: a filled file was written before this process started: no on_fill action")
	if st := status(t, r, "re"); st.PID != first.PID || st.Restarts != 0 {
		t.Fatalf("a stale fill restarted the module: %+v", st)
	}
	r.Filled(ctx(t), "re")
	waitFor(t, r, "on_fill restart", func() bool {
		st := status(t, r, "re")
		return st.State == events.Running && st.PID != first.PID
	})
}

// Open reaches no shim: a previous agent's shims are adopted on the
// runtime's first use, so an agent refused by the node's lease never
// talks to the shims of the agent that holds it. The shim here is the
// test itself, listening on the module's socket.
func TestOpenReachesNoShimUntilUsed(t *testing.T) {
	e := newEnv(t, Backoff{})
	dir := filepath.Join(e.cfg.StateDir, "process", "web")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(dir, specFile, spec{Module: "web", Build: "sha256:a", Account: self}); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(dir, shimFile, identity{PID: pid, Start: start}); err != nil {
		t.Fatal(err)
	}
	l, err := listenUnix(dir, sockFile)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	r, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// A dial Open made is in the listener's backlog by now: a
	// non-blocking accept finds it.
	rc, err := l.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var acceptErr error
	if err := rc.Control(func(fd uintptr) {
		var nfd int
		nfd, _, acceptErr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if acceptErr == nil {
			unix.Close(nfd)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if acceptErr == nil {
		t.Fatal("Open connected to a shim")
	} else if !errors.Is(acceptErr, unix.EAGAIN) {
		t.Fatalf("accept: %v", acceptErr)
	}
	// The first use adopts: it connects (and, this shim saying nothing,
	// reports the module stopped).
	_ = l.SetDeadline(time.Now().Add(deadline))
	used := make(chan []events.HaveModule, 1)
	go func() {
		hv, _ := r.Running(context.Background())
		used <- hv
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("the first use did not connect to the shim: %v", err)
	}
	c.Close()
	if hv := <-used; len(hv) != 1 || hv[0].Name != "web" || hv[0].State != events.Stopped {
		t.Errorf("have after adopting a silent shim: %+v, want web stopped", hv)
	}
}
