package main

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// TestApplyOverAnAgedWantRevertsToIt is a fresh user's finding F0: with
// serve --max-age, a node whose want aged out of the stream was taken by
// apply as a node with no want before, and auto_revert gave it an empty
// want (every module removed, the provisioner too). Here serve's
// reconciler and rollout controller run, ace's want (a provisioner and
// web with a filled file) is folded and then aged out of the stream (the
// stream's purge, what --max-age does), `meshfold apply` rolls web:2 out,
// and the node (played by the test) fails to apply its plan. The dry
// run diffs against the want the reconciler's state holds, `rollout
// why` says so, no file is taken for new, and the revert gives ace its
// old want back.
func TestApplyOverAnAgedWantRevertsToIt(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	r := m.serveReconciler(t)
	ctx := testCtx(t)
	subj := m.cfg.Subjects()
	pub := store.NewPublisher(m.js, subj)
	files := []events.File{{Path: "/run/web/token", Mode: "0600"}}
	old := []events.WantModule{
		{Name: "provisioner", Build: "prov:1", RunsAs: "prov", Provisioner: true},
		{Name: "web", Build: "web:1", RunsAs: "web", Files: files},
	}
	ack, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: old}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 30*time.Second, "the reconciler folded ace's want", func() bool {
		st, ok := r.Node("ace")
		return ok && st.Want != nil && st.Want.Seq == ack.Seq
	})
	// ace's events age out: the stream keeps only a later event.
	later, err := pub.Append(ctx, "other", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(later.Seq)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant); err == nil {
		t.Fatal("ace's want still in the stream after the purge")
	}

	file := writeFleet(t, `fleet: web
nodes: {ace: {}}
groups:
  - name: all
    select: {}
    modules:
      - {name: provisioner, build: "prov:1", runs_as: prov, provisioner: true}
      - {name: web, build: "web:2", runs_as: web, files: [{path: /run/web/token, mode: "0600"}]}
rollout: {canary: 0, batch: 1, max_unavailable: 1, min_healthy: 0s, healthy_deadline: 1m, auto_revert: true}
`)
	out, errs, code := m.cli(t, "apply", "-f", file, "--dry-run", "--allow-missing-build")
	if code != 0 || !strings.Contains(out, "web web:1 → web:2") || strings.Contains(out, "new want") ||
		!strings.Contains(out, "ace (#"+seqArg(ack.Seq)+"): the want the stream no longer holds") {
		t.Fatalf("apply --dry-run: code %d, want the change against ace's want #%d (web web:1 → web:2), not a new want\n%s%s", code, ack.Seq, out, errs)
	}
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--allow-missing-build"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	v := waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 1 && v.Targets[0].Published > 0 })
	forward := v.Targets[0].Published
	out, errs, code = m.cli(t, "rollout", "why", "web", "ace")
	if code != 0 || !strings.Contains(out, "diffed against want #"+seqArg(ack.Seq)+", which the stream no longer holds") || strings.Contains(out, "no want before") {
		t.Errorf("rollout why web ace: code %d, want it to name the aged-out want #%d\n%s%s", code, ack.Seq, out, errs)
	}

	// The reconciler plans the new want; the node fails to apply it.
	plan := waitPlanOf(t, stream, m, "ace", forward)
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Settle{Module: "web", Op: events.OpFailed, Plan: plan, Error: "exec: bad build"}, time.Now())); err != nil {
		t.Fatal(err)
	}
	v = waitStatus(t, m, func(v rollout.View) bool {
		return len(v.Targets) == 1 && v.Targets[0].Revert != nil && v.Targets[0].Revert.Status != rollout.RevertPublishing
	})
	if v.Halt == nil || strings.Contains(v.Halt.Reason, "unfilled") {
		t.Errorf("halt %+v: want the apply failure, not an unfilled file (the file is no new one)", v.Halt)
	}
	m0, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
	if err != nil {
		t.Fatal(err)
	}
	w, ok := m0.Event.Payload.(*events.Want)
	if !ok || !strings.HasSuffix(m0.MsgID, ".revert") || !rollout.EqualWant(w.Modules, old) {
		t.Fatalf("ace's newest want #%d (id %q): %+v, want the revert giving back its aged-out want %+v", m0.Event.Seq, m0.MsgID, w, old)
	}
}

// waitPlanOf waits for node's newest plan to be want's and returns its
// sequence.
func waitPlanOf(t *testing.T, stream jetstream.Stream, m *mesh, node string, want uint64) uint64 {
	t.Helper()
	return waitfor.Value(t, 30*time.Second, node+"'s plan of want #"+seqArg(want), func() (uint64, bool) {
		p, err := store.LastMsg(testCtx(t), stream, m.cfg.Subjects(), node, events.KindPlan)
		if err != nil {
			return 0, false
		}
		pl, ok := p.Event.Payload.(*events.Plan)
		return p.Event.Seq, ok && pl.Want == want
	})
}

// agedWant publishes want of node, waits for r to fold it and the plan
// it composed, and ages every event before a later one out of the
// stream, as serve --max-age does. It returns the want's sequence.
func agedWant(t *testing.T, m *mesh, r interface {
	Node(string) (*reconcile.State, bool)
}, node string, want []events.WantModule, have ...events.HaveModule) uint64 {
	t.Helper()
	ctx := testCtx(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	ack, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: want}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	var haveSeq uint64
	if len(have) > 0 {
		h, err := pub.Append(ctx, node, events.Stamp(&events.Have{Modules: have}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		haveSeq = h.Seq
	}
	waitfor.Until(t, 30*time.Second, "the reconciler folded "+node+"'s want, plan and have", func() bool {
		st, ok := r.Node(node)
		return ok && st.Want != nil && st.Want.Seq == ack.Seq && st.Emitted() != nil && st.Emitted().Seq != 0 &&
			(haveSeq == 0 || st.Have != nil && st.Have.Seq == haveSeq)
	})
	later, err := pub.Append(ctx, "other", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(later.Seq)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []events.Kind{events.KindWant, events.KindPlan, events.KindHave} {
		if _, err := store.LastMsg(ctx, stream, m.cfg.Subjects(), node, k); err == nil {
			t.Fatalf("%s's %s still in the stream after the purge", node, k)
		}
	}
	return ack.Seq
}

// A poke of a node whose want and plan aged out of the stream (--max-age)
// asks the reconciler's state whether a file is declared (a fresh user's
// finding F8: it said "no provisioner is needed: neither its newest plan
// nor its newest want declares a file", read from the stream alone).
func TestPokeOfANodeWhosePlanAgedOut(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	r := m.serveReconciler(t)
	agedWant(t, m, r, "ace", []events.WantModule{
		{Name: "provisioner", Build: "prov:1", RunsAs: "prov", Provisioner: true},
		{Name: "web", Build: "web:1", RunsAs: "web", Files: []events.File{{Path: "/run/web/token", Mode: "0600"}}},
	})
	out, errs, code := m.cli(t, "poke", "ace", "--by", "alice", "--wait", "300ms")
	if code != 0 || strings.Contains(errs, "no provisioner is needed") || strings.Contains(errs, "none is needed") || !strings.Contains(errs, "poke ace:") {
		t.Fatalf("poke ace: code %d, want 0 and no 'no provisioner is needed' (its plan declares /run/web/token)\n%s%s", code, out, errs)
	}
}

// rollout status of a fleet whose nodes' haves aged out of the stream
// (--max-age) shows what they run from the reconciler's state: RUNNING
// and builds were blank (a fresh user's finding F8).
func TestRolloutStatusOfNodesWhoseHavesAgedOut(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	r := m.serveReconciler(t)
	for _, n := range []string{"ace", "bob"} {
		agedWant(t, m, r, n, []events.WantModule{{Name: "web", Build: "web:1"}}, events.HaveModule{Name: "web", Build: "web:1", State: events.Running})
	}
	file := writeFleet(t, "fleet: web\nnodes: {ace: {}, bob: {}}\ngroups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n"+
		"rollout: {canary: 1, batch: 1, max_unavailable: 1, min_healthy: 0s}\n")
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--allow-missing-build"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	v := waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 2 && v.Targets[0].Published > 0 })
	for _, tv := range v.Targets {
		if len(tv.Running) != 1 || tv.Running[0].Build != "web:1" {
			t.Errorf("%s runs %+v in the view, want web:1 (the reconciler's state holds its have)", tv.Node, tv.Running)
		}
	}
	out, errs, code := m.cli(t, "rollout", "status", "web")
	if code != 0 || strings.Contains(out, "none known to run yet") || !strings.Contains(out, "web:1") {
		t.Fatalf("rollout status web: code %d, want the builds the nodes run (web:1)\n%s%s", code, out, errs)
	}
}
