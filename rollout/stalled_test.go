package rollout_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestStalledAtStart: a start whose budget is spent by a node already
// down, before any target is changed, says so as 'rollout status' does
// (a fresh user's finding U20: apply said nothing and nothing moved);
// the same start with a larger budget, or a down node that is the
// canary (which apply warns of apart), says nothing.
func TestStalledAtStart(t *testing.T) {
	old := []events.WantModule{{Name: "web", Build: "b1"}}
	want := []events.WantModule{{Name: "web", Build: "b2"}}
	cands := func(down string) []rollout.Candidate {
		var cs []rollout.Candidate
		for i, n := range []string{"bob", "cat", "dan", "eve"} {
			cs = append(cs, rollout.Candidate{Node: n, Want: want, Prev: uint64(i + 1), Current: old, Down: n == down, DownSince: base})
		}
		return cs
	}
	one := rollout.Params{Canary: rollout.Amount{N: 1}, MaxUnavailable: rollout.Amount{N: 1}}
	start, pages := rollout.NewStart("you", "", one, cands("dan"))
	got := rollout.Stalled("web", start, pages, base)
	exp := "1 target of batch 1 waits for the budget: 1 of max_unavailable 1 unavailable: dan (agent down); no step of the rollout is under way: it moves on when one of them is available again (or abort, or apply again with a larger max_unavailable)"
	if got != exp {
		t.Fatalf("Stalled =\n%s\nwant\n%s", got, exp)
	}
	two := one
	two.MaxUnavailable = rollout.Amount{N: 2}
	start, pages = rollout.NewStart("you", "", two, cands("dan"))
	if got := rollout.Stalled("web", start, pages, base); got != "" {
		t.Fatalf("Stalled with max_unavailable 2 = %q, want none", got)
	}
	start, pages = rollout.NewStart("you", "", one, cands("bob"))
	if got := rollout.Stalled("web", start, pages, base); got != "" {
		t.Fatalf("Stalled with the canary down = %q, want none", got)
	}
}

// TestStalledAtStartUnhealthyLater: the dry run of a fix over a fleet
// failing on its running build warns of no stall when the unhealthy
// targets sit in a later batch (a fresh user's finding G1 of fresh7: 20
// nodes on web v1, n08–n11 unhealthy, canary 2, batch 5,
// max_unavailable 3; apply warned "2 targets of batch 1 wait for the
// budget: 4 of max_unavailable 3 unavailable", and the rollout stalled
// there for good). The same fleet with 3 agents down does warn, naming
// them: a node away still counts, and the unhealthy ones are said not
// counted.
func TestStalledAtStartUnhealthyLater(t *testing.T) {
	old := []events.WantModule{{Name: "web", Build: "v1"}}
	want := []events.WantModule{{Name: "web", Build: "v3"}}
	cands := func(down ...string) []rollout.Candidate {
		var cs []rollout.Candidate
		for i := range 20 {
			n := fmt.Sprintf("n%02d", i+1)
			c := rollout.Candidate{Node: n, Want: want, Prev: uint64(i + 1), Current: old, Down: slices.Contains(down, n), DownSince: base}
			if i+1 >= 8 && i+1 <= 11 {
				c.Unhealthy = []string{"web"}
			}
			cs = append(cs, c)
		}
		return cs
	}
	p := rollout.Params{Canary: rollout.Amount{N: 2}, Batch: rollout.Amount{N: 5}, MaxUnavailable: rollout.Amount{N: 3}}
	start, pages := rollout.NewStart("platform", "web v3: the health fix", p, cands())
	if got := rollout.Stalled("web", start, pages, base); got != "" {
		t.Fatalf("Stalled = %q, want none: the unhealthy targets take their want in batch 3's turn", got)
	}
	start, pages = rollout.NewStart("platform", "web v3: the health fix", p, cands("n15", "n16", "n17"))
	exp := "2 targets of batch 1 wait for the budget: 3 of max_unavailable 3 unavailable: n15 (agent down), n16 (agent down), n17 (agent down); " +
		"not counted: 4 targets unhealthy already that take their want in their batch's turn whatever the budget: n08, n09, n10, n11; " +
		"no step of the rollout is under way: it moves on when one of them is available again (or abort, or apply again with a larger max_unavailable)"
	if got := rollout.Stalled("web", start, pages, base); got != exp {
		t.Fatalf("Stalled =\n%s\nwant\n%s", got, exp)
	}
}
