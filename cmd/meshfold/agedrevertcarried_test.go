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

// A revert of a target whose want before the rollout aged out of the
// stream during the rollout (--max-age shorter than the rollout: a canary
// waiting for its promote over a weekend) copied that want from the
// stream by its sequence, could not read it, and was refused ("the
// previous want #N could not be read"): the canary kept the new build.
// Now apply's start carries every target's want before the rollout, and
// the revert gives it back from the start. serve's reconciler and
// controller run against a stream with a max age; the age-out is the
// stream's purge of every event before the rollout's start (what
// --max-age does, at a moment the test chooses).
func TestRolloutRevertAfterThePreviousWantAgedOut(t *testing.T) {
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
rollout: {canary: 1, batch: 1, max_unavailable: 1, min_healthy: 0s, healthy_deadline: 1h}
`)
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--allow-missing-build"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	v := waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 2 && v.Targets[0].Published > 0 })
	id := v.Rollout

	// While the canary runs its new want, the wants before the rollout
	// age out.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetMsg(ctx, prev["ace"]); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("ace's want #%d still in the stream after the purge (%v)", prev["ace"], err)
	}
	if out, errs, code := m.cli(t, "rollout", "why", "web", "ace"); code != 0 || !strings.Contains(out, "which the rollout carries") {
		t.Errorf("rollout why web ace: code %d, want it to say the rollout carries want #%d\n%s%s", code, prev["ace"], out, errs)
	}

	if out, errs, code := m.cli(t, "rollout", "revert", "web", "--by", "alice", "--allow-missing-build"); code != 0 {
		t.Fatalf("revert: code %d\n%s%s", code, out, errs)
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
	revertID := rollout.WantID("web", id, "ace", rollout.StepRevert)
	var ace store.Msg
	waitfor.Until(t, 30*time.Second, "ace's revert: its want stored, or refused", func() bool {
		if _, ok := refused(); ok {
			return true
		}
		w, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
		ace = w
		return err == nil && w.MsgID == revertID
	})
	if r, ok := refused(); ok {
		t.Fatalf("ace's revert refused: %s; want its want #%d (aged out) given back from the start", r.Error, prev["ace"])
	}
	if w, ok := ace.Event.Payload.(*events.Want); !ok || !rollout.EqualWant(w.Modules, old) {
		t.Fatalf("ace's revert want #%d: %+v, want %v", ace.Event.Seq, ace.Event.Payload, old)
	}
	if _, err := store.LastMsg(ctx, stream, subj, "bob", events.KindWant); !errors.Is(err, store.ErrNoMessage) {
		t.Errorf("bob, never given its new want, got a want from the revert (%v)", err)
	}
}
