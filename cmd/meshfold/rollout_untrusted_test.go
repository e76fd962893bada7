package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// TestRolloutHaltsWithoutRevertOnAnUntrustedKey is a fresh user's finding
// F1: three real node agents (`meshfold node`, the recording runtime);
// cat's trusts another key than the reconciler's (its trust file not
// copied after a rotation). ace and bob take web:2; cat refuses its plan
// for the reconciler's key. The rollout halts and, auto_revert or not,
// reverts nothing: ace and bob keep web:2 (a revert's plan would be
// refused by cat the same). The halt line of `rollout status` says cat's
// words whole: its trust file, not a message cut inside a cut message.
func TestRolloutHaltsWithoutRevertOnAnUntrustedKey(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs node agent processes: not in -short")
	}
	m := startMesh(t)
	trust := m.serveSigned(t)
	_, otherTrust := testSigner(t) // a key the reconciler does not sign with
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	subj := m.cfg.Subjects()
	dir := t.TempDir()
	pub := store.NewPublisher(m.js, subj)
	for _, n := range []string{"ace", "bob", "cat"} {
		tr := trust
		if n == "cat" {
			tr = otherTrust
		}
		startMeshfold(t, "node", n, "--runtime", "record", "--root", filepath.Join(dir, n),
			"--state-dir", filepath.Join(dir, n+"-state"), "--server", m.e.ClientURL(), "--trust", tr)
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"ace", "bob"} {
		waitfor.Until(t, 30*time.Second, n+" running web:1", func() bool {
			h, err := store.LastMsg(ctx, stream, subj, n, events.KindHave)
			if err != nil {
				return false
			}
			have, ok := h.Event.Payload.(*events.Have)
			return ok && len(have.Modules) == 1 && have.Modules[0].Build == "web:1" && have.Modules[0].State == events.Running
		})
	}
	file := writeFleet(t, "fleet: web\nnodes: {ace: {}, bob: {}, cat: {}}\ngroups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n"+
		"rollout: {canary: 0, batch: 1, max_unavailable: 1, min_healthy: 0s, healthy_deadline: 30s, auto_revert: true}\n")
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--allow-missing-build"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	v := waitStatus(t, m, func(v rollout.View) bool { return v.Phase != rollout.Running })
	if v.Phase != rollout.Halted || v.Halt == nil || v.Halt.Node != "cat" || v.Revert != nil {
		t.Fatalf("phase %s, halt %+v, revert %+v: want halted on cat, no revert", v.Phase, v.Halt, v.Revert)
	}
	for _, tv := range v.Targets {
		want := rollout.Done
		if tv.Node == "cat" {
			want = rollout.Failed
		}
		if tv.Status != want || tv.Revert != nil {
			t.Errorf("%s: %s, revert %+v; want %s and no revert", tv.Node, tv.Status, tv.Revert, want)
		}
	}
	for _, n := range []string{"ace", "bob"} {
		m0, err := store.LastMsg(ctx, stream, subj, n, events.KindWant)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(m0.MsgID, ".forward") {
			t.Errorf("%s's newest want is %q, want its forward step (no revert)", n, m0.MsgID)
		}
	}
	out, _, code := m.cli(t, "rollout", "status", "web")
	halted := ""
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "halted at") {
			halted = l
		}
	}
	if code != 0 || !strings.Contains(halted, "refused plan") || !strings.Contains(halted, "reconciler's key") || !strings.Contains(halted, otherTrust) || strings.Contains(halted, " bytes)") {
		t.Errorf("status: code %d, want a whole halt line naming the refusal for the key\n%s", code, out)
	}
}
