package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// A fleet longer than a page (issue 27): the table starts with how many
// nodes share each need, then lists one page of rows, most pressing
// first, and says how to see the rest; --page, --needs and --limit 0
// page, filter and unpage it; -o json prints every node unless paging is
// asked for.
func TestFleetPaged(t *testing.T) {
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	prov := events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}
	gated := events.WantModule{Name: "nats", Build: "n:2", RunsAs: "nats", RequiresApproval: true}
	const calm, waiting = 52, 8
	var names []string
	for i := range calm + waiting {
		n := fmt.Sprintf("n%03d", i)
		names = append(names, n)
		w := &events.Want{Modules: []events.WantModule{prov}}
		if i >= calm {
			w.Modules = append(w.Modules, gated)
		}
		s.Append(n, w)
		s.Append(n, &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: s.State(n).Emitted().Seq})
		s.Append(n, &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	}
	for _, n := range names {
		data, _ := json.Marshal(s.State(n))
		if err := snaps.PutNode(ctx, events.Partition(n, m.cfg.Partitions), n, data); err != nil {
			t.Fatal(err)
		}
	}
	rowsOf := func(out string) []string {
		var rows []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "n0") {
				rows = append(rows, strings.Fields(l)[0])
			}
		}
		return rows
	}

	out, errOut, code := m.cli(t, "fleet", "--warnings", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rows := rowsOf(out)
	if !strings.HasPrefix(out, "NEEDS            NODES\napproval             8\n") || !strings.Contains(out, "\nnothing             52\n") {
		t.Errorf("no summary first:\n%s", out)
	}
	if len(rows) != 50 || rows[0] != "n052" || rows[7] != "n059" || rows[8] != "n000" {
		t.Errorf("page 1: %d rows %v, want 50, the 8 waiting for an approval first", len(rows), rows)
	}
	if !strings.Contains(out, "-- 60 nodes, 8 need an operator\n-- page 1 of 2: rows 1-50 of 60, most pressing first; --page 2 for the next") {
		t.Errorf("page 1 does not say where it is:\n%s", out)
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "--page", "2")
	if rows := rowsOf(out); len(rows) != 10 || rows[0] != "n042" || !strings.Contains(out, "-- page 2 of 2: rows 51-60 of 60") {
		t.Errorf("page 2: %v\n%s", rows, out)
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "--needs", "approval")
	if rows := rowsOf(out); len(rows) != 8 || !strings.Contains(out, "rows 1-8 of 8 needing approval") || !strings.Contains(out, "NEEDS            NODES") {
		t.Errorf("--needs approval: %v\n%s", rows, out)
	}
	// "nothing", listed in the summary, picks the calm nodes.
	out, errOut, code = m.cli(t, "fleet", "--warnings", "0", "--needs", "nothing")
	if rows := rowsOf(out); code != 0 || len(rows) != 50 || rows[0] != "n000" || !strings.Contains(out, "rows 1-50 of 52 needing nothing") {
		t.Errorf("--needs nothing: exit %d %s %v\n%s", code, errOut, rows, out)
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "--limit", "0")
	if rows := rowsOf(out); len(rows) != 60 || strings.Contains(out, "NEEDS            NODES") || strings.Contains(out, "-- page") {
		t.Errorf("--limit 0: every row, unpaged, wanted:\n%s", out)
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "--all")
	if rows := rowsOf(out); len(rows) != 60 {
		t.Errorf("--all: %d rows, want every one", len(rows))
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "-o", "json")
	if n := strings.Count(out, "\n"); n != 60 {
		t.Errorf("-o json: %d lines, want every node", n)
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "-o", "json", "--limit", "5", "--page", "2")
	if n := strings.Count(out, "\n"); n != 5 || !strings.HasPrefix(out, `{"node":"n057"`) {
		t.Errorf("-o json --limit 5 --page 2:\n%s", out)
	}
	for _, bad := range [][]string{{"--limit", "-1"}, {"--page", "0"}, {"--needs", "bored"}} {
		if _, errOut, code := m.cli(t, append([]string{"fleet"}, bad...)...); code != exitUsage {
			t.Errorf("fleet %v: exit %d %s, want a usage error", bad, code, errOut)
		}
	}
}
