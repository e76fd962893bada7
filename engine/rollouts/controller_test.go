package rollouts_test

import (
	"context"
	"fmt"
	"slices"
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

// A controller whose rollout ended (aborted: final, nothing pending)
// stops reading the stream's node events: its one consumer then follows
// only the fleet's rollout subjects, however many node events are
// stored. A verb wakes it (a revert gives the canary its previous want
// back), and so does a new apply.
func TestIdleControllerFollowsOnlyItsFleet(t *testing.T) {
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
	apply := func(build string) uint64 {
		t.Helper()
		f, _, err := fleetfile.Parse(fmt.Appendf(nil, `fleet: web
nodes: {ace: {}, bob: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: %q}]}]
rollout: {canary: 1}
`, build))
		if err != nil {
			t.Fatal(err)
		}
		plan, err := feed.NewPlan(ctx, feed.WithLeaderWants(stream, js), subj, f, "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		id, err := plan.Apply(ctx, js, subj)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	verb := func(k rollout.Kind, id uint64) {
		t.Helper()
		if _, err := feed.Publish(ctx, js, subj, "web", k, rollout.NewOperator(k, id, "alice", ""), ""); err != nil {
			t.Fatal(err)
		}
	}
	waitWant := func(node string, id uint64, step rollout.Step) {
		t.Helper()
		msgID := rollout.WantID("web", id, node, step)
		waitfor.Until(t, 20*time.Second, node+"'s want "+msgID, func() bool {
			m, err := store.LastMsg(ctx, stream, subj, node, events.KindWant)
			return err == nil && m.MsgID == msgID
		})
	}
	// filters lists the filter subjects of the stream's consumers.
	filters := func() [][]string {
		t.Helper()
		var out [][]string
		infos, err := storetest.Consumers(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		for _, info := range infos {
			fs := slices.Clone(info.Config.FilterSubjects)
			if info.Config.FilterSubject != "" {
				fs = append(fs, info.Config.FilterSubject)
			}
			out = append(out, fs)
		}
		return out
	}
	onlyFleet := fmt.Sprint([][]string{{subj.Rollout("web", ">")}}) // named operators' verbs too

	id := apply("web:2")
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rollouts.RunFleet(cctx, js, rollouts.Config{Stream: cfg}, "web") }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("RunFleet: %v", err)
		}
	}()
	waitWant("ace", id, rollout.StepForward)
	verb(rollout.KindAbort, id)
	waitfor.Until(t, 20*time.Second, "the idle controller following only web's rollout subjects", func() bool {
		return fmt.Sprint(filters()) == onlyFleet
	})
	// Node events stored meanwhile are read by no consumer.
	for i := range 200 {
		have := &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "web:2", State: events.Running, Restarts: i}}}
		if _, err := pub.Append(ctx, "ace", events.Stamp(have, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(filters()); got != onlyFleet {
		t.Fatalf("idle, the stream's consumers filter %s, want %s", got, onlyFleet)
	}

	// A verb wakes it: the canary gets its previous want back.
	verb(rollout.KindRevert, id)
	waitWant("ace", id, rollout.StepRevert)
	// A new apply too: its canary gets its new want.
	id2 := apply("web:3")
	waitWant("ace", id2, rollout.StepForward)
	if m, err := store.LastMsg(ctx, stream, subj, "bob", events.KindWant); err != nil || m.MsgID != "" {
		t.Errorf("bob, never past the canary, got a rollout's want: %+v %v", m.MsgID, err)
	}
}
