package query_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestReaderDeps: the read side and the console, which reads only
// through it, link neither the engine (its loop, Prometheus) nor a NATS
// server.
func TestReaderDeps(t *testing.T) {
	t.Parallel()
	const mod = "github.com/meshfold/meshfold/"
	forbidden := []string{mod + "engine", "github.com/prometheus/",
		"github.com/nats-io/nats-server/", mod + "store/embedded"}
	for _, pkg := range []string{mod + "query", mod + "console"} {
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
