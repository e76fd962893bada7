package reconcile_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// journals returns the messages of the journal effects of the event at
// seq.
func (s *sim) journals(seq uint64) []string {
	var out []string
	for _, e := range s.effects[seq] {
		if j, ok := e.Payload.(*events.Journal); ok {
			out = append(out, j.Msg)
		}
	}
	return out
}

// A node's refusals beyond MaxOwed are journaled, not owed: the state
// stays bounded whatever the node sends.
func TestMaxOwed(t *testing.T) {
	s := newSim(t)
	s.add(want("prov", "/a"))
	var last uint64
	for i := range reconcile.MaxOwed + 3 {
		last = s.add(&events.Refusal{Module: "app", Path: fmt.Sprintf("/nowhere/%d", i), Reason: events.ReasonUndeclared, Writer: "prov"})
	}
	if len(s.state.Owed) != reconcile.MaxOwed {
		t.Fatalf("%d owed items, want %d", len(s.state.Owed), reconcile.MaxOwed)
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxOwed") {
		t.Fatalf("journal of the refusal over the bound: %q", j)
	}
	// A repeat of an owed item is still nothing new, not over the bound.
	rep := s.add(&events.Refusal{Module: "app", Path: "/nowhere/0", Reason: events.ReasonUndeclared, Writer: "prov"})
	if j := s.journals(rep); len(j) != 0 {
		t.Fatalf("a repeat was journaled: %q", j)
	}
}

// Approvals beyond MaxApprovals are journaled at error and not kept.
func TestMaxApprovals(t *testing.T) {
	s := newSim(t)
	var last uint64
	for i := range reconcile.MaxApprovals + 1 {
		last = s.add(&events.Approve{Module: "app", Build: fmt.Sprintf("b%d", i), By: "ops"})
	}
	if len(s.state.Approvals) != reconcile.MaxApprovals {
		t.Fatalf("%d approvals, want %d", len(s.state.Approvals), reconcile.MaxApprovals)
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxApprovals") {
		t.Fatalf("journal of the approval over the bound: %q", j)
	}
}

// Filled marks beyond MaxFilled replace the one of the oldest plan. The
// files are declared by unsettled plans, so the marks are not forgotten
// (docs/design.md §4, "Bounded state") and only the bound removes one.
func TestMaxFilled(t *testing.T) {
	s := newSim(t)
	s.add(want("prov", "/old"))
	first := s.plans[0]
	s.add(&events.Filled{Module: "app", Path: "/old", Plan: first, Digest: "d"})
	var files [2][]string
	for i := range reconcile.MaxFilled {
		files[i*2/reconcile.MaxFilled] = append(files[i*2/reconcile.MaxFilled], fmt.Sprintf("/f/%d", i))
	}
	s.add(want("prov", files[0]...))
	s.add(want("prov", files[1]...))
	newer := s.plans[2]
	for i := range reconcile.MaxFilled {
		s.add(&events.Filled{Module: "app", Path: fmt.Sprintf("/f/%d", i), Plan: newer, Digest: "d"})
	}
	if len(s.state.Filled) != reconcile.MaxFilled {
		t.Fatalf("%d filled marks, want %d", len(s.state.Filled), reconcile.MaxFilled)
	}
	for _, m := range s.state.Filled {
		if m.Path == "/old" {
			t.Fatal("the mark of the oldest plan was kept, a newer one dropped")
		}
	}
}

// Plans beyond MaxUnsettled drop the second oldest: the oldest (which
// the node may be applying) and the newest stay settleable.
func TestMaxUnsettled(t *testing.T) {
	s := newSim(t)
	for i := range reconcile.MaxUnsettled + 2 {
		s.add(want("prov", fmt.Sprintf("/f%d", i)))
	}
	if len(s.state.Unsettled) != reconcile.MaxUnsettled {
		t.Fatalf("%d unsettled plans, want %d", len(s.state.Unsettled), reconcile.MaxUnsettled)
	}
	if got, want := s.state.Unsettled[0].Seq, s.plans[0]; got != want {
		t.Fatalf("oldest unsettled plan %d, want %d", got, want)
	}
	if got, want := s.state.Unsettled[len(s.state.Unsettled)-1].Seq, s.plans[len(s.plans)-1]; got != want {
		t.Fatalf("newest unsettled plan %d, want %d", got, want)
	}
	// The oldest settles; then the newest.
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans[0]})
	if s.state.Settled == nil || s.state.Settled.Seq != s.plans[0] {
		t.Fatalf("the oldest plan did not settle")
	}
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans[len(s.plans)-1]})
	if s.state.Settled.Seq != s.plans[len(s.plans)-1] || len(s.state.Unsettled) != 0 {
		t.Fatalf("the newest plan did not settle: settled %d, %d unsettled", s.state.Settled.Seq, len(s.state.Unsettled))
	}
}
