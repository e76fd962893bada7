package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// bigView is a 300-target rollout's view: batch 1 done, 20 changing (one
// of them with its agent down), 2 failed in batch 3, the rest pending.
func bigView() rollout.View {
	v := rollout.View{Fleet: "web", Rollout: 9, Phase: rollout.Running, Batch: 3, Batches: 15, Counts: map[rollout.Status]int{}}
	for i := range 300 {
		t := rollout.TargetView{Node: fmt.Sprintf("n%03d", i+1), Batch: i/20 + 1}
		switch {
		case i < 20:
			t.Status = rollout.Done
		case i < 40:
			t.Status = rollout.Changing
			t.Down = i == 39
		case i == 40 || i == 55:
			t.Status, t.Why = rollout.Failed, "its apply failed"
		default:
			t.Status = rollout.Pending
		}
		v.Counts[t.Status]++
		v.Targets = append(v.Targets, t)
	}
	return v
}

// rows returns the node of each table row of a status output.
func rows(out string) []string {
	var nodes []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "n") && len(f[0]) == 4 {
			nodes = append(nodes, f[0])
		}
	}
	return nodes
}

// At 300 targets rollout status says how many have each status, then
// prints a page of 50, most pressing first (failed, then the changing
// one whose agent is down, then the other changing ones), and says how
// to see the rest (a fresh user's finding M7: 307 lines, no count, no
// paging).
func TestRolloutStatusPaged(t *testing.T) {
	t.Parallel()
	v := bigView()
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "\ntargets: 300 targets: 2 failed, 20 changing, 258 pending, 20 done\n") {
		t.Errorf("status lacks the counts line:\n%s", out)
	}
	got := rows(out)
	if len(got) != 50 {
		t.Fatalf("%d rows, want a page of 50:\n%s", len(got), out)
	}
	if want := []string{"n041", "n056", "n040", "n021"}; strings.Join(got[:4], " ") != strings.Join(want, " ") {
		t.Errorf("first rows %v, want %v (failed, then the changing one whose agent is down, then changing in order)", got[:4], want)
	}
	if !strings.Contains(out, "-- page 1 of 6: targets 1-50 of 300, most pressing first; --page 2 for the next; --all for every target\n") {
		t.Errorf("status lacks the page line:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n > 60 {
		t.Errorf("status printed %d lines at 300 targets, want about a page", n)
	}

	// The last page, a status filter, every row.
	b.Reset()
	_ = writeRolloutView(&b, v, time.Now(), targetPaging{limit: 50, page: 6})
	if got := rows(b.String()); len(got) != 50 || got[len(got)-1] != "n020" {
		t.Errorf("page 6: %d rows ending %v, want 50 ending with the done n020", len(got), got[len(got)-1:])
	}
	b.Reset()
	_ = writeRolloutView(&b, v, time.Now(), targetPaging{limit: 50, page: 1, statuses: []rollout.Status{rollout.Failed}})
	if got := rows(b.String()); strings.Join(got, " ") != "n041 n056" || !strings.Contains(b.String(), "targets 1-2 of 2 failed") {
		t.Errorf("--status failed: rows %v\n%s", got, b.String())
	}
	b.Reset()
	_ = writeRolloutView(&b, v, time.Now(), targetPaging{limit: 50, page: 1, statuses: []rollout.Status{rollout.Conflict}})
	if !strings.Contains(b.String(), "-- no target is conflict\n") {
		t.Errorf("--status conflict, none:\n%s", b.String())
	}
	b.Reset()
	_ = writeRolloutView(&b, v, time.Now(), targetPaging{limit: 0, page: 1})
	if got := rows(b.String()); len(got) != 300 || got[0] != "n001" || strings.Contains(b.String(), "-- page") {
		t.Errorf("--all: %d rows from %v, want 300 in the rollout's order, no page line", len(got), got[:1])
	}

	// A rollout that fits one page prints every target in its order.
	small := rollout.View{Fleet: "web", Counts: map[rollout.Status]int{rollout.Done: 1, rollout.Failed: 1}, Targets: []rollout.TargetView{
		{Node: "n001", Batch: 1, Status: rollout.Done}, {Node: "n002", Batch: 2, Status: rollout.Failed}}}
	b.Reset()
	_ = writeRolloutView(&b, small, time.Now(), defaultTargetPaging)
	if got := rows(b.String()); strings.Join(got, " ") != "n001 n002" || strings.Contains(b.String(), "-- page") {
		t.Errorf("2 targets: rows %v\n%s", got, b.String())
	}
}

// -o json stays complete unless a page or status is asked for; the
// counts are always the whole rollout's.
func TestRolloutStatusJSONPaged(t *testing.T) {
	t.Parallel()
	v := bigView()
	pg := targetPaging{limit: 50, page: 1, statuses: []rollout.Status{rollout.Failed}}
	v.Targets, _, _ = pg.of(v.Targets)
	var b strings.Builder
	if err := writeValue(&b, outJSON, v); err != nil {
		t.Fatal(err)
	}
	var got rollout.View
	if err := json.Unmarshal([]byte(b.String()), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Targets) != 2 || got.Counts[rollout.Pending] != 258 {
		t.Errorf("--status failed -o json: %d targets, counts %v", len(got.Targets), got.Counts)
	}
}

// The builds lines list a build failing on some nodes with them (fresh12
// M2: "web@sha256:d23132… failed" on 3 nodes was counted nowhere).
func TestRolloutStatusBuildsFailing(t *testing.T) {
	t.Parallel()
	v := rollout.View{Fleet: "web", Phase: rollout.Halted, Builds: []rollout.BuildCount{
		{Module: "web", Build: "sha256:1e15262572", Nodes: 5},
		{Module: "web", Build: "sha256:d23132bb3b8c", NotRunning: map[events.RunState]int{events.Failed: 3}},
	}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	if want := "  web@sha256:d23132bb3b8c on 0 nodes, not running on 3: 3 failed (by their newest haves)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}
