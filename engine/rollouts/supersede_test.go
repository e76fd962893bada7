package rollouts_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine/rollouts"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A superseding apply read the fleet while rollout A ran, and A's
// canary step was stored before the new start (a fresh user's finding
// G2: the new rollout halted at its first step, "changed by hand", on
// A's canary step, auto-reverted, and left the fleet mixed). The new
// start names A as the rollout it supersedes, so the controller takes
// A's step as no hand change: ace is given the new want again,
// expecting A's (step over), and the new rollout runs on.
func TestASupersededRolloutsStepIsNoConflict(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	for _, n := range []string{"ace", "bob"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	plan := func(build string) *feed.Plan {
		t.Helper()
		f, _, err := fleetfile.Parse(fmt.Appendf(nil, `fleet: web
nodes: {ace: {}, bob: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: %q}]}]
rollout: {canary: 1, auto_revert: true}
`, build))
		if err != nil {
			t.Fatal(err)
		}
		p, err := feed.NewPlan(ctx, feed.WithLeaderWants(stream, js), subj, f, "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, err := plan("web:2").Apply(ctx, js, subj)
	if err != nil {
		t.Fatal(err)
	}
	bob := plan("web:3") // read while rollout a runs, before its step
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rollouts.RunFleet(cctx, js, rollouts.Config{Stream: cfg}, "web") }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("RunFleet: %v", err)
		}
	}()
	step := rollout.WantID("web", a, "ace", rollout.StepForward)
	waitfor.Until(t, 20*time.Second, "rollout a's canary step "+step, func() bool {
		m, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
		return err == nil && m.MsgID == step
	})
	b, err := bob.Apply(ctx, js, subj)
	if err != nil {
		t.Fatalf("the apply read before rollout %d's step, which it supersedes: %v", a, err)
	}
	var ace *rollout.Node
	waitfor.Until(t, 20*time.Second, "ace's step in rollout b decided", func() bool {
		s, err := feed.Replay(ctx, js, cfg, nil, "web")
		if err != nil || s.Rollout == nil || s.Rollout.ID != b {
			return false
		}
		ace = s.Rollout.Nodes["ace"]
		return ace.Status == rollout.Changing || ace.Status == rollout.Conflict || ace.Status == rollout.Failed
	})
	if ace.Status != rollout.Changing || ace.Adopted == 0 || !ace.Again {
		t.Fatalf("ace in rollout %d: %s (%s), adopted #%d, again %v; want changing over rollout %d's step", b, ace.Status, ace.Why, ace.Adopted, ace.Again, a)
	}
	m, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
	if over := rollout.WantID("web", b, "ace", rollout.StepOver); err != nil || m.MsgID != over {
		t.Fatalf("ace's newest want: %q (%v); want rollout %d's step over, %s", m.MsgID, err, b, over)
	}
}
