package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// A fleet longer than a page (issue 27): the table starts with how many
// nodes share each need, then lists one page of rows, most pressing
// first, and says how to see the rest; --page, --needs and --limit 0
// page, filter and unpage it; -o json prints every node unless paging is
// asked for.
func TestFleetPaged(t *testing.T) {
	t.Parallel()
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
	// A need no node has: said so, never "page 1 is past the last row".
	out, _, _ = m.cli(t, "fleet", "--warnings", "0", "--needs", "provisioner-down")
	if rows := rowsOf(out); len(rows) != 0 || !strings.Contains(out, "-- no node needs provisioner-down") || strings.Contains(out, "past the last row") {
		t.Errorf("--needs provisioner-down, which no node needs: %v\n%s", rows, out)
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

// `fleet -o json` keeps each row's JSON and sort key, not the row, and
// prints the lines in the table's order (issue 27): every node once, the
// same lines as the rows sorted (-o json --limit 0 sorts the rows
// themselves), with the journal warnings and the provisioners' reports
// set, nodes with and without a summary, over several decoding batches;
// retired nodes left out unless --all.
func TestFleetJSONEveryRowInOrder(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 700)
	for i := range names {
		names[i] = fmt.Sprintf("t%04d", i)
	}
	s := reconciletest.Scripted(names, 20*len(names), 17, nil)
	states, sums := map[int]map[string][]byte{}, map[string][]byte{}
	retired := 0
	for i, n := range names {
		st := s.State(n)
		data, err := reconcile.MarshalState(st)
		if err != nil {
			t.Fatal(err)
		}
		if i%7 != 0 { // every seventh read from its state
			if sums[n], err = reconcile.MarshalSummary(st); err != nil {
				t.Fatal(err)
			}
		}
		p := events.Partition(n, m.cfg.Partitions)
		if states[p] == nil {
			states[p] = map[string][]byte{}
		}
		states[p][n] = data
		if st.View().Stuck(time.Now()).Retired {
			retired++
		}
	}
	if retired == 0 {
		t.Fatal("no retired node in the mix")
	}
	for p, st := range states {
		if err := snaps.PutSummarizedAt(ctx, p, st, sums, nil); err != nil {
			t.Fatal(err)
		}
	}
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for i := 0; i < len(names); i += 37 {
		if _, err := pub.Append(ctx, names[i], events.Stamp(&events.Journal{Level: events.LevelWarn, Msg: "w", Cause: 1}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	fills, err := store.OpenFillStatus(ctx, m.js, m.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := 3; i < len(names); i += 41 {
		st := store.FillStatus{V: 1, Node: names[i], Module: "restic", Path: "/etc/restic/key", State: store.FillMissing, Why: "no source", Since: time.Now().Add(-time.Hour)}
		data, _ := json.Marshal(st)
		if _, err := fills.Put(ctx, store.SecretKey(st.Node, st.Module, st.Path), data); err != nil {
			t.Fatal(err)
		}
	}
	// The ages depend on when each command ran.
	ages := regexp.MustCompile(`"(have_age_s|paused_for_s|for_s)":[-0-9.e+]+`)
	for _, all := range []bool{false, true} {
		args := []string{"fleet", "-o", "json"}
		if all {
			args = append(args, "--all")
		}
		out, errOut, code := m.cli(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		sorted, errOut, code := m.cli(t, append(args, "--limit", "0")...)
		if code != 0 {
			t.Fatalf("%v --limit 0: exit %d: %s", args, code, errOut)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		want := len(names) - retired
		if all {
			want = len(names)
		}
		seen := map[string]bool{}
		warned, sourced := 0, 0
		for _, l := range lines {
			var r struct {
				Node     string `json:"node"`
				Warnings int    `json:"journal_warnings"`
				Sources  []any  `json:"source_problems"`
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("%v: %v: %s", args, err, l)
			}
			if seen[r.Node] {
				t.Errorf("%v: %s twice", args, r.Node)
			}
			seen[r.Node] = true
			if r.Warnings > 0 {
				warned++
			}
			if len(r.Sources) > 0 {
				sourced++
			}
		}
		if len(lines) != want || warned == 0 || sourced == 0 {
			t.Errorf("%v: %d lines (%d with journal warnings, %d with source problems), want %d", args, len(lines), warned, sourced, want)
		}
		if got, want := ages.ReplaceAllString(out, `"$1":0`), ages.ReplaceAllString(sorted, `"$1":0`); got != want {
			gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
			for i := range min(len(gl), len(wl)) {
				if gl[i] != wl[i] {
					t.Fatalf("%v: line %d:\n got %s\nwant %s", args, i+1, gl[i], wl[i])
				}
			}
			t.Fatalf("%v: %d lines, sorted %d", args, len(gl), len(wl))
		}
	}
}
