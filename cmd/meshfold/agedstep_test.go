package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// Issue 27's open finding: with --max-age shorter than a rollout (its
// canary waiting for a promote over a weekend), a step's want for a node
// whose want before the rollout aged out meanwhile was refused, "the
// node's want #N is gone from the stream": the want carries
// Nats-Expected-Last-Subject-Sequence naming the want it was decided
// against, which the stream no longer holds. Now the step's want is
// published, expecting the node to hold none (the fence still refuses a
// want published meanwhile). serve's reconciler and controller run
// against a stream with a max age; the age-out is the stream's purge of
// every event before the rollout's start (what --max-age does, at a
// moment the test chooses); the test plays the canary's node.
func TestRolloutStepAfterThePreviousWantAgedOut(t *testing.T) {
	t.Parallel()
	e, nc, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{MaxAge: time.Hour})
	m := &mesh{e: e, nc: nc, js: js, cfg: cfg}
	m.serveReconciler(t)
	ctx := testCtx(t)
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	old := []events.WantModule{{Name: "web", Build: "web:1"}}
	prev := map[string]uint64{}
	for _, n := range []string{"ace", "bob"} {
		ack, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: old}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		prev[n] = ack.Seq
	}
	file := writeFleet(t, `fleet: web
nodes: {ace: {}, bob: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "web:2"}]}]
rollout: {canary: 1, batch: 1, max_unavailable: 1, min_healthy: 0s, healthy_deadline: 1m}
`)
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--allow-missing-build"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	v := waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 2 && v.Targets[0].Published > 0 })
	id := v.Rollout
	// The canary takes its new want and runs it.
	plan := waitPlanOf(t, stream, m, "ace", v.Targets[0].Published)
	for _, p := range []events.Payload{
		&events.Settle{Module: "web", Op: events.OpApply, Plan: plan},
		&events.Have{Modules: []events.HaveModule{{Name: "web", Build: "web:2", State: events.Running}}},
	} {
		if _, err := pub.Append(ctx, "ace", events.Stamp(p, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	waitStatus(t, m, func(v rollout.View) bool { return v.Phase == rollout.WaitingPromote })

	// Over the weekend the wants before the rollout age out.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.LastMsg(ctx, stream, subj, "bob", events.KindWant); !errors.Is(err, store.ErrNoMessage) {
		t.Fatalf("bob's want #%d still in the stream after the purge (%v)", prev["bob"], err)
	}

	if out, errs, code := m.cli(t, "rollout", "promote", "web", "--by", "alice"); code != 0 {
		t.Fatalf("promote: code %d\n%s%s", code, out, errs)
	}
	refused := func() (*rollout.Refused, bool) {
		r, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", string(rollout.KindRefused)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		p, err := rollout.Decode(rollout.KindRefused, r.Data)
		if err != nil {
			t.Fatal(err)
		}
		return p.(*rollout.Refused), true
	}
	stepID := rollout.WantID("web", id, "bob", rollout.StepForward)
	var bob store.Msg
	waitfor.Until(t, 30*time.Second, "bob's step: its want stored, or refused", func() bool {
		if _, ok := refused(); ok {
			return true
		}
		w, err := store.LastMsg(ctx, stream, subj, "bob", events.KindWant)
		bob = w
		return err == nil && w.MsgID == stepID
	})
	if r, ok := refused(); ok {
		t.Fatalf("bob's step refused: %s (last #%d); want its want published over the aged-out want #%d", r.Error, r.Last, prev["bob"])
	}
	if w, ok := bob.Event.Payload.(*events.Want); !ok || len(w.Modules) != 1 || w.Modules[0].Build != "web:2" {
		t.Fatalf("bob's want #%d: %+v, want web:2", bob.Event.Seq, bob.Event.Payload)
	}
	v = waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 2 && v.Targets[1].Published == bob.Event.Seq })
	if tv := v.Targets[1]; tv.Node != "bob" || tv.Status == rollout.Conflict || tv.Prev != prev["bob"] {
		t.Errorf("bob's row: %+v; want its step published over want #%d, no conflict", tv, prev["bob"])
	}
	out, errs, code := m.cli(t, "rollout", "why", "web", "bob")
	if code != 0 || !strings.Contains(out, "published") || strings.Contains(out, "refused") {
		t.Errorf("rollout why web bob: code %d, want its want published\n%s%s", code, out, errs)
	}
}
