package process

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
)

// A module whose bundle directory is gone fails its next start naming
// that directory, where the exec's error said "fork/exec /bin/sh: no such
// file or directory" though /bin/sh exists (a fresh user's finding U19:
// another node's agent had deleted the bundles).
func TestStartWithoutBundleDirNamesIt(t *testing.T) {
	e := newEnv(t, Backoff{Initial: 20 * time.Millisecond, Max: 20 * time.Millisecond})
	e.script("sha256:a", "exit 3", bundle.Manifest{})
	b := e.fetch.bundles["sha256:a"]
	b.m.Command = []string{"/bin/sh", "run.sh"} // an absolute command: only the chdir fails
	e.fetch.bundles["sha256:a"] = b
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "job", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "a first crash", func() bool { return status(t, r, "job").Restarts >= 1 })
	if err := os.RemoveAll(b.dir); err != nil {
		t.Fatal(err)
	}
	want := "start: working directory " + b.dir + " does not exist"
	waitFor(t, r, "a start failed on the missing directory", func() bool { return strings.HasPrefix(status(t, r, "job").Exit, want) })
	if st := status(t, r, "job"); strings.Contains(st.Exit, "fork/exec") {
		t.Errorf("exit %q blames the exec", st.Exit)
	}
}

// The runtime refuses another node's state directory before it adopts
// any shim in it (a fresh user's finding U19).
func TestOpenRefusesAnotherNodesStateDir(t *testing.T) {
	e := newEnv(t, Backoff{})
	if _, err := node.ClaimStateDir(e.cfg.StateDir, "bob"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(e.cfg)
	if !errors.Is(err, node.ErrStateDirOwned) || !strings.Contains(err.Error(), "belongs to node bob") {
		t.Fatalf("Open of bob's state dir as ace: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "process")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused Open made its directory: %v", err)
	}
}
