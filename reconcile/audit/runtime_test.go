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
)

// A node whose module crash-loops sorts before one with owed items, and
// among failed nodes the one with more restarts comes first.
func TestFleetFailedFirst(t *testing.T) {
	owed := audit.FleetRow{Node: "a-owed", Owed: 3, HaveAge: 1}
	failed := func(node string, restarts int) audit.FleetRow {
		return audit.FleetRow{Node: node, HaveAge: 1, Failed: []reconcile.ModuleRuntime{{Module: "m", State: events.Failed, Restarts: restarts}}}
	}
	rows := []audit.FleetRow{owed, failed("b-few", 2), failed("c-many", 9)}
	for i := range rows {
		rows[i].SetWarnings(0)
	}
	audit.SortFleet(rows)
	var got []string
	for _, r := range rows {
		got = append(got, r.Node)
	}
	if want := []string{"c-many", "b-few", "a-owed"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if rows[0].Attention[0] != "failed" {
		t.Fatalf("attention %v", rows[0].Attention)
	}
}

// Unfilled: a module's owed paths and the files its settled row declares
// that no filled event ever reported.
func TestRuntimeUnfilled(t *testing.T) {
	s := reconcile.NewState("ace")
	s.Have = &reconcile.HaveRecord{Seq: 9, Modules: []events.HaveModule{
		{Name: "m", Build: "b", State: events.Failed, Restarts: 4, Exit: "status 1"}, {Name: "n", Build: "c", State: events.Running}}}
	s.Settled = &reconcile.PlanRecord{Seq: 5, Modules: []events.PlanModule{
		{Name: "m", Build: "b", Files: []events.File{{Path: "/a", Mode: "0600"}, {Path: "/b", Mode: "0600"}}},
		{Name: "n", Build: "c", Files: []events.File{{Path: "/c", Mode: "0600"}}}}}
	s.Filled = []reconcile.FilledMark{{Module: "m", Path: "/b", Plan: 3}, {Module: "n", Path: "/c", Plan: 5}}
	s.Owed = []reconcile.Item{{Owed: events.Owed{Module: "m", Path: "/z", Reason: events.ReasonUndeclared, Plan: 2, Writer: "p"}}}
	rs := reconcile.RuntimeOf(s)
	if len(rs) != 2 || !slices.Equal(rs[0].Unfilled, []string{"/a", "/z"}) || len(rs[1].Unfilled) != 0 {
		t.Fatalf("runtime %+v", rs)
	}
	if !rs[0].Failing() || rs[1].Failing() || rs[0].Restarts != 4 || rs[0].Exit != "status 1" {
		t.Fatalf("runtime %+v", rs)
	}
	row := audit.FleetRowOf(s, time.Now(), time.Hour)
	if len(row.Failed) != 1 || row.Failed[0].Module != "m" || row.Attention[0] != "failed" {
		t.Fatalf("fleet row %+v", row)
	}
	if v := s.View(); len(v.Runtime) != 2 {
		t.Fatalf("view runtime %+v", v.Runtime)
	}
}

// A failed apply's error and a refusal's error show their cause, at the
// end, in the timeline, and so does the journal entry the fold writes.
func TestErrorTextKeepsTheCause(t *testing.T) {
	cause := ": no such bundle in bucket MESH_BUILDS: push it with meshfold build push"
	msg := "apply mesh-build-go: bundle sha256:2267110a3fb464bd2077a311377b0c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b" + cause
	long := "apply mesh-build-go: " + strings.Repeat("x", 600) + cause
	for _, p := range []events.Payload{
		&events.Settle{Module: "mesh-build-go", Op: events.OpFailed, Plan: 3, Error: msg},
		&events.Settle{Module: "mesh-build-go", Op: events.OpFailed, Plan: 3, Error: long},
		&events.Refusal{Module: "m", Path: "/run/m/c", Reason: events.ReasonWriteFailed, Plan: 3, Writer: "prov", Error: long},
		&events.Journal{Level: events.LevelError, Cause: 4, Msg: "apply of plan 3 failed for module \"m\": " + long},
	} {
		if s := audit.Summary(events.Event{Payload: p}, nil); !strings.Contains(s, cause) {
			t.Errorf("%T: the summary lost the cause: %s", p, s)
		}
	}
}

// A have's health (DESIGN.md §11) shows in state's runs line, after the
// run state; a module without a check shows none.
func TestStateShowsHealth(t *testing.T) {
	s := reconcile.NewState("ace")
	s.Have = &reconcile.HaveRecord{Seq: 9, Modules: []events.HaveModule{
		{Name: "m", Build: "b", State: events.Running, Health: events.Unhealthy}, {Name: "n", Build: "c", State: events.Running}}}
	text := audit.StateText(s.View(), reconcile.Composition{}, time.Now(), "test")
	if !strings.Contains(text, "m b running unhealthy,") || !strings.Contains(text, "n c running,") {
		t.Fatalf("state text lacks the health, or shows one without a check:\n%s", text)
	}
}

// The NEEDS column names the newest failed apply first, so a column cut
// at its width shows the current failure, not an older one of a module
// sorting before it.
func TestFleetNeedsNewestFailedApplyFirst(t *testing.T) {
	v := reconcile.View{Node: "ace", Failed: []reconcile.FailedApply{
		{Module: "aaa", Plan: 131, Seq: 132, Error: "old"},
		{Module: "web", Plan: 140, Seq: 141, Error: "not in bucket"},
	}}
	line := audit.FleetRowOfView(v, time.Now(), time.Hour).Line(8)
	i, j := strings.Index(line, "apply failed: web"), strings.Index(line, "apply failed: aaa")
	if i < 0 || (j >= 0 && j < i) {
		t.Errorf("the newest failure is not first:\n%s", line)
	}
}

// The lines after fleet's table name each node's warnings it read, and
// count the rest with where to read them.
func TestFleetWarningsText(t *testing.T) {
	r := audit.FleetRow{Node: "ace", HaveAge: 1}
	r.SetWarningSeqs([]uint64{7, 9})
	if !slices.Equal(r.WarningSeqs, []uint64{7, 9}) {
		t.Fatalf("counted seqs %v", r.WarningSeqs)
	}
	r.WarningNotes = []string{audit.WarningNote("ace", 9, &events.Journal{Level: events.LevelError, Msg: "apply of plan 8 failed"})}
	got := audit.FleetWarningsText([]audit.FleetRow{r, {Node: "calm", HaveAge: 1}})
	if !strings.Contains(got, "ace #9 error: apply of plan 8 failed") || !strings.Contains(got, "ace 1 more journal warning: meshfold audit ace shows them") ||
		strings.Contains(got, "calm") {
		t.Errorf("warnings text:\n%s", got)
	}
}

// Fleet's journal lines keep a message whole up to 320 bytes (wrapped), and
// cut a longer one between words, keeping its head and its tail (where
// the remedy is), naming where it is whole. They cut at 160 bytes inside
// words, after events.ErrorText had cut the middle: "…refused again for
// its sig…r: the node's agent does not trust this reconciler's key (its…
// (217 bytes)" (a fresh user's finding U6). audit --why shows it whole.
func TestWarningNoteCutsBetweenWords(t *testing.T) {
	msg := "plan 304, published again under this reconciler's key, refused again for its signer: the node's agent does not trust this reconciler's key (its --trust file, or --trust-from, names another deployment's)"
	if got := audit.WarningNote("bob", 307, &events.Journal{Level: events.LevelError, Msg: msg}); got != "#307 error: "+msg {
		t.Errorf("a %d-byte message is cut: %q", len(msg), got)
	}
	long := "plan 304 refused by the node's agent: " + strings.Repeat("the agent read its trust file at start and names another key; ", 6) +
		"restart the agent (it reads reconcilers.pub at start)"
	got := audit.WarningNote("bob", 307, &events.Journal{Level: events.LevelError, Msg: long})
	head, tail, ok := strings.Cut(strings.TrimPrefix(got, "#307 error: "), " … ")
	if !ok || !strings.HasPrefix(long, head) || !strings.HasPrefix(long[len(head):], " ") {
		t.Errorf("the head is not the message's first words: %q", got)
	}
	body, pointer, _ := strings.Cut(tail, fmt.Sprintf(" (%d bytes; ", len(long)))
	if !strings.HasSuffix(long, body) || long[len(long)-len(body)-1] != ' ' || !strings.HasSuffix(body, "restart the agent (it reads reconcilers.pub at start)") {
		t.Errorf("the tail is not the message's last words, the remedy among them: %q", got)
	}
	if pointer != "whole in 'meshfold audit bob --why 307')" {
		t.Errorf("the cut line does not say where the message is whole: %q", got)
	}
	if len(got) > 400 {
		t.Errorf("a %d-byte message is kept at %d bytes", len(long), len(got))
	}
}

// A journal entry's summary is its message whole, which `audit --why SEQ`
// (wrapped), -o json and the console's node page show, and where fleet's
// cut journal line points: events.ErrorText cut it in the middle, so no
// view showed a message over 200 bytes whole (a fresh user's finding U6).
func TestJournalSummaryWhole(t *testing.T) {
	msg := "plan 304, published again under this reconciler's key, refused again for its signer: the node's agent does not trust this reconciler's key (its --trust file, or --trust-from, names another deployment's)"
	ev := events.Event{Seq: 307, Kind: events.KindJournal, Payload: &events.Journal{Level: events.LevelError, Msg: msg, Cause: 306}}
	if s := audit.Summary(ev, nil); s != "←#306 error: "+msg {
		t.Errorf("journal summary %q, want the message whole", s)
	}
}
