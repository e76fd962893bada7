package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// `meshfold node` runs a pushed bundle as a real process by default;
// `meshfold logs` shows the module's own output; a restarted agent adopts
// the process (same pid) and reports it running; a plan without the
// module stops it.
func TestNodeRunsBundleAndLogs(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil { // modules may run as another user
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
	if err := os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\ni=1; while [ $i -le 200000 ]; do echo \"$i pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp\"; i=$((i+1)); done\necho \"hello from $MESHFOLD_MODULE on $MESHFOLD_NODE\"\nexec sleep 3600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "build", "push", src)
	if code != 0 {
		t.Fatalf("build push: %d %s", code, errs)
	}
	build := strings.TrimSpace(out)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	signer, trust := testSigner(t)
	n := 0
	plan := func(rows ...events.PlanModule) uint64 {
		t.Helper()
		n++
		// The want the plan composes, before it: a plan's cause is below
		// its own sequence, or the agent refuses it.
		w, err := pub.Append(testCtx(t), "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		p := events.Stamp(&events.Plan{Cause: w.Seq, Want: w.Seq, Modules: rows}, time.Now())
		ack, err := pub.Append(testCtx(t), "ace", p, store.WithMsgID("ace.plan."+strconv.Itoa(n)+".0"), store.WithSigner(signer))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	agent := func() func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		var out storetest.SyncBuffer
		go func() {
			done <- run(ctx, []string{"node", "ace", "--root", root, "--state-dir", state, "-s", m.e.ClientURL(), "--log-level", "warn", "--trust", trust}, nil, &out, &out)
		}()
		return func() {
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("node exited %d:\n%s", code, out.String())
			}
		}
	}
	t.Cleanup(func() { killModules(t, filepath.Join(state, "process")) })

	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	// runs_as is the test's own user: a root agent refuses an empty one.
	p1 := plan(events.PlanModule{Name: "web", Build: build, RunsAs: me.Username, Files: []events.File{}})
	stop := agent()
	waitHave(t, m, func(h *events.Have) bool { return len(h.Modules) == 1 && h.Modules[0].State == events.Running })
	waitLogLine(t, m, "web", "hello from web on ace")
	out, errs, code = m.cli(t, "logs", "ace", "web", "--tail", "1")
	if code != 0 || strings.TrimSpace(out) != "hello from web on ace" {
		t.Fatalf("logs --tail 1: %d %q %s", code, out, errs)
	}
	// 200,000 lines of 70 bytes, over the 10 MB a log file holds: logs
	// reads across the rotated file and the current one, page after page,
	// in order, none twice.
	if old, _ := filepath.Glob(filepath.Join(state, "process", "web", "module-*.log")); len(old) == 0 {
		t.Fatalf("no rotated log file: the test wants a rotation")
	}
	out, errs, code = m.cli(t, "logs", "ace", "web", "--tail", "200001")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 200001 || lines[200000] != "hello from web on ace" {
		t.Fatalf("logs --tail 200001: %d, %d lines, %s", code, len(lines), errs)
	} else {
		pad := " " + strings.Repeat("p", 60)
		for i, l := range lines[:200000] {
			if l != strconv.Itoa(i+1)+pad {
				t.Fatalf("logs --tail 200001: line %d is %q", i, l)
			}
		}
	}
	out, _, _ = m.cli(t, "logs", "ace", "web", "--tail", "1", "--timestamps")
	if f := strings.Fields(out); len(f) < 2 || f[1] != "out" || !strings.HasSuffix(strings.TrimSpace(out), "hello from web on ace") {
		t.Errorf("logs --timestamps: %q, want time, out, the line", out)
	}
	pid := modulePID(t, state, "web")

	// The agent stops; the module does not. The next agent adopts it.
	stop()
	if !processAlive(pid) {
		t.Fatalf("the module (pid %d) stopped with its agent", pid)
	}
	began := time.Now()
	stop = agent()
	defer func() { stop() }()
	// The restarted agent applies p1 again: a no-op on the adopted
	// module, so its settle names no module.
	waitKind(t, m, events.KindSettle, func(ev events.Event) bool {
		s := ev.Payload.(*events.Settle)
		return s.Plan == p1 && s.Module == ""
	})
	t.Logf("agent restart → plan settled with the module adopted: %s", time.Since(began))
	if now := modulePID(t, state, "web"); now != pid {
		t.Errorf("after the agent's restart the module's pid is %d, want the adopted %d", now, pid)
	}

	// A second agent of the node, on the same state directory, is refused
	// by the node's lease before its runtime reaches a shim: it adopts
	// nothing from the agent that runs.
	var refused storetest.SyncBuffer
	code = run(context.Background(), []string{"node", "ace", "--root", root, "--state-dir", state, "-s", m.e.ClientURL(), "--log-level", "info", "--trust", trust}, nil, &refused, &refused)
	if code == exitOK || !strings.Contains(refused.String(), "held by another live process") {
		t.Errorf("a second agent of ace: exit %d, want refused by the lease:\n%s", code, refused.String())
	}
	if strings.Contains(refused.String(), "module adopted") {
		t.Errorf("the refused agent adopted the running agent's modules:\n%s", refused.String())
	}
	if now := modulePID(t, state, "web"); now != pid {
		t.Errorf("after the refused agent the module's pid is %d, want %d", now, pid)
	}

	p2 := plan()
	waitSettle(t, m, p2)
	if processAlive(pid) {
		t.Errorf("module pid %d still runs after its removal", pid)
	}
	// A module the node does not have is a name the stream does not
	// hold for it: exit 2, as a node it does not hold.
	if _, errs, code := m.cli(t, "logs", "ace", "web"); code != exitUsage || !strings.Contains(errs, "no such module") {
		t.Errorf("logs of a removed module: %d %s", code, errs)
	}
}

func waitHave(t *testing.T, m *mesh, pred func(*events.Have) bool) {
	t.Helper()
	waitKind(t, m, events.KindHave, func(ev events.Event) bool { return pred(ev.Payload.(*events.Have)) })
}

func waitSettle(t *testing.T, m *mesh, plan uint64) {
	t.Helper()
	waitKind(t, m, events.KindSettle, func(ev events.Event) bool { return ev.Payload.(*events.Settle).Plan == plan })
}

// waitKind reads ace's events of kind until pred holds.
func waitKind(t *testing.T, m *mesh, kind events.Kind, pred func(events.Event) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := m.cfg.Subjects()
	tail, err := store.Follow(ctx, m.js, store.TailConfig{Stream: m.cfg.Name, Subjects: subj, Filter: subj.Stored("ace", kind)})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	for {
		msg, err := tail.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for a %s: %v", kind, err)
		}
		if ev := msg.Event; ev.Kind != "" && ev.Err == nil && pred(ev) {
			return
		}
	}
}

// waitLogLine follows the module's log through the agent's logs endpoint
// (each request waits on the agent's side for new output) until want.
func waitLogLine(t *testing.T, m *mesh, module, want string) {
	t.Helper()
	// Three minutes: the module first writes 14 MB through a shell loop
	// and a -race shim, which took over a minute on two loaded cores.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	q := node.LogsRequest{Module: module}
	for ctx.Err() == nil {
		q.WaitMS = 2000
		page, err := requestLogs(ctx, m.nc, node.LogsSubject(m.cfg.Prefix, "ace"), q, 10*time.Second)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// One page unanswered in 10 s (the agent reads a 14 MB file
			// under -race on loaded cores): ask again from the same cursor.
			t.Logf("logs: %v; asking again", err)
			continue
		}
		if err != nil {
			t.Fatalf("logs: %v", err)
		}
		for _, l := range page.Lines {
			if l == want {
				return
			}
		}
		q.Cursor = page.Cursor
	}
	t.Fatalf("the log of %s never showed %q", module, want)
}

func modulePID(t *testing.T, state, module string) int {
	t.Helper()
	var id struct{ PID int }
	data, err := os.ReadFile(filepath.Join(state, "process", module, "module.json"))
	if err == nil {
		err = json.Unmarshal(data, &id)
	}
	if err != nil {
		t.Fatal(err)
	}
	return id.PID
}

func processAlive(pid int) bool {
	data, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

func itoa(n int) string { return strconv.Itoa(n) }

// killModules stops, by the pids they recorded, the shims and modules a
// failed test left running under dir (processes this test started): a
// shim gets SIGTERM first, so it stops its module's whole tree and
// removes the module's cgroup; what is still there after a few seconds
// gets SIGKILL.
func killModules(t testing.TB, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		for _, f := range []string{"shim.json", "module.json"} {
			var id struct{ PID int }
			data, err := os.ReadFile(filepath.Join(dir, e.Name(), f))
			if err != nil || json.Unmarshal(data, &id) != nil || id.PID <= 0 {
				continue
			}
			if !processAlive(id.PID) {
				continue
			}
			if f == "shim.json" {
				t.Logf("stopping %s's leftover shim (pid %d)", e.Name(), id.PID)
				_ = syscall.Kill(id.PID, syscall.SIGTERM)
				if testproc.WaitGone(id.PID, 15*time.Second) == nil {
					continue
				}
			}
			t.Logf("killing %s's leftover %s (pid %d)", e.Name(), f, id.PID)
			_ = syscall.Kill(-id.PID, syscall.SIGKILL)
			_ = syscall.Kill(id.PID, syscall.SIGKILL)
		}
	}
}
