package reconcile_test

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// TestLatePlansWarnNothing is issue 25's rule as a property: a reconciler
// that reads its plans back late (a burst of wants folded before any of
// their plans is read: its restart after wants were published while it
// was down), beside a node agent that applies the newest plan it has read
// and settles it some events later (node.Agent follows its plans in
// stream order and coalesces a backlog to the newest), never journals at
// warn or error, and the node converges: once the agent settles the last
// plan, nothing is unsettled. Bursts reach MaxDroppedPlans wants.
func TestLatePlansWarnNothing(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		var settled, picked uint64 // the agent's settled plan, and the one it applies (0: idle)
		newest := func() uint64 { p := s.plans(); return p[len(p)-1] }
		agent := func(finish bool) {
			if picked != 0 && finish {
				s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: picked})
				settled, picked = picked, 0
			}
			if picked == 0 && len(s.plans()) > 0 && newest() > settled {
				picked = newest()
			}
		}
		files := 0
		next := func() *events.Want { files++; return want("prov", fmt.Sprintf("/f%d", files)) }
		s.add(next())
		agent(false)
		agent(true)
		for round := range rapid.IntRange(1, 3).Draw(rt, "rounds") {
			s.HoldPlans = true
			for range rapid.IntRange(1, reconcile.MaxDroppedPlans).Draw(rt, fmt.Sprintf("wants %d", round)) {
				s.add(next())
			}
			for s.Held() > 0 {
				s.Release(1)
				agent(rapid.Bool().Draw(rt, "agent finishes"))
			}
			s.HoldPlans = false
			for picked != 0 || newest() > settled {
				agent(true)
			}
		}
		for _, ev := range s.Events {
			if j, ok := ev.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
				rt.Fatalf("#%d journaled at %s: %s", ev.Seq, j.Level, j.Msg)
			}
		}
		if st := s.state; st.Settled == nil || st.Settled.Seq != newest() || len(st.Unsettled) != 0 {
			rt.Fatalf("not converged: settled %v, %d unsettled, newest plan %d", st.Settled, len(st.Unsettled), newest())
		}
	})
}
