package node

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// An agent's root is locked for its node: an agent of another node is
// refused, naming the holder; one of the same node is left to the lease;
// a released root is free (a fresh user's finding U35).
func TestLockRootRefusesAnotherNode(t *testing.T) {
	root := t.TempDir()
	release, held, warn, err := LockRoot(root, "p1")
	if err != nil || warn != nil || !held {
		t.Fatalf("p1's lock: held %v, warn %v, err %v", held, warn, err)
	}
	data, _ := os.ReadFile(filepath.Join(root, RootLockFile))
	if want := "p1 " + strconv.Itoa(os.Getpid()) + "\n"; string(data) != want {
		t.Errorf("lock file %q, want %q", data, want)
	}
	_, held2, _, err := LockRoot(root, "p2")
	var he *RootHeldError
	if !errors.As(err, &he) || !errors.Is(err, ErrRootHeld) || held2 || he.Owner != "p1" || he.PID != os.Getpid() {
		t.Fatalf("p2 on p1's root: held %v, %v; want refused, held by p1", held2, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "root "+root+" is held by the agent of node p1") || !strings.Contains(msg, "give node p2 its own --root") {
		t.Errorf("refusal %q", msg)
	}
	if _, same, _, err := LockRoot(root, "p1"); err != nil || same {
		t.Errorf("a second agent of p1: held %v, %v; want left to the lease (not held, no error)", same, err)
	}
	release()
	release2, held2, _, err := LockRoot(root, "p2")
	if err != nil || !held2 {
		t.Fatalf("p2 after p1 released: held %v, %v", held2, err)
	}
	release2()
}
