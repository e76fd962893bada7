package audit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// TestFleetSourcesOfAFileReportedGone checks that fleet's lines after
// the table say of a file the node reported missing what `meshfold
// state` says (audit.MarkGone): gone from the node, reported at the
// have's sequence; never "the node has not reported it gone" a line
// after the one saying it is missing on the node (a fresh user's
// finding M6).
func TestFleetSourcesOfAFileReportedGone(t *testing.T) {
	now := time.Date(2026, 12, 5, 14, 30, 3, 0, time.UTC)
	const path = "/run/mesh-build-go/broker.creds"
	r := audit.FleetRow{Node: "inc1", Missing: []reconcile.MissingFile{{Module: "mesh-build-go", Path: path, Seq: 12385, Time: now.Add(-34 * time.Second)}}}
	p := audit.SourceProblem{Module: "mesh-build-go", Path: path, State: "missing", Why: "dir secrets/inc1: no file",
		Since: now.Add(-32 * time.Second), LastFilled: now.Add(-53 * time.Second)}
	r.SetSources([]audit.SourceProblem{p})
	rows := []audit.FleetRow{r}
	fleet := audit.FleetMissingText(rows) + audit.FleetSourcesText(rows, now)
	state := audit.SourcesText("inc1", audit.MarkGone([]audit.SourceProblem{p}, r.Missing), now)
	if strings.Contains(fleet, "has not reported it gone") || !strings.Contains(fleet, path+" gone from the node (reported at #12385;") {
		t.Errorf("fleet's lines of a file reported gone:\n%s\nwant them to say it is gone from the node, as state does:\n%s", fleet, state)
	}
}
