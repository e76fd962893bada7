package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// TestRolloutCanaryKilledBeforeApply is a user's path: three real node
// agents (`meshfold node`, the recording runtime); the one that will be
// the canary is killed with SIGKILL before `meshfold apply`, and its
// lease expires (its agent event says down). The canary is given its
// want but never runs it, so the rollout never reaches waiting-promote:
// status says why ("canary ace: agent down since …"), a promote is
// refused with that reason (exit 1, nothing published), and at the
// canary's healthy_deadline the rollout halts; bob and cat never get
// the untried build. Before the rule, the unreached canary cleared its
// batch, the rollout waited for a promote, and the promote sent the
// build on to the others.
func TestRolloutCanaryKilledBeforeApply(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs and kills node agent processes: not in -short")
	}
	m := startMesh(t)
	trust := m.serveSigned(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	subj := m.cfg.Subjects()
	dir := t.TempDir()
	nodes := []string{"ace", "bob", "cat"}
	procs := map[string]*meshfoldProcess{}
	pub := store.NewPublisher(m.js, subj)
	for _, n := range nodes {
		procs[n] = startMeshfold(t, "node", n, "--runtime", "record", "--root", filepath.Join(dir, n),
			"--state-dir", filepath.Join(dir, n+"-state"), "--server", m.e.ClientURL(), "--trust", trust)
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		waitfor.Until(t, 30*time.Second, n+" running web:1", func() bool {
			h, err := store.LastMsg(ctx, stream, subj, n, events.KindHave)
			if err != nil {
				return false
			}
			have, ok := h.Event.Payload.(*events.Have)
			return ok && len(have.Modules) == 1 && have.Modules[0].Build == "web:1" && have.Modules[0].State == events.Running
		})
	}

	// ace, the canary (the first target), killed -9; apply once its
	// lease expired, as `meshfold fleet` says agent-down.
	if err := procs["ace"].cmd.Process.Signal(syscall.SIGKILL); err != nil { // by pid: the process this test started
		t.Fatal(err)
	}
	procs["ace"].wait(t, ctx)
	waitfor.Until(t, 30*time.Second, "ace's agent event to say down", func() bool {
		msg, err := store.LastMsg(ctx, stream, subj, "ace", events.KindAgent)
		if err != nil {
			return false
		}
		a, ok := msg.Event.Payload.(*events.Agent)
		return ok && a.State == events.AgentDown
	})
	file := filepath.Join(dir, "fleet.yaml")
	yaml := "fleet: web\nnodes: {ace: {}, bob: {}, cat: {}}\ngroups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n" +
		"rollout: {canary: 1, batch: 2, max_unavailable: 2, min_healthy: 1s, healthy_deadline: 15s}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}

	// The canary batch waits for ace, and status says so.
	const why = "canary ace: agent down since"
	v := waitStatus(t, m, func(v rollout.View) bool {
		return v.Phase == rollout.Running && len(v.Waiting) == 1 && strings.HasPrefix(v.Waiting[0], why) && v.Targets[0].Published > 0
	})
	if tv := v.Targets[0]; tv.Node != "ace" || tv.Batch != 1 || tv.Published == 0 || !tv.Down || !strings.HasPrefix(tv.Why, why) {
		t.Fatalf("the canary: %+v, want ace, batch 1, its want published, its agent down, why %q…", tv, why)
	}
	if out, _, code := m.cli(t, "rollout", "status", "web"); code != 0 || !strings.Contains(out, why) {
		t.Errorf("status: code %d, want it to say %q\n%s", code, why, out)
	}
	out, errs, code := m.cli(t, "rollout", "promote", "web", "--by", "alice")
	if code != 1 || out != "" || !strings.Contains(errs, "nothing published") || !strings.Contains(errs, why) {
		t.Errorf("promote while the canary is down: code %d, want 1, nothing published and %q\n%s%s", code, why, out, errs)
	}

	// At its healthy_deadline: halted, never waiting for a promote.
	v = waitStatus(t, m, func(v rollout.View) bool { return v.Phase != rollout.Running })
	if v.Phase != rollout.Halted || v.Halt == nil || v.Halt.Node != "ace" || !strings.HasPrefix(v.Halt.Reason, why) {
		t.Fatalf("phase %s, halt %+v: want halted on ace, %q…", v.Phase, v.Halt, why)
	}
	if tv := v.Targets[0]; tv.Status != rollout.Unreached {
		t.Errorf("ace: %s, want unreached", tv.Status)
	}
	if out, errs, code := m.cli(t, "rollout", "promote", "web", "--by", "alice"); code != 1 || !strings.Contains(errs, "rollout halted") {
		t.Errorf("promote of the halted rollout: code %d, want 1 and why\n%s%s", code, out, errs)
	}
	if out, _, code := m.cli(t, "rollout", "status", "web"); code != 0 || !strings.Contains(out, "halted at #") || !strings.Contains(out, why) {
		t.Errorf("status: code %d, want halted and %q\n%s", code, why, out)
	}
	for _, n := range []string{"bob", "cat"} {
		wants := 0
		err := store.ReadNode(ctx, m.js, m.cfg.Name, subj, n, v.Rollout, 0, func(msg store.Msg) error {
			if msg.Event.Kind == events.KindWant {
				wants++
			}
			return nil
		})
		if err != nil || wants != 0 {
			t.Errorf("%s: %d wants since the rollout's start (%v), want none: the canary never ran the build", n, wants, err)
		}
	}
}
