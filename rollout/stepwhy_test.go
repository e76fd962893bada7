package rollout_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// Each step's want says why the rollout gives it (its WantEffect.Why, the
// header a node's timeline shows): the canary's batch and who applied
// it and why; a later batch's, who promoted the canary; a revert's, who
// reverted and the failure auto_revert answered, for a target given back
// at once and for one that waited for the budget. State.Pending says the
// same after a restart.
func TestStepWhy(t *testing.T) {
	cands := []rollout.Candidate{
		{Node: "ace", Prev: 1, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
		{Node: "bob", Prev: 2, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
	}
	zero := rollout.Duration(0)
	start, _ := rollout.NewStart("alice", "web 1.4", rollout.Params{Canary: rollout.Amount{N: 1}, MinHealthy: &zero, AutoRevert: true}, cands)
	s := rollout.NewState("web")
	seq := uint64(2)
	t0 := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	fold := func(in rollout.Input) []rollout.Effect {
		t.Helper()
		seq++
		in.Seq, in.Time = seq, t0.Add(time.Duration(seq)*time.Second)
		effs := s.Fold(in)
		if err := s.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		return effs
	}
	wantOf := func(effs []rollout.Effect) *rollout.WantEffect {
		t.Helper()
		for _, e := range effs {
			if e.Want != nil {
				return e.Want
			}
		}
		t.Fatalf("no want among %d effects", len(effs))
		return nil
	}
	// publish records a want published and its plan; it returns the plan.
	publish := func(w *rollout.WantEffect) uint64 {
		want := seq + 1
		fold(rollout.Input{Node: w.Node, Kind: rollout.KindWant})
		fold(rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: want}})
		fold(rollout.Input{Node: w.Node, Kind: rollout.KindPlan, Payload: &events.Plan{Cause: want, Want: want, Modules: []events.PlanModule{{Name: "web", Build: "b2"}}}})
		return seq
	}

	ace := wantOf(fold(rollout.Input{Kind: rollout.KindStart, Payload: start}))
	if want := "the canary, batch 1 of 2; applied by alice: web 1.4"; ace.Why != want {
		t.Errorf("canary's why %q, want %q", ace.Why, want)
	}
	if p := s.Pending(); len(p) != 1 || p[0].Want.Why != ace.Why {
		t.Errorf("pending after a restart: %+v, want the canary's why %q", p, ace.Why)
	}
	plan := publish(ace)
	fold(rollout.Input{Node: "ace", Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpApply, Plan: plan}})
	fold(rollout.Input{Node: "ace", Kind: rollout.KindHave, Payload: &rollout.Have{Modules: []rollout.HaveModule{{Name: "web", Build: "b2", State: events.Running}}}})
	if s.Rollout.Phase != rollout.WaitingPromote {
		t.Fatalf("phase %s, want waiting-promote", s.Rollout.Phase)
	}

	bob := wantOf(fold(rollout.Input{Kind: rollout.KindPromote, Payload: rollout.NewOperator(rollout.KindPromote, 0, "bea", "")}))
	if want := "batch 2 of 2; applied by alice: web 1.4; canary promoted by bea"; bob.Why != want {
		t.Errorf("batch 2's why %q, want %q", bob.Why, want)
	}
	plan = publish(bob)
	reverts := func(effs []rollout.Effect) []*rollout.WantEffect {
		t.Helper()
		var out []*rollout.WantEffect
		for _, e := range effs {
			if e.Want != nil {
				if e.Want.Step != rollout.StepRevert || !strings.HasPrefix(e.Want.Why, "revert by auto_revert: target bob failed: apply of plan") {
					t.Errorf("%s %s why %q", e.Want.Node, e.Want.Step, e.Want.Why)
				}
				out = append(out, e.Want)
			}
		}
		return out
	}
	// bob failed: given back at once; ace, done, waits for the budget
	// (max_unavailable 1, spent by bob) until bob's revert runs.
	back := reverts(fold(rollout.Input{Node: "bob", Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpFailed, Plan: plan, Module: "web", Error: "no such build"}}))
	if len(back) != 1 || back[0].Node != "bob" {
		t.Fatalf("reverts %+v, want bob's alone", back)
	}
	for _, p := range s.Pending() {
		if !strings.HasPrefix(p.Want.Why, "revert by auto_revert: target bob failed") {
			t.Errorf("pending revert of %s: why %q", p.Want.Node, p.Want.Why)
		}
	}
	plan = publish(back[0])
	fold(rollout.Input{Node: "bob", Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpApply, Plan: plan}})
	back = reverts(fold(rollout.Input{Node: "bob", Kind: rollout.KindHave, Payload: &rollout.Have{Modules: []rollout.HaveModule{{Name: "web", Build: "b2", State: events.Running}}}}))
	if len(back) != 1 || back[0].Node != "ace" {
		t.Fatalf("reverts %+v once bob's revert runs, want ace's", back)
	}
}

// ParseWantID reads back exactly the ids WantID makes.
func TestParseWantID(t *testing.T) {
	id := rollout.WantID("web", 93, "n37", rollout.StepRevert)
	fleet, r, node, step, ok := rollout.ParseWantID(id)
	if !ok || fleet != "web" || r != 93 || node != "n37" || step != rollout.StepRevert {
		t.Fatalf("ParseWantID(%q) = %q %d %q %q %v", id, fleet, r, node, step, ok)
	}
	for _, bad := range []string{"", "web.record.3.0", "web.rollout.0.n37.forward", "web.rollout.9.n37.sideways",
		"web.rollout.9.n37.forward.x", "Web.rollout.9.n37.forward", "web.rollout.x.n37.forward", "ace-1700000000-want"} {
		if _, _, _, _, ok := rollout.ParseWantID(bad); ok {
			t.Errorf("ParseWantID(%q) ok", bad)
		}
	}
}
