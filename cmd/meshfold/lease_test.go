package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestHelperProcess is not a test: the tests below run the test binary
// again as `meshfold ARGS...` (everything after "--"), a real process they
// can kill by pid.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("MESHFOLD_HELPER_PROCESS") != "1" {
		t.Skip("only run as a helper process")
	}
	args := os.Args[slices.Index(os.Args, "--")+1:]
	if os.Getenv("MESHFOLD_HELPER_SHIMS_OUTLIVE") == "1" {
		// A node agent whose shims outlive it, as in production: a test
		// kills the agent and adopts its modules, then kills them by the
		// pids they recorded.
		os.Unsetenv("MESHFOLD_TEST_PARENT")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	endProfile := helperProfile(t)
	code := run(ctx, args, os.Stdin, os.Stdout, os.Stderr)
	stop()
	endProfile()
	os.Exit(code)
}

// helperProfile starts a CPU profile of the helper process when
// MESHFOLD_HELPER_PROFILE names a file prefix (PREFIX.cpu, and PREFIX.heap
// written at the end: what it allocated), for a benchmark's profile of the
// command it runs; the returned func stops it.
func helperProfile(t *testing.T) func() {
	prefix := os.Getenv("MESHFOLD_HELPER_PROFILE")
	if prefix == "" {
		return func() {}
	}
	f, err := os.Create(prefix + ".cpu")
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		h, err := os.Create(prefix + ".heap")
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if err := pprof.Lookup("allocs").WriteTo(h, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// meshfoldProcess is `meshfold args...` running as its own process.
type meshfoldProcess struct {
	cmd    *exec.Cmd
	stderr *storetest.SyncBuffer
	done   chan struct{}
}

func startMeshfold(t testing.TB, args ...string) *meshfoldProcess {
	t.Helper()
	return startMeshfoldCmd(t, helperCommand(args...), args)
}

// startMeshfoldCmd starts cmd, meshfold run with args (this test binary
// as the helper process, or a built binary), as startMeshfold does.
func startMeshfoldCmd(t testing.TB, cmd *exec.Cmd, args []string) *meshfoldProcess {
	t.Helper()
	p := &meshfoldProcess{cmd: cmd, stderr: &storetest.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, p.stderr
	if err := testproc.StartChild(cmd); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill() // by pid: the process this test started
			<-p.done
		}
		if t.Failed() {
			t.Logf("pid %d (%s) said:\n%s", cmd.Process.Pid, strings.Join(args, " "), p.stderr.String())
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *meshfoldProcess) wait(t *testing.T, ctx context.Context) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-ctx.Done():
		t.Fatalf("pid %d did not exit; stderr:\n%s", p.cmd.Process.Pid, p.stderr.String())
		return -1
	}
}

// nextHolder waits for the next change of the watched lease key: the
// holder put, or nil for a delete.
func nextHolder(t *testing.T, ctx context.Context, w jetstream.KeyWatcher) *store.Holder {
	t.Helper()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue // end of the initial values
			}
			if e.Operation() != jetstream.KeyValuePut {
				return nil
			}
			var h store.Holder
			if err := json.Unmarshal(e.Value(), &h); err != nil {
				t.Fatal(err)
			}
			return &h
		case <-ctx.Done():
			t.Fatal("the lease key did not change")
			return nil
		}
	}
}

// One agent per node, across real processes: a second `meshfold node ace`
// is refused while the first runs, naming its pid; after the first is
// killed with SIGKILL (no release), the next agent takes the lease once it
// expires, within the TTL; a clean stop releases it.
func TestNodeLeaseAcrossProcesses(t *testing.T) {
	// Not parallel: it times the takeover against the lease TTL.
	if testing.Short() {
		t.Skip("starts processes")
	}
	m := startMesh(t)
	ctx := testCtx(t)
	kv, err := store.OpenNodeLeases(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ttl := st.TTL()
	w, err := kv.Watch(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	dir := t.TempDir()
	_, trust := testSigner(t)
	agent := func() *meshfoldProcess {
		return startMeshfold(t, "node", "ace", "--runtime", "record", "--root", filepath.Join(dir, "root"),
			"--state-dir", filepath.Join(dir, "state"), "--server", m.e.ClientURL(), "--trust", trust)
	}
	holderPID := func(pid int) {
		t.Helper()
		for {
			if h := nextHolder(t, ctx, w); h != nil && h.PID == pid {
				return
			}
		}
	}

	first := agent()
	holderPID(first.cmd.Process.Pid)

	second := agent()
	if code := second.wait(t, ctx); code != exitError {
		t.Fatalf("second agent exited %d, want %d; stderr:\n%s", code, exitError, second.stderr.String())
	}
	msg := second.stderr.String()
	for _, s := range []string{"node ace is held by another live process", "pid " + strconv.Itoa(first.cmd.Process.Pid), "since "} {
		if !strings.Contains(msg, s) {
			t.Errorf("second agent's error does not say %q:\n%s", s, msg)
		}
	}

	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(t, ctx)
	killed := time.Now()
	third := agent()
	holderPID(third.cmd.Process.Pid)
	waited := time.Since(killed)
	t.Logf("after kill -9, the next agent held the lease %s later (TTL %s)", waited.Round(time.Millisecond), ttl)
	if waited > ttl+2*time.Second {
		t.Errorf("the next agent waited %s, more than the TTL %s (and 2 s to start)", waited, ttl)
	}

	if err := third.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := third.wait(t, ctx); code != exitOK {
		t.Errorf("agent stopped with SIGTERM exited %d; stderr:\n%s", code, third.stderr.String())
	}
	for {
		if h := nextHolder(t, ctx, w); h == nil {
			break // released
		}
	}
}

// exited waits for an in-process `meshfold reconcile` to end by itself
// and returns its exit code.
func (p *reconcileProc) exited(t *testing.T) int {
	t.Helper()
	select {
	case code := <-p.code:
		p.code <- code
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("meshfold reconcile did not exit; stderr:\n%s", p.stderr.String())
		return 0
	}
}

// One ungrouped reconciler per stream, and none beside a group: a second
// ungrouped one is refused naming the first (host, pid, since), a group
// member beside it is refused, and an ungrouped one beside a group is
// refused naming the group's live members.
func TestOneReconcilerPerStream(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	url := []string{"--server", m.e.ClientURL(), "--signing-key", filepath.Join(t.TempDir(), signingKeyFile)}
	a := startReconcile(t, url...)
	pollUntil(t, "the first reconciler to run", func() bool { return strings.Contains(a.stderr.String(), `msg="reconciler running"`) })

	second := startReconcile(t, url...)
	if code := second.exited(t); code != exitError {
		t.Fatalf("second ungrouped reconciler exited %d, want %d:\n%s", code, exitError, second.stderr.String())
	}
	for _, s := range []string{"an ungrouped reconciler folds this stream", "reconciler MESH is held by another live process",
		"pid " + strconv.Itoa(os.Getpid()), "since "} {
		if !strings.Contains(second.stderr.String(), s) {
			t.Errorf("second reconciler's error does not say %q:\n%s", s, second.stderr.String())
		}
	}
	member := startReconcile(t, append(url, "--group", "g", "--instance", "x")...)
	if code := member.exited(t); code != exitError || !strings.Contains(member.stderr.String(), "an ungrouped reconciler folds this stream") {
		t.Fatalf("group member beside an ungrouped reconciler exited %d:\n%s", code, member.stderr.String())
	}
	if code := a.stop(t); code != exitOK {
		t.Fatalf("first reconciler exited %d:\n%s", code, a.stderr.String())
	}

	g := startReconcile(t, append(url, "--group", "g", "--instance", "y")...)
	pollUntil(t, "the group member to own partitions", func() bool { return strings.Contains(g.stderr.String(), `msg="partitions owned"`) })
	beside := startReconcile(t, url...)
	if code := beside.exited(t); code != exitError || !strings.Contains(beside.stderr.String(), "a reconciler group folds this stream") ||
		!strings.Contains(beside.stderr.String(), "g/y") {
		t.Fatalf("ungrouped reconciler beside a group exited %d, want refused naming g/y:\n%s", code, beside.stderr.String())
	}
	if code := g.stop(t); code != exitOK {
		t.Fatalf("group member exited %d:\n%s", code, g.stderr.String())
	}
}
