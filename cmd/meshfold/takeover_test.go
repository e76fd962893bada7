package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// After `apply --take-over` moves a node to another fleet, the old
// fleet's status says where it went, who moved it and when, not that its
// want was "changed by hand" at the new fleet's rollout want (a fresh
// user's finding U22), and its budget no longer counts the node. Against
// serve's controller, no agent: the canary ace's want is published and
// never settles, bob waits for the promote when fleet api takes it.
func TestTakeOverSaysMoved(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.serveReconciler(t)
	ctx := testCtx(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for _, n := range []string{"ace", "bob", "cat"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) string {
		file := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	if out, errs, code := m.cli(t, "apply", "-f", write("web.yaml", fleetYAML), "--by", "alice"); code != 0 {
		t.Fatalf("apply web: code %d\n%s%s", code, out, errs)
	}
	waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 3 && v.Targets[0].Published > 0 })
	api := `fleet: api
nodes:
  bob: {}
groups:
  - name: all
    select: {}
    modules: [{name: api, build: "api:1"}]
rollout: {max_unavailable: 1, min_healthy: 0s}
`
	out, errs, code := m.cli(t, "apply", "-f", write("api.yaml", api), "--by", "mallory", "--take-over", "--reason", "bob moves to api")
	var id uint64
	if i := strings.Index(out, "rollout "); i >= 0 {
		_, _ = fmt.Sscanf(out[i:], "rollout %d of fleet api started", &id)
	}
	if code != 0 || id == 0 {
		t.Fatalf("apply --take-over: code %d\n%s%s", code, out, errs)
	}
	want := fmt.Sprintf("moved to fleet api (rollout %d, --take-over by mallory at #%d)", id, id)
	v := waitStatus(t, m, func(v rollout.View) bool { return v.Targets[1].Status == rollout.Moved })
	if b := v.Targets[1]; b.Node != "bob" || !strings.HasPrefix(b.Why, want) {
		t.Fatalf("bob in web's status: %s %q, want moved: %q", b.Status, b.Why, want)
	}
	if v.Nodes != 2 {
		t.Errorf("web's status counts %d nodes, want 2 (bob is api's)", v.Nodes)
	}
	out, _, _ = m.cli(t, "rollout", "status", "web")
	t.Logf("rollout status web after the take-over:\n%s", out)
	if !strings.Contains(strings.Join(strings.Fields(out), " "), want) || strings.Contains(out, "by hand") {
		t.Errorf("rollout status web:\n%s", out)
	}
}
