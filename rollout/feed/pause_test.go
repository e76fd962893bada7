package feed_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A node paused before apply is paused in the start (a pause resumed
// since is not), and its resume after the start reaches the fold: the
// rollout holds it, then watches it again.
func TestPauseReachesTheFold(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	appendEv := func(node string, p events.Payload) {
		t.Helper()
		if _, err := pub.Append(ctx, node, events.Stamp(p, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"bob", "eve"} {
		appendEv(n, &events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}})
	}
	appendEv("eve", &events.Pause{By: "you", Reason: "disk swap"})
	appendEv("bob", &events.Pause{By: "you"})
	appendEv("bob", &events.Resume{By: "you"})
	f, _, err := fleetfile.Parse([]byte(`fleet: web
nodes: {bob: {}, eve: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "web:2"}]}]
rollout: {batch: 2, max_unavailable: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := feed.NewPlan(ctx, stream, subj, f, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range plan.Start.Nodes {
		want := ""
		if n.Node == "eve" {
			want = "you"
		}
		if n.PausedBy != want || (want != "" && n.PausedReason != "disk swap") {
			t.Errorf("start node %s paused by %q (%q), want %q", n.Node, n.PausedBy, n.PausedReason, want)
		}
	}
	if _, err := plan.Apply(ctx, js, subj); err != nil {
		t.Fatal(err)
	}
	s, err := feed.Replay(ctx, js, cfg, nil, "web")
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Rollout.Nodes["eve"].Paused; p == nil || p.By != "you" || p.Reason != "disk swap" {
		t.Fatalf("eve paused %+v, want by you: disk swap", p)
	}
	lines, _ := s.Why("eve")
	if last := lines[len(lines)-1]; last != "paused by you since "+s.Rollout.Nodes["eve"].Paused.Time.Format(time.RFC3339)+": disk swap" {
		t.Errorf("why eve: %q", lines)
	}
	appendEv("eve", &events.Resume{By: "you"})
	if s, err = feed.Replay(ctx, js, cfg, nil, "web"); err != nil {
		t.Fatal(err)
	}
	if p := s.Rollout.Nodes["eve"].Paused; p != nil {
		t.Fatalf("eve still paused after its resume: %+v", p)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// A node whose agent was down before apply is down since its agent's
// down event, in the start and in the fold (a fresh user's finding:
// `rollout why` said it was down since the rollout's start).
func TestDownBeforeApplyKeepsItsTime(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	for _, n := range []string{"bob", "dan"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := pub.Append(ctx, "dan", events.Stamp(&events.Agent{State: events.AgentDown, Claim: "c1", Why: events.WhyExpired}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetMsg(ctx, ack.Seq)
	if err != nil {
		t.Fatal(err)
	}
	downAt := raw.Time
	f, _, err := fleetfile.Parse([]byte(`fleet: web
nodes: {bob: {}, dan: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "web:2"}]}]
rollout: {batch: 1, max_unavailable: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := feed.NewPlan(ctx, stream, subj, f, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Apply(ctx, js, subj); err != nil {
		t.Fatal(err)
	}
	s, err := feed.Replay(ctx, js, cfg, nil, "web")
	if err != nil {
		t.Fatal(err)
	}
	dan := s.Rollout.Nodes["dan"]
	if !dan.Down || !dan.DownSince.Equal(downAt) {
		t.Fatalf("dan down %v since %s, want since its down event at %s (the start was at %s)", dan.Down, dan.DownSince, downAt, s.Rollout.Time)
	}
	lines, _ := s.Why("dan")
	if last := lines[len(lines)-1]; last != "agent down since "+downAt.Format(time.RFC3339) {
		t.Errorf("why dan: %q", lines)
	}
}
