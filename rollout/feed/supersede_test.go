package feed_test

import (
	"context"
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
