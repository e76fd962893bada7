package store_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestClientDeps keeps the roles light (docs/architecture.md, the package
// map): the node agent, the provisioner client and store itself link
// neither the reconciler's engine, nor Prometheus, nor the audit's
// renderer, nor any package of nats-server (the embedded server is
// package store/embedded), directly or through any dependency, as
// TestPure does for the core.
func TestClientDeps(t *testing.T) {
	t.Parallel()
	const mod = "github.com/meshfold/meshfold/"
	forbidden := []string{mod + "engine", "github.com/prometheus/", mod + "reconcile/audit",
		"github.com/nats-io/nats-server/", mod + "store/embedded"}
	for _, pkg := range []string{mod + "store", mod + "node", mod + "provision"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) == 0 {
			t.Fatalf("go list -deps %s: no package listed", pkg)
		}
		for _, dep := range deps {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(dep[len(f):], "/")) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
