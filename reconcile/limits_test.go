package reconcile_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// journals returns the messages of the journal effects of the event at
// seq.
func (s *sim) journals(seq uint64) []string {
	var out []string
	for _, e := range s.Effects(seq) {
		if j, ok := e.Payload.(*events.Journal); ok {
			out = append(out, j.Msg)
		}
	}
	return out
}

// A refusal one more than MaxOwed would owe drops the oldest owed item,
// journaled at warn: the state stays bounded whatever the node sends, and
// the newest refusals are the ones owed (DESIGN.md §4, "Bounded by
// counts").
func TestMaxOwed(t *testing.T) {
	s := newSim(t)
	s.add(want("prov", "/a"))
	var last uint64
	n := reconcile.MaxOwed + 3
	for i := range n {
		last = s.add(&events.Refusal{Module: "app", Path: fmt.Sprintf("/nowhere/%d", i), Reason: events.ReasonUndeclared, Writer: "prov"})
	}
	if len(s.state.Owed) != reconcile.MaxOwed {
		t.Fatalf("%d owed items, want %d", len(s.state.Owed), reconcile.MaxOwed)
	}
	for _, it := range s.state.Owed {
		if it.Path == "/nowhere/0" || it.Path == "/nowhere/1" || it.Path == "/nowhere/2" {
			t.Fatalf("the oldest items were kept: %v", it)
		}
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxOwed") || !strings.Contains(j[0], `"/nowhere/2"`) {
		t.Fatalf("journal of the refusal over the cap: %q", j)
	}
	if l := s.levels(last); len(l) != 1 || l[0] != events.LevelWarn {
		t.Fatalf("journal levels %v, want warn", l)
	}
	// A repeat of an owed item is still nothing new, not over the cap.
	rep := s.add(&events.Refusal{Module: "app", Path: fmt.Sprintf("/nowhere/%d", n-1), Reason: events.ReasonUndeclared, Writer: "prov"})
	if j := s.journals(rep); len(j) != 0 {
		t.Fatalf("a repeat was journaled: %q", j)
	}
}

// levels returns the levels of the journal effects of the event at seq.
func (s *sim) levels(seq uint64) []events.Level {
	var out []events.Level
	for _, e := range s.Effects(seq) {
		if j, ok := e.Payload.(*events.Journal); ok {
			out = append(out, j.Level)
		}
	}
	return out
}

// One approval more than MaxApprovals drops the node's oldest approval,
// journaled at warn; an approval of a build the want asks for is dropped
// last.
func TestMaxApprovals(t *testing.T) {
	s := newSim(t)
	s.add(&events.Want{Modules: []events.WantModule{{Name: "m000", Build: "b", RequiresApproval: true}}})
	var last uint64
	for i := range reconcile.MaxApprovals + 1 {
		last = s.add(&events.Approve{Module: fmt.Sprintf("m%03d", i), Build: "b", By: "ops"})
	}
	if len(s.state.Approvals) != reconcile.MaxApprovals {
		t.Fatalf("%d approvals, want %d", len(s.state.Approvals), reconcile.MaxApprovals)
	}
	if a := s.state.Approvals[0]; a.Module != "m000" {
		t.Fatalf("the approval the want asks for was dropped: first kept %v", a)
	}
	if a := s.state.Approvals[1]; a.Module != "m002" {
		t.Fatalf("the oldest approval the want does not ask for was kept: second kept %v", a)
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxApprovals") || !strings.Contains(j[0], `"m001"`) {
		t.Fatalf("journal of the approval over the cap: %q", j)
	}
	if l := s.levels(last); len(l) != 1 || l[0] != events.LevelWarn {
		t.Fatalf("journal levels %v, want warn", l)
	}
}

// One approval of a module more than MaxModuleApprovals drops the
// module's oldest, journaled at warn; another module's are kept.
func TestMaxModuleApprovals(t *testing.T) {
	s := newSim(t)
	s.add(&events.Approve{Module: "db", Build: "d:1", By: "ops"})
	var last uint64
	for i := range reconcile.MaxModuleApprovals + 1 {
		last = s.add(&events.Approve{Module: "app", Build: fmt.Sprintf("a:%02d", i), By: "ops"})
	}
	if len(s.state.Approvals) != reconcile.MaxModuleApprovals+1 {
		t.Fatalf("%d approvals, want %d", len(s.state.Approvals), reconcile.MaxModuleApprovals+1)
	}
	if a := s.state.Approvals[0]; a.Build != "a:01" {
		t.Fatalf("the module's oldest approval was kept: %v", a)
	}
	if a := s.state.Approvals[len(s.state.Approvals)-1]; a.Module != "db" {
		t.Fatalf("another module's approval was dropped: last %v", a)
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxModuleApprovals") || !strings.Contains(j[0], `"a:00"`) {
		t.Fatalf("journal of the approval over the cap: %q", j)
	}
}

// Filled marks beyond MaxFilled replace the one of the oldest plan,
// journaled at info.
func TestMaxFilled(t *testing.T) {
	s := newSim(t)
	s.add(want("prov", "/old"))
	first := s.plans()[0]
	s.add(&events.Filled{Module: "app", Path: "/old", Plan: first, Digest: "d"})
	var files [2][]string
	for i := range reconcile.MaxFilled {
		files[i*2/reconcile.MaxFilled] = append(files[i*2/reconcile.MaxFilled], fmt.Sprintf("/f/%d", i))
	}
	s.add(want("prov", files[0]...))
	s.add(want("prov", files[1]...))
	newer := s.plans()[2]
	var last uint64
	for i := range reconcile.MaxFilled {
		last = s.add(&events.Filled{Module: "app", Path: fmt.Sprintf("/f/%d", i), Plan: newer, Digest: "d"})
	}
	if len(s.state.Filled) != reconcile.MaxFilled {
		t.Fatalf("%d filled marks, want %d", len(s.state.Filled), reconcile.MaxFilled)
	}
	for _, m := range s.state.Filled {
		if m.Path == "/old" {
			t.Fatal("the mark of the oldest plan was kept, a newer one dropped")
		}
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxFilled") || !strings.Contains(j[0], `"/old"`) {
		t.Fatalf("journal of the mark over the cap: %q", j)
	}
	if l := s.levels(last); len(l) != 1 || l[0] != events.LevelInfo {
		t.Fatalf("journal levels %v, want info", l)
	}
}

// Accepting records beyond MaxAccepting replace those of the oldest plan,
// journaled once per settle at info; the settled plan's own are kept.
func TestMaxAccepting(t *testing.T) {
	s := newSim(t)
	var old, newer []string
	for i := range reconcile.MaxAccepting {
		old = append(old, fmt.Sprintf("/old/%d", i))
	}
	for i := range 3 {
		newer = append(newer, fmt.Sprintf("/new/%d", i))
	}
	s.add(want("prov", old[:len(old)/2]...))
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[0]})
	s.add(want("prov", old[len(old)/2:]...))
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[1]})
	if len(s.state.Accepting) != reconcile.MaxAccepting {
		t.Fatalf("%d accepting records, want %d", len(s.state.Accepting), reconcile.MaxAccepting)
	}
	s.add(want("prov", newer...))
	last := s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[2]})
	if len(s.state.Accepting) != reconcile.MaxAccepting {
		t.Fatalf("%d accepting records, want %d", len(s.state.Accepting), reconcile.MaxAccepting)
	}
	byPlan := map[uint64]int{}
	for _, a := range s.state.Accepting {
		byPlan[a.Plan]++
	}
	if byPlan[s.plans()[2]] != 3 || byPlan[s.plans()[0]] != len(old)/2-3 {
		t.Fatalf("records by plan %v: want 3 of the newest, 3 fewer of the oldest", byPlan)
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "3 accepting records dropped") || !strings.Contains(j[0], "reconcile.MaxAccepting") {
		t.Fatalf("journal of the records over the cap: %q", j)
	}
	if l := s.levels(last); len(l) != 1 || l[0] != events.LevelInfo {
		t.Fatalf("journal levels %v, want info", l)
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
	if got, want := s.state.Unsettled[0].Seq, s.plans()[0]; got != want {
		t.Fatalf("oldest unsettled plan %d, want %d", got, want)
	}
	if got, want := s.state.Unsettled[len(s.state.Unsettled)-1].Seq, s.plans()[len(s.plans())-1]; got != want {
		t.Fatalf("newest unsettled plan %d, want %d", got, want)
	}
	// The oldest settles; then the newest.
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[0]})
	if s.state.Settled == nil || s.state.Settled.Seq != s.plans()[0] {
		t.Fatalf("the oldest plan did not settle")
	}
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[len(s.plans())-1]})
	if s.state.Settled.Seq != s.plans()[len(s.plans())-1] || len(s.state.Unsettled) != 0 {
		t.Fatalf("the newest plan did not settle: settled %d, %d unsettled", s.state.Settled.Seq, len(s.state.Unsettled))
	}
}

// One waive more than MaxWaivers drops the oldest waiver, journaled at
// warn: a late refusal of that file judged by a plan it covered is owed
// again, the others still owe nothing. Waiving a file waived already
// drops nothing.
func TestMaxWaivers(t *testing.T) {
	s := newSim(t)
	s.add(want("prov", "/a"))
	plan := s.plans()[0]
	var last uint64
	for i := range reconcile.MaxWaivers + 1 {
		last = s.add(&events.Waive{Module: "app", Path: fmt.Sprintf("/w/%d", i), By: "ops"})
	}
	if len(s.state.Waivers) != reconcile.MaxWaivers {
		t.Fatalf("%d waivers, want %d", len(s.state.Waivers), reconcile.MaxWaivers)
	}
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxWaivers") || !strings.Contains(j[0], `"/w/0"`) {
		t.Fatalf("journal of the waive over the cap: %q", j)
	}
	if l := s.levels(last); len(l) != 1 || l[0] != events.LevelWarn {
		t.Fatalf("journal levels %v, want warn", l)
	}
	if again := s.add(&events.Waive{Module: "app", Path: "/w/1", By: "ops"}); len(s.journals(again)) != 0 || len(s.state.Waivers) != reconcile.MaxWaivers {
		t.Fatalf("a second waive of a waived file: journal %q, %d waivers", s.journals(again), len(s.state.Waivers))
	}
	for _, p := range []string{"/w/0", "/w/1"} {
		s.add(&events.Refusal{Module: "app", Path: p, Reason: events.ReasonUndeclared, Plan: plan, Writer: "prov"})
	}
	if len(s.state.Owed) != 1 || s.state.Owed[0].Path != "/w/0" {
		t.Fatalf("owed after late refusals of the dropped and a kept waiver's files: %v", s.state.Owed)
	}
}

// Gating one module more than MaxGates keeps none more, journaled at
// warn, and drops no gate kept: were the oldest dropped, a controller
// could lift a gate by gating other modules (a fresh user's finding M7).
// A want's own flag still holds the module not kept; an operator's lift
// makes room.
func TestMaxGates(t *testing.T) {
	s := newSim(t)
	var last uint64
	for i := 0; i <= reconcile.MaxGates; i += events.MaxModules {
		w := &events.Want{}
		for j := i; j < min(i+events.MaxModules, reconcile.MaxGates+1); j++ {
			w.Modules = append(w.Modules, events.WantModule{Name: fmt.Sprintf("m%02d", j), Build: "b1", RequiresApproval: true})
		}
		last = s.add(w)
	}
	if len(s.state.Gates) != reconcile.MaxGates {
		t.Fatalf("%d gates, want %d", len(s.state.Gates), reconcile.MaxGates)
	}
	if _, ok := s.state.Gated("m00"); !ok {
		t.Fatal("the first gate was dropped to make room")
	}
	over := fmt.Sprintf("m%02d", reconcile.MaxGates)
	if j := s.journals(last); len(j) != 1 || !strings.Contains(j[0], "reconcile.MaxGates") || !strings.Contains(j[0], over) {
		t.Fatalf("journal of the want over the cap: %q", j)
	}
	if l := s.levels(last); len(l) != 1 || l[0] != events.LevelWarn {
		t.Fatalf("journal levels %v, want warn", l)
	}
	// The want's flag holds the module not kept.
	if p := s.plan(s.plans()[len(s.plans())-1]); !p.Modules[len(p.Modules)-1].Held {
		t.Fatalf("%s composed with its want's requires_approval: %+v", over, p.Modules[len(p.Modules)-1])
	}
	// And so do the gates full (fail closed), once the flag is left out.
	if g := s.state.GatesFull; g == nil || !slices.Equal(g.Modules, []string{over}) || g.Unnamed != 0 {
		t.Fatalf("gates full: %+v; want the gate of %s not kept, once", g, over)
	}
	s.add(&events.Want{Modules: []events.WantModule{{Name: over, Build: "b1"}}})
	if p := s.plan(s.plans()[len(s.plans())-1]); !p.Modules[0].Held {
		t.Fatalf("%s, whose gate was not kept, composed once a want left its flag out: %+v", over, p.Modules[0])
	}
	// A lift makes room and ends nothing; an operator's gate kept does.
	s.add(&events.Gate{Module: "m00", Lift: true, By: "ops"})
	if s.state.GatesFull == nil {
		t.Fatal("an ungate ended the gates full")
	}
	again := s.add(&events.Gate{Module: over, By: "ops"})
	if j := s.journals(again); len(j) != 1 || !strings.Contains(j[0], "gates no longer full") {
		t.Fatalf("a gate after a lift: journal %q", j)
	}
	if _, ok := s.state.Gated(over); !ok || len(s.state.Gates) != reconcile.MaxGates || s.state.GatesFull != nil {
		t.Fatalf("gate of %s not kept after a lift made room (%d gates), or the gates still full: %+v", over, len(s.state.Gates), s.state.GatesFull)
	}
}
