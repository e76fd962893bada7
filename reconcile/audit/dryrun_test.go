package audit_test

import (
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// A dry run says that the runs_as users a want adds or changes are
// checked by the node when it applies, not by the dry run (the node knows
// its users): runs_as nobdy passed it without a word. A want that names
// no new user says nothing of users.
func TestDryRunTextSaysUsersAreCheckedOnTheNode(t *testing.T) {
	web := events.PlanModule{Name: "web", Build: "w:1", RunsAs: "web"}
	typo := web
	typo.RunsAs = "nobdy"
	api := events.PlanModule{Name: "api", Build: "a:1", RunsAs: "api"}
	d := reconcile.DryRun{Node: "ace", Seq: 4, Want: 3, Publish: true, Modules: []events.PlanModule{typo, api},
		Diff: reconcile.PlanDiff{
			Added:   []events.PlanModule{api},
			Changed: []reconcile.RowChange{{Module: "web", From: web, To: typo, Fields: []string{"runs_as"}}},
		}}
	got := strings.Join(strings.Fields(audit.DryRunText(d, "the reconciler")), " ")
	if want := "users runs_as api, nobdy: checked by the node when it applies, not here (the node knows its users); one it lacks fails the apply, and 'meshfold state ace' says why"; !strings.Contains(got, want) {
		t.Errorf("the dry run does not say %q:\n%s", want, audit.DryRunText(d, "the reconciler"))
	}
	d.Diff = reconcile.PlanDiff{Changed: []reconcile.RowChange{{Module: "web", From: web, To: events.PlanModule{Name: "web", Build: "w:2", RunsAs: "web"}, Fields: []string{"build"}}}}
	if got := audit.DryRunText(d, "the reconciler"); strings.Contains(got, "users") {
		t.Errorf("a build change alone speaks of users:\n%s", got)
	}
}
