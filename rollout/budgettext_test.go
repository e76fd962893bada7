package rollout_test

import (
	"testing"

	"github.com/meshfold/meshfold/rollout"
)

// TestViewBudget: the budget as status and the console print it counts
// what a step's budget counts and says what it leaves out, in the words
// of the phase (fresh7's finding G1: "6 of max_unavailable 3" read as a
// budget overspent while it was 2 of 3).
func TestViewBudget(t *testing.T) {
	v := rollout.View{Phase: rollout.Running, Nodes: 20, Unavailable: 6, AwaitTurn: 4, Params: rollout.ViewParams{MaxUnavailable: 3},
		Counts: map[rollout.Status]int{rollout.Pending: 14}}
	for _, c := range []struct {
		phase rollout.Phase
		await int
		want  string
	}{
		{rollout.Running, 0, "6 of max_unavailable 3 unavailable (20 nodes; over by 3; a step to an available target waits until fewer than 3 are unavailable)"},
		{rollout.Running, 4, "2 of max_unavailable 3 unavailable (20 nodes; not counted: 4 targets unhealthy already, 6 unavailable in all, that take their want in their batch's turn whatever the budget)"},
		{rollout.Reverting, 1, "5 of max_unavailable 3 unavailable (20 nodes; not counted: 1 target unhealthy already, 6 unavailable in all, that the rollout never changed; over by 2; the revert of an available target waits until fewer than 3 are unavailable)"},
	} {
		v.Phase, v.AwaitTurn = c.phase, c.await
		if got := v.Budget(); got != c.want {
			t.Errorf("%s, %d not counted: Budget() =\n%s\nwant\n%s", c.phase, c.await, got, c.want)
		}
	}
}

// TestViewBudgetOver: a count past max_unavailable says by how much,
// what carried it there (targets given their new want while unhealthy,
// which a step is whatever the budget) and what still waits for it, in
// every phase (a fresh user's finding m1: "budget: 3 of max_unavailable
// 2 unavailable (10 nodes)" in a fixing rollout's last batch, the "not
// counted" note gone, read as a budget broken).
func TestViewBudgetOver(t *testing.T) {
	for _, c := range []struct {
		name string
		v    rollout.View
		want string
	}{
		{"the fix's last batch", rollout.View{Phase: rollout.Running, Nodes: 10, Unavailable: 3, ChangedUnhealthy: 3,
			Counts: map[rollout.Status]int{rollout.Changing: 3, rollout.Done: 7}, Params: rollout.ViewParams{MaxUnavailable: 2}},
			"3 of max_unavailable 2 unavailable (10 nodes; over by 1: 3 of them are targets given their new want while unhealthy, as a step to a target unhealthy already is whatever the budget; no step of the rollout waits for it)"},
		{"one such target, available ones pending", rollout.View{Phase: rollout.Running, Nodes: 10, Unavailable: 3, ChangedUnhealthy: 1,
			Counts: map[rollout.Status]int{rollout.Changing: 2, rollout.Pending: 4}, Params: rollout.ViewParams{MaxUnavailable: 2}},
			"3 of max_unavailable 2 unavailable (10 nodes; over by 1: 1 of them is a target given its new want while unhealthy, as a step to a target unhealthy already is whatever the budget; a step to an available target waits until fewer than 2 are unavailable)"},
		{"agents down, with targets left out", rollout.View{Phase: rollout.WaitingPromote, Nodes: 20, Unavailable: 6, AwaitTurn: 2,
			Counts: map[rollout.Status]int{rollout.Pending: 18}, Params: rollout.ViewParams{MaxUnavailable: 3}},
			"4 of max_unavailable 3 unavailable (20 nodes; not counted: 2 targets unhealthy already, 6 unavailable in all, that take their want in their batch's turn whatever the budget; over by 1; a step to an available target waits until fewer than 3 are unavailable)"},
		{"a revert", rollout.View{Phase: rollout.Reverting, Nodes: 10, Unavailable: 4, Params: rollout.ViewParams{MaxUnavailable: 2}},
			"4 of max_unavailable 2 unavailable (10 nodes; over by 2; the revert of an available target waits until fewer than 2 are unavailable)"},
		{"completed", rollout.View{Phase: rollout.Completed, Nodes: 10, Unavailable: 3, Params: rollout.ViewParams{MaxUnavailable: 2}},
			"3 of max_unavailable 2 unavailable (10 nodes; over by 1; no step of the rollout waits for it)"},
		{"at the budget", rollout.View{Phase: rollout.Running, Nodes: 10, Unavailable: 2, ChangedUnhealthy: 2, Params: rollout.ViewParams{MaxUnavailable: 2}},
			"2 of max_unavailable 2 unavailable (10 nodes)"},
	} {
		if got := c.v.Budget(); got != c.want {
			t.Errorf("%s: Budget() =\n%s\nwant\n%s", c.name, got, c.want)
		}
	}
}
