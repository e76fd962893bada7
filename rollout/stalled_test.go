package rollout_test

import (
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
