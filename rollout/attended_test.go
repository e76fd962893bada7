package rollout_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestUnattended: a rollout no controller acts on says so once a step it
// owes has waited UnattendedAfter with no controller fact as long (a
// fresh user's finding: RUNNING, and an operator waited for ever): its
// first want decided at the start and never published (no controller
// ever ran), then, published, a healthy_deadline no tick judged (the
// controller gone since its last outcome). A step not yet due long, a
// controller fact within UnattendedAfter, or nothing owed (a rollout
// waiting for its node's plan before any deadline, an idle one) says
// nothing.
func TestUnattended(t *testing.T) {
	cands := []rollout.Candidate{
		{Node: "ace", Prev: 1, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
	}
	deadline := rollout.Duration(time.Minute)
	start, _ := rollout.NewStart("alice", "", rollout.Params{HealthyDeadline: deadline}, cands)
	s := rollout.NewState("web")
	t0 := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	seq := uint64(2)
	fold := func(at time.Duration, in rollout.Input) {
		t.Helper()
		seq++
		in.Seq, in.Time = seq, t0.Add(at)
		s.Fold(in)
	}
	fold(0, rollout.Input{Kind: rollout.KindStart, Payload: start})
	if len(s.Pending()) != 1 {
		t.Fatalf("%d wants pending after the start, want 1", len(s.Pending()))
	}
	if u := s.Unattended(t0.Add(rollout.UnattendedAfter - time.Second)); u != nil {
		t.Fatalf("unattended %s after the start: %+v", rollout.UnattendedAfter-time.Second, u)
	}
	u := s.Unattended(t0.Add(rollout.UnattendedAfter))
	if u == nil || u.Last != nil || !u.Since.Equal(t0) || !strings.Contains(u.Owed, "ace's new want, decided at #3, is not published") {
		t.Fatalf("never published: %+v", u)
	}
	if txt := u.Text(t0.Add(time.Minute)); !strings.Contains(txt, "since it started at 2026-12-01T14:00:00Z (1m0s ago): no controller fact since") ||
		!strings.Contains(txt, "'meshfold serve' or 'meshfold reconcile'") {
		t.Errorf("text: %s", txt)
	}

	// Published at 1s: nothing owed until ace's healthy_deadline (1m).
	fold(time.Second, rollout.Input{Node: "ace", Kind: rollout.KindWant})
	fold(time.Second, rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: 3, Node: "ace", Step: rollout.StepForward, Want: 4}})
	if u := s.Unattended(t0.Add(time.Minute)); u != nil {
		t.Fatalf("unattended while ace's plan is awaited before its deadline: %+v", u)
	}
	u = s.Unattended(t0.Add(time.Second + time.Minute + rollout.UnattendedAfter))
	if u == nil || u.Last == nil || u.Last.Kind != rollout.KindPublished || u.Last.Seq != 5 || !strings.Contains(u.Owed, "ace's healthy_deadline ended at") {
		t.Fatalf("deadline never judged: %+v", u)
	}
	// A live controller ticks at the deadline: attended again.
	fold(time.Second+time.Minute, rollout.Input{Kind: rollout.KindTick, Payload: &rollout.Tick{Rollout: 3}})
	if u := s.Unattended(t0.Add(time.Second + time.Minute + rollout.UnattendedAfter - time.Second)); u != nil {
		t.Fatalf("unattended %s after a tick: %+v", rollout.UnattendedAfter-time.Second, u)
	}
	if v := s.View(); v.Controller == nil || v.Controller.Kind != rollout.KindTick || v.Controller.Seq != 6 {
		t.Errorf("view's controller fact %+v, want the tick at #6", v.Controller)
	}
	if !s.Idle() {
		return // halted: still judged, and owed its ticks
	}
	if u := s.Unattended(t0.Add(time.Hour)); u != nil {
		t.Errorf("an idle rollout (%s) owes nothing: %+v", s.Rollout.Phase, u)
	}
}
