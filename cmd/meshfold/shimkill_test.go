package main

import (
	"context"
	"encoding/json"
	"os"
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
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A node whose agent and module supervisors (shims) are all killed -9 (a
// careless kill of every process group, the OOM killer, a stop of the
// shims' scope) is managed again by its next agent, started with the same
// --root and --state-dir: the module, running as nobody, died with its
// shim, what it forked is killed by the new agent, which starts without a
// refusal and runs the module again under a new shim (a fresh user's
// finding F3: the orphaned module ran on and the agent refused to start,
// "started from another state directory … kill -TERM each shim pid",
// though the state directory was the same one and there was no shim).
func TestNodeStartsAgainAfterItsShimsWereKilled(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs its module as nobody: needs root")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody")
	}
	m := startMesh(t)
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil { // the module runs as nobody
			t.Fatal(err)
		}
	}
	src := filepath.Join(dir, "web")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "meshfold.json"), []byte(`{"command":["run.sh"],"stop_timeout":"2s"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// A shell and its child, as a module's script often is.
	if err := os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\nsleep 3600 &\necho \"up as $(id -un)\"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "build", "push", src)
	if code != 0 {
		t.Fatalf("build push: %d %s", code, errs)
	}
	build := strings.TrimSpace(out)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	signer, trust := testSigner(t)
	w, err := pub.Append(testCtx(t), "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	p := events.Stamp(&events.Plan{Cause: w.Seq, Want: w.Seq, Modules: []events.PlanModule{{Name: "web", Build: build, RunsAs: "nobody", Files: []events.File{}}}}, time.Now())
	if _, err := pub.Append(testCtx(t), "ace", p, store.WithMsgID("ace.plan.1.0"), store.WithSigner(signer)); err != nil {
		t.Fatal(err)
	}

	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	t.Cleanup(func() { killModules(t, filepath.Join(state, "process")) })
	type agent struct {
		cancel context.CancelFunc
		done   chan int
		out    *storetest.SyncBuffer
	}
	start := func() agent {
		ctx, cancel := context.WithCancel(context.Background())
		a := agent{cancel, make(chan int, 1), &storetest.SyncBuffer{}}
		go func() {
			a.done <- run(ctx, []string{"node", "ace", "--root", root, "--state-dir", state, "-s", m.e.ClientURL(), "--log-level", "warn", "--trust", trust}, nil, a.out, a.out)
		}()
		return a
	}
	// running waits for a have stored since since with web running as
	// nobody, its recorded pid other than not, failing at once should the
	// agent exit.
	running := func(a agent, since time.Time, not int) {
		t.Helper()
		got := make(chan struct{})
		go func() {
			defer close(got)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			subj := m.cfg.Subjects()
			tail, err := store.Follow(ctx, m.js, store.TailConfig{Stream: m.cfg.Name, Subjects: subj, Filter: subj.Stored("ace", events.KindHave), StartTime: since})
			if err != nil {
				return
			}
			defer tail.Stop()
			for {
				msg, err := tail.Next(ctx)
				if err != nil {
					return
				}
				h, ok := msg.Event.Payload.(*events.Have)
				if ok && len(h.Modules) == 1 && h.Modules[0].State == events.Running && h.Modules[0].Account == "nobody" && moduleID(state, "web") != not {
					return
				}
			}
		}()
		select {
		case <-got:
		case c := <-a.done:
			a.done <- c
			t.Fatalf("the agent exited %d:\n%s", c, a.out.String())
		}
		if moduleID(state, "web") == not {
			t.Fatalf("no have of web running under a new shim within a minute:\n%s", a.out.String())
		}
	}

	a := start()
	running(a, time.Now().Add(-time.Minute), 0)
	var shim, module int
	shim, module = shimID(state, "web"), moduleID(state, "web")
	var child int
	// Its `sleep 3600`, not a passing process of the script's (the
	// `$(id -un)` subshell, a fork not yet the sleep), which exits by
	// itself: a CI run took one for the child and found it gone.
	waitfor.Until(t, 30*time.Second, "the module's child", func() bool {
		for _, pid := range pidsWithEnv("MESHFOLD_MODULE=web", "MESHFOLD_ROOT="+mustAbs(t, root)) {
			if pid != module && commandOf(pid) == "sleep" {
				child = pid
			}
		}
		return child != 0
	})

	// The agent goes (its shims run on, as after a kill -9 of it), then
	// each shim is killed -9.
	a.cancel()
	if c := <-a.done; c != 0 {
		t.Fatalf("the agent exited %d:\n%s", c, a.out.String())
	}
	killed := time.Now()
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := testproc.WaitGone(module, time.Minute); err != nil {
		t.Fatalf("the module (pid %d) outlived its shim killed -9: %v", module, err)
	}
	t.Logf("shim killed -9 → its module (running as nobody) gone: %s", time.Since(killed))
	if !processAlive(child) {
		t.Fatalf("the module's child %d died with the shim: the test wants an orphan", child)
	}

	began := time.Now()
	a = start()
	defer func() {
		a.cancel()
		<-a.done
	}()
	running(a, began, module)
	t.Logf("agent started again → web running under a new shim: %s", time.Since(began))
	if err := testproc.WaitGone(child, 10*time.Second); err != nil {
		t.Errorf("the orphaned child %d of the killed shim's module still runs: %v", child, err)
	}
	if s := a.out.String(); strings.Contains(s, "already run under root") {
		t.Errorf("the agent said:\n%s", s)
	}
}

// shimID and moduleID are the pids recorded in a module's directory (0:
// none).
func shimID(state, module string) int   { return recordedPID(state, module, "shim.json") }
func moduleID(state, module string) int { return recordedPID(state, module, "module.json") }

func recordedPID(state, module, file string) int {
	var id struct{ PID int }
	data, err := os.ReadFile(filepath.Join(state, "process", module, file))
	if err != nil || json.Unmarshal(data, &id) != nil {
		return 0
	}
	return id.PID
}

// pidsWithEnv lists the processes whose environment holds every one of
// env ("NAME=value").
func pidsWithEnv(env ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !processAlive(pid) {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		vars := strings.Split(string(data), "\x00")
		if !slices.ContainsFunc(env, func(v string) bool { return !slices.Contains(vars, v) }) {
			out = append(out, pid)
		}
	}
	return out
}

// commandOf is the base name of pid's program as its cmdline says ("":
// gone, or a kernel thread).
func commandOf(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(data) == 0 {
		return ""
	}
	return filepath.Base(strings.SplitN(string(data), "\x00", 2)[0])
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
