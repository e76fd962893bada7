package feed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// An apply over a rollout still going on carries, for each target whose
// newest want is that rollout's unfinished step, the want before it as
// the revert base (a fresh user's finding: the revert gave back the
// unfinished rollout's want); over a rollout that ended, none.
func TestApplyOverAnUnfinishedRollout(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	want := func(node, build string) uint64 {
		t.Helper()
		ack, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: build}}}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	fleet := func(build string) *fleetfile.Fleet {
		t.Helper()
		f, _, err := fleetfile.Parse([]byte(`fleet: web
nodes: {bob: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "` + build + `"}]}]
rollout: {batch: 1, max_unavailable: 1}
`))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	apply := func(build string) (uint64, *feed.Plan) {
		t.Helper()
		plan, err := feed.NewPlan(ctx, stream, subj, fleet(build), "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		prior, err := feed.Active(ctx, js, cfg, "web")
		if err != nil {
			t.Fatal(err)
		}
		plan.Over(prior)
		id, err := plan.Apply(ctx, js, subj)
		if err != nil {
			t.Fatal(err)
		}
		return id, plan
	}
	first := want("bob", "web:1")
	id, _ := apply("web:2")
	// The controller's step: bob's want of rollout id, recorded published;
	// bob never plans it.
	step := want("bob", "web:2")
	if _, err := feed.Publish(ctx, js, subj, "web", rollout.KindPublished, &rollout.Published{Rollout: id, Node: "bob", Step: rollout.StepForward, Want: step}, ""); err != nil {
		t.Fatal(err)
	}
	_, plan := apply("web:3")
	// The first rollout's start carries bob's want before it (#first),
	// and the new start carries it on: a revert gives it back whether or
	// not the stream still holds it.
	old := []events.WantModule{{Name: "web", Build: "web:1"}}
	if n := plan.Start.Nodes[0]; n.Prev != step || n.Back != 0 || n.HadSeq != first || n.Had == 0 || !rollout.EqualWant(plan.Start.Wants[n.Had-1], old) {
		t.Fatalf("start over the unfinished rollout: bob prev #%d back #%d had %d (#%d), want prev #%d and want #%d (web:1) carried", n.Prev, n.Back, n.Had, n.HadSeq, step, first)
	}
	s, err := feed.Replay(ctx, js, cfg, nil, "web")
	if err != nil {
		t.Fatal(err)
	}
	// The fold stepped bob (its want not recorded yet): a revert would
	// wait for it and give back its want from before the first rollout.
	if got := s.GivesBack(); len(got) != 1 || got[0].Name != "bob" || got[0].RevertTo() != 0 || got[0].HadSeq != first {
		t.Fatalf("a revert gives back %+v, want bob's #%d", got, first)
	}
	// The controller says the newest rollout ended: no replay, no base.
	if _, err := feed.Publish(ctx, js, subj, "web", rollout.KindRecord, &rollout.Record{Rollout: s.Rollout.ID, Cause: s.Seq, What: string(rollout.Aborted), Level: events.LevelWarn, Msg: "aborted"}, ""); err != nil {
		t.Fatal(err)
	}
	if prior, err := feed.Active(ctx, js, cfg, "web"); err != nil || prior != nil {
		t.Errorf("Active after the rollout's end: %v, %v; want nil", prior, err)
	}
}

// Two applies of one fleet read at once: the first to publish starts
// its rollout; the other, whose plan diffed against wants the first may
// now be changing, is refused with nothing published
// (feed.ErrStartedMeanwhile), and a plan read again starts over it (a
// fresh user's finding G2: both said "started"; the second halted on a
// "changed by hand" conflict that was the first's canary, auto-reverted,
// and the fleet was left mixed). Over an existing rollout too.
func TestApplyReadBeforeAnotherStartIsRefused(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	if _, err := pub.Append(ctx, "bob", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	plan := func(build string) *feed.Plan {
		t.Helper()
		f, _, err := fleetfile.Parse([]byte(`fleet: web
nodes: {bob: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "` + build + `"}]}]
rollout: {batch: 1, max_unavailable: 1}
`))
		if err != nil {
			t.Fatal(err)
		}
		p, err := feed.NewPlan(ctx, stream, subj, f, "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for round := range 2 { // the fleet without a rollout, then with one
		alice, bob := plan("web:2"), plan("web:3")
		id, err := alice.Apply(ctx, js, subj)
		if err != nil {
			t.Fatalf("round %d: the first apply: %v", round, err)
		}
		_, err = bob.Apply(ctx, js, subj)
		if !errors.Is(err, feed.ErrStartedMeanwhile) {
			t.Fatalf("round %d: the apply read before rollout %d started: %v, want feed.ErrStartedMeanwhile", round, id, err)
		}
		t.Logf("round %d: %v", round, err)
		if newest, err := feed.NewestStart(ctx, stream, subj, "web"); err != nil || newest != id {
			t.Fatalf("round %d: newest start #%d (%v), want the first apply's #%d: the refused one published nothing", round, newest, err, id)
		}
		again, err := plan("web:3").Apply(ctx, js, subj)
		if err != nil || again <= id {
			t.Fatalf("round %d: the apply read again: rollout %d, %v; want one started over rollout %d", round, again, err, id)
		}
	}
}
