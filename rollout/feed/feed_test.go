package feed_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The delivery view's builds count every node of the fleet by its newest
// have, not only the nodes that reported since the rollout began: after a
// canary was reverted, the old build runs on all three nodes, the two
// the rollout never changed included.
func TestReplayCountsEveryNodesBuild(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	appendEv := func(node string, p events.Payload) uint64 {
		t.Helper()
		ack, err := pub.Append(ctx, node, events.Stamp(p, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	running := func(build string) *events.Have {
		return &events.Have{Modules: []events.HaveModule{{Name: "web", Build: build, State: events.Running}}}
	}
	for _, n := range []string{"ace", "bob", "cat"} {
		appendEv(n, &events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}})
		appendEv(n, running("web:1"))
	}
	f, _, err := fleetfile.Parse([]byte(`fleet: web
nodes: {ace: {}, bob: {}, cat: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "web:2"}]}]
rollout: {canary: 1, auto_revert: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := feed.NewPlan(ctx, stream, subj, f, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	id, err := plan.Apply(ctx, js, subj)
	if err != nil {
		t.Fatal(err)
	}
	// The canary ran the new build, then its previous one again.
	appendEv("ace", running("web:2"))
	appendEv("ace", running("web:1"))

	s, err := feed.Replay(ctx, js, cfg, nil, "web")
	if err != nil {
		t.Fatal(err)
	}
	if s.Rollout == nil || s.Rollout.ID != id {
		t.Fatalf("replayed %+v, want rollout %d", s.Rollout, id)
	}
	v := s.View()
	if len(v.Builds) != 1 || !reflect.DeepEqual(v.Builds[0], rollout.BuildCount{Module: "web", Build: "web:1", Nodes: 3}) {
		t.Fatalf("builds %+v, want web@web:1 on 3 nodes", v.Builds)
	}
	// A target not changed yet shows what it runs.
	for _, tv := range v.Targets {
		if len(tv.Running) != 1 || tv.Running[0].Build != "web:1" {
			t.Errorf("target %s runs %+v, want web:1", tv.Node, tv.Running)
		}
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
