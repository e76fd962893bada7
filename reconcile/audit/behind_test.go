package audit_test

import (
	"slices"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// A row from a snapshot older than its node's events (Behind) is not
// blamed for a stale have: the node's newer events may hold one (a fresh
// user's finding M9: with every reconciler down, fleet counted nodes
// "stale-have" from snapshots it knew lagged their haves). Its other
// needs stay; a row not behind keeps its stale have.
func TestFleetRowBehindNeedsNoStaleHave(t *testing.T) {
	now := time.Date(2026, 12, 5, 15, 0, 0, 0, time.UTC)
	v := reconcile.View{Node: "n229", Seq: 10348, Want: 9925, HaveSeq: 10300, HaveTime: now.Add(-12 * time.Minute), Unsettled: 1}
	row := audit.FleetRowOfView(v, now, 10*time.Minute)
	if !slices.Equal(row.Attention, []string{"unsettled", "stale-have"}) {
		t.Fatalf("row from the snapshot: attention %v, want unsettled, stale-have", row.Attention)
	}
	row.SetNewest(row.Seq) // no newer event: not behind
	if row.Behind || !slices.Contains(row.Attention, "stale-have") {
		t.Errorf("row as new as its events: behind %v, attention %v", row.Behind, row.Attention)
	}
	row.SetNewest(17933)
	if !row.Behind || row.NewestSeq != 17933 || !slices.Equal(row.Attention, []string{"unsettled"}) {
		t.Errorf("row behind its events: behind %v (newest #%d), attention %v; want behind, #17933, unsettled only", row.Behind, row.NewestSeq, row.Attention)
	}
}
