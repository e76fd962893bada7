package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// RootLockFile is the lock file, under an agent's --root, that the agent
// holds (flock) for its life and writes its node's name and pid into.
const RootLockFile = "run/meshfold/root.lock"

// ErrRootHeld is the refusal of a root held by an agent of another node
// ([RootHeldError] matches it).
var ErrRootHeld = errors.New("root held by another node's agent")

// RootHeldError refuses a root whose lock an agent of another node holds.
type RootHeldError struct {
	Root, Lock, Owner, Node string
	PID                     int
}

func (e *RootHeldError) Error() string {
	owner := "node " + e.Owner
	if e.Owner == "" {
		owner = "another node"
	}
	pid := ""
	if e.PID > 0 {
		pid = ", pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("root %s is held by the agent of %s (%s%s): two nodes on one root overwrite each other's filled files, and retiring one deletes the other's; give node %s its own --root (one node per host with --root /)",
		e.Root, owner, e.Lock, pid, e.Node)
}

// Unwrap returns [ErrRootHeld].
func (e *RootHeldError) Unwrap() error { return ErrRootHeld }

// LockRoot takes root's lock for node name: the file [RootLockFile]
// under root, flock-held until release is called (or the process ends),
// naming the node and the agent's pid. A root held by an agent of another
// node is refused with a [*RootHeldError] (a fresh user's finding U35:
// two agents on one root overwrote each other's filled files, and
// retiring one deleted the other's credentials). A root held by another
// agent of the same node is left to the node's lease, which refuses that
// agent; held is false then, as when the lock file cannot be made (a
// root the agent cannot write: warn is why, and nothing is locked).
func LockRoot(root, name string) (release func(), held bool, warn, err error) {
	none := func() {}
	lock := filepath.Join(root, RootLockFile)
	if err := os.MkdirAll(filepath.Dir(lock), 0o755); err != nil {
		return none, false, fmt.Errorf("root lock %s not taken: %w", lock, err), nil
	}
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return none, false, fmt.Errorf("root lock %s not taken: %w", lock, err), nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		data, _ := os.ReadFile(lock)
		_ = f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return none, false, fmt.Errorf("root lock %s not taken: %w", lock, err), nil
		}
		owner, pidS, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
		if owner == name {
			return none, false, nil, nil
		}
		pid, _ := strconv.Atoi(pidS)
		return none, false, nil, &RootHeldError{Root: root, Lock: lock, Owner: owner, Node: name, PID: pid}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(name+" "+strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, true, nil, nil
}
