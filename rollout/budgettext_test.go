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
	v := rollout.View{Phase: rollout.Running, Nodes: 20, Unavailable: 6, AwaitTurn: 4, Params: rollout.ViewParams{MaxUnavailable: 3}}
	for _, c := range []struct {
		phase rollout.Phase
		await int
		want  string
	}{
		{rollout.Running, 0, "6 of max_unavailable 3 unavailable (20 nodes)"},
		{rollout.Running, 4, "2 of max_unavailable 3 unavailable (20 nodes; not counted: 4 targets unhealthy already, 6 unavailable in all, that take their want in their batch's turn whatever the budget)"},
		{rollout.Reverting, 1, "5 of max_unavailable 3 unavailable (20 nodes; not counted: 1 target unhealthy already, 6 unavailable in all, that the rollout never changed)"},
	} {
		v.Phase, v.AwaitTurn = c.phase, c.await
		if got := v.Budget(); got != c.want {
			t.Errorf("%s, %d not counted: Budget() =\n%s\nwant\n%s", c.phase, c.await, got, c.want)
		}
	}
}
