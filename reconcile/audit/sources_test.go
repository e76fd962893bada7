package audit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile/audit"
)

// A shadowed file is filled: its line says the sealed secret is
// shadowed and why, not that the file is not filled (a fresh user's
// finding F7); an unfilled file's line is as before.
func TestSourcesTextShadowed(t *testing.T) {
	now := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	got := audit.SourcesText("ace", []audit.SourceProblem{
		{Module: "app", Path: "/run/app/token", State: audit.Shadowed, Why: "filled from dir /srv/x, tried before sealed", Since: now.Add(-3 * time.Second)},
		{Module: "app", Path: "/run/app/key", State: "missing", Why: "dir /srv/x: no file", Since: now.Add(-time.Minute)},
	}, now)
	// One line a file, each starting with "source" (a long one wraps).
	lines := strings.Split(strings.Join(strings.Fields(got), " "), "source ")[1:]
	if len(lines) != 2 || !strings.Contains(lines[0], "ace app /run/app/token sealed secret shadowed since 3s ago") ||
		strings.Contains(lines[0], "not filled") || !strings.Contains(lines[0], "filled from dir /srv/x") ||
		!strings.Contains(lines[1], "ace app /run/app/key not filled: missing since 1m") {
		t.Fatalf("text:\n%s", got)
	}
}

// The header above the source lines says "not filled" only while no file
// among them is shadowed (a shadowed file is filled, from another source).
func TestSourcesHeader(t *testing.T) {
	missing := audit.SourceProblem{Module: "app", Path: "/run/app/key", State: "missing"}
	shadowed := audit.SourceProblem{Module: "app", Path: "/run/app/token", State: audit.Shadowed}
	for _, c := range []struct {
		ps   []audit.SourceProblem
		want string
	}{
		{[]audit.SourceProblem{missing}, "not filled, as the provisioner reports it:\n"},
		{[]audit.SourceProblem{missing, shadowed}, "not filled, or filled from a source that shadows a put, as the provisioner reports it:\n"},
		{[]audit.SourceProblem{shadowed}, "not filled, or filled from a source that shadows a put, as the provisioner reports it:\n"},
	} {
		if got := audit.SourcesHeader(c.ps); got != c.want {
			t.Errorf("SourcesHeader(%v) = %q, want %q", c.ps, got, c.want)
		}
	}
}
