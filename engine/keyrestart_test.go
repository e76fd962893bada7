package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/rollouts/rolloutstest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A fresh user's finding U11: serve restarted with a new signing key (its
// seed moved away, no retired key kept) after a rollout completed. The
// new controller's own keys verify none of the plans signed before, so
// its refold left them out and decided otherwise (a revert of the
// canary), and published that. A recorded end is final: the restarted
// controller goes idle with the rollout completed and publishes no want.
func TestRestartWithNewKeyAfterCompletedRollout(t *testing.T) {
	e, _, js := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	signer := func() *store.Signer {
		kp, err := store.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.NewSigner(kp)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := startServe(t, e, engine.Config{Signer: signer()})
	cfg := first.waitReady(t).Stream()
	subj := cfg.Subjects()
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	// Stand-in agents: each plan settled and its modules running.
	actx, stopAgents := context.WithCancel(ctx)
	answered := make(chan error, 1)
	go func() { answered <- rolloutstest.Answer(actx, js, cfg, 0, nil) }()
	defer func() {
		stopAgents()
		if err := <-answered; err != nil {
			t.Errorf("stand-in agents: %v", err)
		}
	}()
	nodes := []string{"ace", "bob", "cat"}
	pub := store.NewPublisher(js, subj)
	for _, n := range nodes {
		if _, err := pub.Append(ctx, n, want("web:1")); err != nil {
			t.Fatal(err)
		}
	}
	f, _, err := fleetfile.Parse([]byte(`fleet: web
nodes: {ace: {}, bob: {}, cat: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "web:2"}]}]
rollout: {canary: 1, batch: 1, max_unavailable: 1, min_healthy: 1s, healthy_deadline: 1m, auto_revert: true}
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
	phase := func() rollout.Phase {
		s, err := feed.Replay(ctx, js, cfg, nil, "web")
		if err != nil || s.Rollout == nil {
			return ""
		}
		return s.Rollout.Phase
	}
	waitfor.Until(t, time.Minute, "the canary waiting for a promote", func() bool { return phase() == rollout.WaitingPromote })
	if _, err := feed.Publish(ctx, js, subj, "web", rollout.KindPromote, rollout.NewOperator(rollout.KindPromote, id, "alice", ""), ""); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "the rollout completed", func() bool { return phase() == rollout.Completed })
	first.cancel()
	if err := first.wait(t); err != nil {
		t.Fatalf("the first serve: %v", err)
	}
	wants := func() string {
		var s string
		for _, n := range nodes {
			m, err := store.LastMsg(ctx, stream, subj, n, events.KindWant)
			if err != nil {
				t.Fatal(err)
			}
			s += fmt.Sprintf("%s #%d %s; ", n, m.Event.Seq, m.MsgID)
		}
		return s
	}
	before := wants()

	// serve again with a new key and no retired one: its controller
	// refolds the rollout, goes live and then idle.
	logs := newLogRecords()
	second := startServe(t, e, engine.Config{Signer: signer(), Logger: slog.New(logs)})
	second.waitReady(t)
	idle := func() (phase string, ok bool) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, r := range *logs.recs {
			if r.Message != "rollout controller idle: following only the fleet's rollout events" {
				continue
			}
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "phase" {
					phase, ok = a.Value.String(), true
				}
				return true
			})
		}
		return phase, ok
	}
	got := waitfor.Value(t, time.Minute, "the restarted controller idle", idle)
	if got != string(rollout.Completed) {
		t.Errorf("the restarted controller went idle with rollout %d %s, want completed", id, got)
	}
	if after := wants(); after != before {
		t.Errorf("the restart with a new key published a want:\nbefore %s\nafter  %s", before, after)
	}
	if p := phase(); p != rollout.Completed {
		t.Errorf("rollout status says %s after the restart, want completed", p)
	}
}
