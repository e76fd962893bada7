package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
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
	t.Parallel()
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

// A rollout in progress when serve restarts with a new signing key and
// no retired key kept (docs/architecture.md "A rollout in progress when
// the key changes"). Serve with key A: the canary ace done and promoted,
// bob given its want and done, cat given its want (its agent answers
// nothing). Serve again with key B: its controller cannot verify the
// plans signed with A, so it pauses the rollout on ace's, says why, and
// publishes no want: without the rule its refold found bob's want, its
// own step, a conflict, halted, and auto_revert published ace's revert.
// Then the fix its record names: serve again with key B and A put back
// as retired (what `auth rotate-reconciler` leaves), and an operator's
// resume: the rollout runs to its end, every target done, no revert
// published (rollout/testdata/unverified_key.txt is the same in the
// fold).
func TestRestartWithNewKeyDuringRollout(t *testing.T) {
	t.Parallel()
	e, _, js := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
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
	keyA, keyB := signer(), signer()
	first := startServe(t, e, engine.Config{Signer: keyA})
	cfg := first.waitReady(t).Stream()
	subj := cfg.Subjects()
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	// Stand-in agents: each plan settled and its modules running; cat's
	// agent answers nothing while the first serve runs.
	answerFrom := func(start uint64, skip func(string) bool) (stop func()) {
		actx, cancel := context.WithCancel(ctx)
		answered := make(chan error, 1)
		go func() { answered <- rolloutstest.Answer(actx, js, cfg, start, skip) }()
		return func() {
			cancel()
			if err := <-answered; err != nil {
				t.Errorf("stand-in agents: %v", err)
			}
		}
	}
	answer := func(skip func(string) bool) (stop func()) { return answerFrom(0, skip) }
	stopAgents := answer(func(node string) bool { return node == "cat" })
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
	replay := func() *rollout.State {
		s, err := feed.Replay(ctx, js, cfg, nil, "web")
		if err != nil || s.Rollout == nil {
			return nil
		}
		return s
	}
	waitfor.Until(t, time.Minute, "the canary waiting for a promote", func() bool {
		s := replay()
		return s != nil && s.Rollout.Phase == rollout.WaitingPromote
	})
	verb := func(k rollout.Kind) {
		t.Helper()
		if _, err := feed.Publish(ctx, js, subj, "web", k, rollout.NewOperator(k, id, "alice", ""), ""); err != nil {
			t.Fatal(err)
		}
	}
	verb(rollout.KindPromote)
	waitfor.Until(t, time.Minute, "bob done and cat given its want", func() bool {
		s := replay()
		return s != nil && s.Rollout.Nodes["bob"].Status == rollout.Done && s.Rollout.Nodes["cat"].Status == rollout.Changing
	})
	first.cancel()
	if err := first.wait(t); err != nil {
		t.Fatalf("the first serve: %v", err)
	}
	stopAgents()
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

	// serve again with a new key and no retired one; every agent
	// answers now.
	defer answer(nil)()
	logs := newLogRecords()
	second := startServe(t, e, engine.Config{Signer: keyB, Logger: slog.New(logs)})
	second.waitReady(t)
	defer func() {
		if t.Failed() {
			logs.mu.Lock()
			defer logs.mu.Unlock()
			for _, r := range *logs.recs {
				if r.Level >= slog.LevelInfo {
					var b strings.Builder
					r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
					t.Logf("second serve: %s %s%s", r.Level, r.Message, b.String())
				}
			}
		}
	}()
	live := func() (pending int64, ok bool) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, r := range *logs.recs {
			if r.Message != "rollout controller live" {
				continue
			}
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "pending" {
					pending, ok = a.Value.Int64(), true
				}
				return true
			})
		}
		return pending, ok
	}
	if n := waitfor.Value(t, time.Minute, "the restarted controller live", live); n != 0 {
		t.Errorf("the restarted controller went live with %d wants pending, want none", n)
	}
	// rollout status (which verifies no plan) says it, from the record.
	s := waitfor.Value(t, time.Minute, "rollout status paused", func() (*rollout.State, bool) {
		s := replay()
		return s, s != nil && s.Rollout.Unverified != nil
	})
	if s.Rollout.Phase != rollout.Running || s.Rollout.Unverified.Node != "ace" {
		t.Errorf("rollout status after the restart: %s, paused on %s's plan; want running, paused on ace's", s.Rollout.Phase, s.Rollout.Unverified.Node)
	}
	if why := s.Rollout.Unverified.Reason; !strings.Contains(why, "untrusted key") {
		t.Errorf("the pause's reason %q does not name the key", why)
	}
	if after := wants(); after != before {
		t.Errorf("the restart with a new key published a want:\nbefore %s\nafter  %s", before, after)
	}
	if t.Failed() {
		return
	}

	// The fix: serve again with key B and A retired (the old public key
	// back in reconciler-retired.pub), then resume. The controller
	// verifies every plan now, and is paused by the record until the
	// resume; then it judges the targets, and cat, given its want by
	// the first serve, completes the rollout.
	second.cancel()
	if err := second.wait(t); err != nil {
		t.Fatalf("the second serve: %v", err)
	}
	own, err := store.NewTrust(keyB.PublicKey())
	if err == nil {
		_, err = own.Retire(keyA.PublicKey(), time.Now().Add(time.Hour))
	}
	if err != nil {
		t.Fatal(err)
	}
	third := startServe(t, e, engine.Config{Signer: keyB, Own: own})
	third.waitReady(t)
	// cat's agent is back: it applies its newest plan, the first
	// serve's (signed with A, which the third serve's keys verify).
	defer answerFrom(1, func(node string) bool { return node != "cat" })()
	verb(rollout.KindResume)
	s = waitfor.Value(t, time.Minute, "the rollout completed after the resume", func() (*rollout.State, bool) {
		s := replay()
		return s, s != nil && s.Rollout.Phase.Final()
	})
	if s.Rollout.Phase != rollout.Completed {
		t.Errorf("after the resume the rollout is %s (%v), want completed", s.Rollout.Phase, s.Rollout.End)
	}
	for _, n := range nodes {
		if st := s.Rollout.Nodes[n].Status; st != rollout.Done || s.Rollout.Nodes[n].Back != nil {
			t.Errorf("after the resume %s is %s (%s), want done, not reverted", n, st, s.Rollout.Nodes[n].Why)
		}
	}
	for _, n := range nodes {
		m, err := store.LastMsg(ctx, stream, subj, n, events.KindWant)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(m.MsgID, "."+string(rollout.StepRevert)) {
			t.Errorf("%s's newest want #%d is a revert (%s)", n, m.Event.Seq, m.MsgID)
		}
	}
	third.cancel()
	if err := third.wait(t); err != nil {
		t.Fatalf("the third serve: %v", err)
	}
}
