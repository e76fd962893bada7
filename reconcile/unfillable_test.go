package reconcile_test

import (
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// TestUnfillable: a want that declares files and has no provisioner
// module is named, module by module, and it is what the plan and Judge
// make of it: the plan names no account, and every write is refused
// no-account (a fresh user's finding U25); with a provisioner module,
// or without files, nothing is said.
func TestUnfillable(t *testing.T) {
	creds := events.WantModule{Name: "mesh-build-go", Build: "b1", RunsAs: "nobody",
		Files: []events.File{{Path: "/run/mesh-build-go/broker.creds", Mode: "0600"}}}
	two := events.WantModule{Name: "api", Build: "a1", RunsAs: "api",
		Files: []events.File{{Path: "/run/api/a", Mode: "0600"}, {Path: "/run/api/b", Mode: "0600"}}}
	web := events.WantModule{Name: "web", Build: "w1", RunsAs: "web"}
	prov := events.WantModule{Name: "prov", Build: "p1", RunsAs: "meshprov", Provisioner: true}

	want := []events.WantModule{web, creds, two}
	got := reconcile.Unfillable(want)
	exp := []string{
		"mesh-build-go declares /run/mesh-build-go/broker.creds but this want has no provisioner module: the node accepts no write of it",
		"api declares /run/api/a, /run/api/b but this want has no provisioner module: the node accepts no write of them",
	}
	if !slices.Equal(got, exp) {
		t.Fatalf("Unfillable =\n%q\nwant\n%q", got, exp)
	}
	s := reconcile.NewState("n3")
	s.Fold(events.Event{Seq: 1, Node: "n3", Kind: events.KindWant, Payload: &events.Want{Modules: want}})
	rows, account, ok := s.Compose()
	if !ok || account != "" {
		t.Fatalf("Compose: account %q, ok %v; want none", account, ok)
	}
	if _, reason := reconcile.Judge(account, rows, creds.Name, creds.Files[0].Path, "meshprov"); reason != events.ReasonNoAccount {
		t.Fatalf("Judge of the plan's write: %q, want no-account", reason)
	}
	if got := reconcile.Unfillable([]events.WantModule{prov, web, creds}); got != nil {
		t.Errorf("Unfillable with a provisioner module = %q", got)
	}
	if got := reconcile.Unfillable([]events.WantModule{web}); got != nil {
		t.Errorf("Unfillable of a want without files = %q", got)
	}
}
