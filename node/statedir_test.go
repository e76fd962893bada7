package node_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshfold/meshfold/node"
)

// A state directory records the node it belongs to at the first start;
// the same node claims it again, another is refused naming the owner; a
// directory made before the record existed is adopted by the first node
// to start on it (the upgrade path), and said so (a fresh user's finding
// U19: another node's agent adopted, then removed, bob's modules).
func TestClaimStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bob-state")
	if adopted, err := node.ClaimStateDir(dir, "bob"); err != nil || adopted {
		t.Fatalf("first claim of a new dir: adopted %v, %v", adopted, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, node.OwnerFile)); err != nil || string(data) != "bob\n" {
		t.Fatalf("record %q, %v", data, err)
	}
	if adopted, err := node.ClaimStateDir(dir, "bob"); err != nil || adopted {
		t.Fatalf("bob again: adopted %v, %v", adopted, err)
	}
	_, err := node.ClaimStateDir(dir, "hal")
	var owned *node.StateDirOwnedError
	if !errors.Is(err, node.ErrStateDirOwned) || !errors.As(err, &owned) || owned.Owner != "bob" {
		t.Fatalf("hal on bob's dir: %v", err)
	}
	if want := "state dir " + dir + " belongs to node bob: give this node its own --state-dir"; err.Error()[:len(want)] != want {
		t.Errorf("refusal %q, want it to begin %q", err, want)
	}

	old := filepath.Join(t.TempDir(), "old-state")
	if err := os.MkdirAll(filepath.Join(old, "bundles"), 0o700); err != nil {
		t.Fatal(err)
	}
	if adopted, err := node.ClaimStateDir(old, "ace"); err != nil || !adopted {
		t.Fatalf("a dir of an earlier agent: adopted %v, %v; want adopted", adopted, err)
	}
	if _, err := node.ClaimStateDir(old, "hal"); !errors.Is(err, node.ErrStateDirOwned) {
		t.Fatalf("hal after ace adopted it: %v", err)
	}

	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, node.OwnerFile), []byte("Bob!\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := node.ClaimStateDir(bad, "bob"); err == nil || errors.Is(err, node.ErrStateDirOwned) {
		t.Fatalf("a record naming no node: %v", err)
	}
}
