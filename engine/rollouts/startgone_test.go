package rollouts

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A controller woken after its rollout's start aged out of the stream
// (--max-age shorter than the rollout: the rollout idle, ended, then a
// verb) cannot refold the rollout: it failed, and was started again,
// every second, a WARN line each time, for as long as the stream held no
// start of the fleet. Now it says once that the start is gone and waits
// for the fleet's next start, which it carries out. The stream's
// dropping is a purge, what --max-age does, at a moment the test
// chooses.
func TestControllerWaitsForTheNextStartOnceItsStartAgedOut(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{MaxAge: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
		f, _, err := fleetfile.Parse(fmt.Appendf(nil, "fleet: web\nnodes: {ace: {}, bob: {}}\ngroups: [{name: all, select: {}, modules: [{name: web, build: %q}]}]\nrollout: {canary: 1}\n", build))
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
	waitWant := func(node string, id uint64) {
		t.Helper()
		msgID := rollout.WantID("web", id, node, rollout.StepForward)
		waitfor.Until(t, 30*time.Second, node+"'s want "+msgID, func() bool {
			m, err := store.LastMsg(ctx, stream, subj, node, events.KindWant)
			return err == nil && m.MsgID == msgID
		})
	}
	logged := &said{}
	id := apply("web:2")
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(cctx, js, Config{Stream: cfg, Logger: slog.New(logged)}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitWant("ace", id)
	verb(rollout.KindAbort, id)
	waitfor.Until(t, 30*time.Second, "the controller idle", func() bool { return logged.count("rollout controller idle") > 0 })

	// Everything up to a later event ages out, the start with it; then
	// a verb wakes the controller.
	later, err := pub.Append(ctx, "ace", events.Stamp(&events.Have{Modules: []events.HaveModule{{Name: "web", Build: "web:2", State: events.Running}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(later.Seq)); err != nil {
		t.Fatal(err)
	}
	verb(rollout.KindRevert, id)
	gone := "the fleet's rollout start is gone from the stream"
	waitfor.Until(t, 30*time.Second, "the controller saying the start is gone", func() bool { return logged.count(gone) > 0 })

	// The next apply is carried out.
	id2 := apply("web:3")
	waitWant("ace", id2)
	if n, again := logged.count(gone), logged.count("starting again"); n != 1 || again != 0 {
		t.Fatalf("said the start is gone %d times, started again %d times; want once, and never; logged %q", n, again, logged.all())
	}
}
