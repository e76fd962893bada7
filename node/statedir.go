package node

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
)

// OwnerFile is the file of a state directory that names the node it
// belongs to: the node's name and a newline, written once, atomically, by
// the first agent to start on the directory ([ClaimStateDir]).
const OwnerFile = "node-name"

// ErrStateDirOwned is the refusal of a state directory that belongs to
// another node ([StateDirOwnedError] matches it).
var ErrStateDirOwned = errors.New("state dir belongs to another node")

// StateDirOwnedError refuses a state directory whose [OwnerFile] names
// another node.
type StateDirOwnedError struct {
	Dir, Owner, Node string
}

func (e *StateDirOwnedError) Error() string {
	return fmt.Sprintf("state dir %s belongs to node %s: give this node its own --state-dir (node %s refused it: its file %s names the node it belongs to)",
		e.Dir, e.Owner, e.Node, OwnerFile)
}

// Unwrap returns [ErrStateDirOwned].
func (e *StateDirOwnedError) Unwrap() error { return ErrStateDirOwned }

// ClaimStateDir makes dir the state directory of node name, creating it
// (mode 0700) if missing: a directory whose [OwnerFile] names another
// node is refused with a [*StateDirOwnedError], so an agent started under
// another node's name on the same directory neither adopts that node's
// modules nor removes them and their bundles (a fresh user's finding
// U19). A directory without the record is claimed: the record is
// written (atomically, created once: of two agents starting at once on
// it, one wins and the other reads the winner's name). adopted reports
// that the directory held something else already: an agent before the
// record existed made it, and the first agent to start on it now owns
// it (the upgrade path).
//
// Errors: the refusal; the directory cannot be made or read; a record
// that names no valid node (edited by hand: it says which file).
func ClaimStateDir(dir, name string) (adopted bool, err error) {
	if !events.ValidName(name) {
		return false, &events.FieldError{Field: "node", Value: name, Err: events.ErrBadName}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("node agent: state dir: %w", err)
	}
	record := filepath.Join(dir, OwnerFile)
	owner, err := readOwner(record)
	if errors.Is(err, fs.ErrNotExist) {
		ents, rerr := os.ReadDir(dir)
		if rerr != nil {
			return false, fmt.Errorf("node agent: state dir: %w", rerr)
		}
		for _, e := range ents {
			if !atomicfile.IsTemp(e.Name(), OwnerFile) {
				adopted = true
				break
			}
		}
		err = atomicfile.Create(record, []byte(name+"\n"), 0o644)
		if err == nil {
			return adopted, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("node agent: state dir %s: writing %s: %w", dir, OwnerFile, err)
		}
		adopted = false
		owner, err = readOwner(record) // another agent's, written meanwhile
	}
	if err != nil {
		return false, err
	}
	if owner != name {
		return false, &StateDirOwnedError{Dir: dir, Owner: owner, Node: name}
	}
	return adopted, nil
}

// readOwner reads the node a state directory's record names.
func readOwner(record string) (string, error) {
	data, err := os.ReadFile(record)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("node agent: %w", err)
	}
	owner := strings.TrimSuffix(string(data), "\n")
	if !events.ValidName(owner) {
		return "", fmt.Errorf("node agent: %s names no node (%s): it holds the name of the node the state directory belongs to, and a newline",
			record, events.Short(owner))
	}
	return owner, nil
}

// LogAdopted says that the state directory dir, made before it recorded
// its node, is now node name's.
func LogAdopted(log *slog.Logger, dir, name string) {
	log.Warn("state directory had no node record (an agent before it existed made it): it is node "+name+"'s from now on, and an agent of another node refuses it",
		"dir", dir, "record", filepath.Join(dir, OwnerFile))
}
