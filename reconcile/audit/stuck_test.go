package audit_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// What is stuck reaches fleet's row and state's text (issue 15): a pause
// (by whom, for how long), a retirement under way, a file never filled
// since its module was placed, an owed item older than an hour; a retired
// node needs nothing. Pure: the present is an argument.
func TestFleetRowStuck(t *testing.T) {
	t0 := time.Date(2026, 11, 3, 20, 0, 0, 0, time.UTC)
	s := reconciletest.New(t0, time.Second)
	s.Append("ace", &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "mesh-build-go", Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: "/run/mbg/broker.creds", Mode: "0600"}}},
	}})
	s.Append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: 2})
	s.Append("ace", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	s.Append("ace", &events.Refusal{Module: "mesh-build-go", Path: "/run/mbg/old", Reason: events.ReasonUndeclared, Plan: 2, Writer: "prov"})
	s.Append("ace", &events.Pause{By: "alice", Reason: "disk swap"})
	st := s.State("ace")

	soon := t0.Add(30 * time.Second)
	r := audit.FleetRowOf(st, soon, time.Hour)
	if slices.Contains(r.Attention, "unfilled") || len(r.Stuck.Owed) != 0 {
		t.Errorf("30 s after the settle nothing is stuck yet: %v %+v", r.Attention, r.Stuck)
	}
	later := t0.Add(2 * time.Hour)
	r = audit.FleetRowOf(st, later, 3*time.Hour)
	if want := []string{"unfilled", "owed", "paused"}; !slices.Equal(r.Attention, want) {
		t.Errorf("attention %v, want %v", r.Attention, want)
	}
	line := r.Line(8)
	if !strings.HasSuffix(line, "unfilled 1, owed (1 over 1h), paused 1h59m") {
		t.Errorf("line %q", line)
	}
	more := audit.FleetStuckText([]audit.FleetRow{r})
	for _, w := range []string{"stuck     ace paused by alice since 2026-11-03T20:00:06", "ace mesh-build-go /run/mbg/broker.creds never filled since plan #2 placed it, 1h59m ago",
		"ace mesh-build-go /run/mbg/old owed (undeclared) since 1h59m ago", "meshfold waive ace mesh-build-go /run/mbg/old"} {
		if !strings.Contains(strings.Join(strings.Fields(more), " "), strings.Join(strings.Fields(w), " ")) {
			t.Errorf("stuck text lacks %q:\n%s", w, more)
		}
	}
	text := audit.StateText(st.View(), reconcile.CompositionOf(st), later, "test")
	for _, w := range []string{"paused    by alice since 2026-11-03T20:00:06", "reason: disk swap",
		"withheld  nothing: resuming publishes no plan",
		"unfilled  mesh-build-go /run/mbg/broker.creds: never filled since plan #2 placed it, settled 1h59m",
		"refused 1h59m ago: STUCK"} {
		if !strings.Contains(text, w) {
			t.Errorf("state text lacks %q:\n%s", w, text)
		}
	}

	// Retiring: the empty plan waits to settle; then retired, hidden by
	// fleet (the row says so) and needing nothing.
	s.Append("ace", &events.Retire{By: "bob"})
	st = s.State("ace")
	r = audit.FleetRowOf(st, later, 3*time.Hour)
	if !r.Stuck.Retiring || r.Retired || !slices.Contains(r.Attention, "retiring") || slices.Contains(r.Attention, "paused") {
		t.Errorf("retiring: %+v %v", r.Stuck, r.Attention)
	}
	if more := audit.FleetStuckText([]audit.FleetRow{r}); !strings.Contains(more, "--force") {
		t.Errorf("retiring: %q", more)
	}
	s.Append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpRemove, Plan: st.Emitted().Seq})
	r = audit.FleetRowOf(s.State("ace"), later, time.Minute)
	if !r.Retired || len(r.Attention) != 0 || !strings.HasSuffix(r.Line(8), " retired") {
		t.Errorf("retired: retired=%v attention %v line %q", r.Retired, r.Attention, r.Line(8))
	}
}

// A filled file the node's agent reported missing (a fresh user's
// finding U21) is said by state and fleet, as the fleet summary carries
// it too, until a filled puts it back: "declared file P of module M is
// missing on the node (reported at #N): refill asked".
func TestMissingFileSaid(t *testing.T) {
	t0 := time.Date(2026, 11, 3, 20, 0, 0, 0, time.UTC)
	s := reconciletest.New(t0, time.Second)
	const path = "/run/mbg/broker.creds"
	s.Append("ace", &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "mesh-build-go", Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: path, Mode: "0600"}}},
	}})
	s.Append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: 2})
	s.Append("ace", &events.Filled{Module: "mesh-build-go", Path: path, Plan: 2, Digest: "hmac:x"})
	have := s.Append("ace", &events.Have{Modules: []events.HaveModule{{Name: "mesh-build-go", Build: "g:1", State: events.Failed, Restarts: 1, Exit: "status 1"}},
		Missing: []events.MissingFile{{Module: "mesh-build-go", Path: path}}})
	st := s.State("ace")
	want := fmt.Sprintf("declared file %s of module mesh-build-go is missing on the node (reported at #%d): refill asked", path, have.Seq)
	now := t0.Add(time.Minute)
	flat := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	if text := audit.StateText(st.View(), reconcile.CompositionOf(st), now, "test"); !strings.Contains(flat(text), "missing "+want) {
		t.Errorf("state text lacks %q:\n%s", want, text)
	}
	sum, err := reconcile.MarshalSummary(st)
	if err != nil {
		t.Fatal(err)
	}
	v, err := reconcile.UnmarshalSummary(sum)
	if err != nil {
		t.Fatal(err)
	}
	for what, r := range map[string]audit.FleetRow{"state": audit.FleetRowOf(st, now, time.Hour), "summary": audit.FleetRowOfView(v, now, time.Hour)} {
		if !slices.Contains(r.Attention, "missing") || !strings.Contains(r.Line(8), "missing 1") {
			t.Errorf("%s: attention %v, line %q", what, r.Attention, r.Line(8))
		}
		if more := audit.FleetMissingText([]audit.FleetRow{r}); !strings.Contains(flat(more), "missing ace "+want) {
			t.Errorf("%s: fleet text lacks %q:\n%s", what, want, more)
		}
		// A need fleet ranks, counts and filters (--needs missing).
		if counts, _ := audit.CountNeeds([]audit.FleetRow{r}); !slices.Contains(counts, audit.NeedCount{Need: "missing", Nodes: 1}) {
			t.Errorf("%s: needs counted %v, want missing 1", what, counts)
		}
	}
	s.Append("ace", &events.Filled{Module: "mesh-build-go", Path: path, Plan: 2, Digest: "hmac:x"})
	st = s.State("ace")
	r := audit.FleetRowOf(st, now, time.Hour)
	if slices.Contains(r.Attention, "missing") || audit.FleetMissingText([]audit.FleetRow{r}) != "" ||
		strings.Contains(audit.StateText(st.View(), reconcile.CompositionOf(st), now, "test"), "missing on the node") {
		t.Errorf("filled again, still said missing: %v", r.Attention)
	}
}
