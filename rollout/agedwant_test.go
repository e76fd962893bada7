package rollout_test

import (
	"errors"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestStartCarriesAgedWant: a node whose newest want aged out of the
// stream (Prev 0) and which the reconciler's state says had one (HadSeq,
// Had) is no new node (a fresh user's finding F0): it is a target only
// when its want changes, its files are not new, and the start carries
// the want it had, which a revert gives back.
func TestStartCarriesAgedWant(t *testing.T) {
	files := []events.File{{Path: "/run/app/token", Mode: "0600"}}
	old := []events.WantModule{{Name: "app", Build: "b1", Files: files}}
	want := []events.WantModule{{Name: "app", Build: "b2", Files: files}}
	cands := []rollout.Candidate{
		{Node: "ace", Want: want, Current: old, HadSeq: 457, Had: old},   // aged out, changes
		{Node: "bob", Want: want, Current: want, HadSeq: 458, Had: want}, // aged out, unchanged
		{Node: "cat", Want: want}, // new
	}
	if !cands[0].Target() || cands[1].Target() || !cands[2].Target() {
		t.Fatalf("targets: ace %v bob %v cat %v, want true false true", cands[0].Target(), cands[1].Target(), cands[2].Target())
	}
	if cands[0].New() || !cands[2].New() {
		t.Fatalf("New: ace %v cat %v, want false true", cands[0].New(), cands[2].New())
	}
	start, _ := rollout.NewStart("ops", "", rollout.Params{}, cands)
	if err := rollout.Stamp(start, base).Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	ace, cat := start.Nodes[0], start.Nodes[2]
	if ace.Had == 0 || ace.HadSeq != 457 || !rollout.EqualWant(start.Wants[ace.Had-1], old) || ace.RevertTo() != 0 {
		t.Fatalf("ace carries had %d (#%d), revert-to #%d; wants %v", ace.Had, ace.HadSeq, ace.RevertTo(), start.Wants)
	}
	if ace.NewFiles != 0 {
		t.Fatalf("ace's files are new to it: %v (its want before declared them)", start.NewFiles)
	}
	if cat.Had != 0 || cat.NewFiles == 0 {
		t.Fatalf("cat (new) had %d, new_files %d", cat.Had, cat.NewFiles)
	}
	start.Nodes[2].Had, start.Nodes[2].HadSeq = 1, 9
	start.Nodes[1].Had = 1 // not a target
	if err := start.Validate(); !errors.Is(err, rollout.ErrHad) {
		t.Fatalf("Validate of had on a non-target: %v, want ErrHad", err)
	}
}
