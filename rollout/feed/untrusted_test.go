package feed_test

import (
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
)

// Apply warns of the targets whose agent's up listed the keys it trusts
// without the key the reconciler signs its plans with now (the newest
// plan's signer): they would refuse their new plans (a fresh user's
// finding F1). An older agent's up lists none: no warning for it; nor
// for a node that is no target, nor in a deployment that signs nothing.
func TestUntrustedNote(t *testing.T) {
	oldKey, newKey := "NOLD"+strings.Repeat("A", 52), "NNEW"+strings.Repeat("B", 52)
	v1 := []events.WantModule{{Name: "web", Build: "b1"}}
	v2 := []events.WantModule{{Name: "web", Build: "b2"}}
	cand := func(node string, current []events.WantModule, trusts []string, signer string, seq uint64) rollout.Candidate {
		return rollout.Candidate{Node: node, Want: v2, Current: current, Prev: 1, Trusts: trusts, PlanSigner: signer, PlanSeq: seq}
	}
	p := &feed.Plan{Cands: []rollout.Candidate{
		cand("ace", v1, []string{newKey, oldKey}, newKey, 40), // trusts both
		cand("bob", v1, []string{oldKey}, oldKey, 12),         // the old key only: refuses
		cand("cat", v1, nil, oldKey, 13),                      // an older agent: unknown
		cand("dan", v2, []string{oldKey}, oldKey, 14),         // no target
		cand("eve", v1, []string{oldKey}, "", 0),              // no plan yet: refuses
	}}
	got := p.UntrustedNote()
	for _, want := range []string{"warning: bob, eve: their agents do not trust " + newKey, "#40 of ace", "they trust NOLDAAAA… only"} {
		if !strings.Contains(got, want) {
			t.Errorf("note %q does not say %q", got, want)
		}
	}
	for _, not := range []string{"cat", "dan"} {
		if strings.Contains(got, not) {
			t.Errorf("note %q names %s", got, not)
		}
	}
	p.Cands[1].Trusts, p.Cands[4].Trusts = nil, []string{newKey}
	if got := p.UntrustedNote(); got != "" {
		t.Errorf("every known agent trusts the key, the note says %q", got)
	}
	unsigned := &feed.Plan{Cands: []rollout.Candidate{cand("bob", v1, []string{oldKey}, "", 12)}}
	if got := unsigned.UntrustedNote(); got != "" {
		t.Errorf("no plan is signed, the note says %q", got)
	}
}
