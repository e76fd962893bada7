package process

import (
	"errors"
	"fmt"
	"os/user"
	"slices"
	"strconv"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/process/shim"
)

// ErrUnknownUser: the module's runs_as names no user of the node's user
// database. The error Apply returns matches it (errors.Is) and reads
// "no such user NAME on this node (runs_as of module M)", the telling
// part first: it is the failed settle's text, which audit's line cuts.
var ErrUnknownUser = errors.New("process: unknown user")

// unknownUserError is ErrUnknownUser for one name, in an operator's words.
type unknownUserError struct{ name string }

func (e *unknownUserError) Error() string {
	return fmt.Sprintf("no such user %s on this node", events.Text(e.name))
}

func (e *unknownUserError) Is(target error) bool { return target == ErrUnknownUser }

// ErrNoRunsAs: the agent is root and the module's row has no runs_as. The
// runtime would run it as the agent's own user, root, without the want
// saying so; it refuses instead (docs/architecture.md, "The process
// runtime"). A want that means root says runs_as "root".
var ErrNoRunsAs = errors.New(`process: runs_as is empty; the process runtime runs no module as root unless the want says runs_as "root"`)

// lookupAccount resolves name (uid, primary gid, supplementary groups).
// An empty name is the agent's own user.
//
// Errors: one matching ErrUnknownUser (naming the user), or the
// database's error.
func lookupAccount(name string) (shim.Account, error) {
	var u *user.User
	var err error
	if name == "" {
		u, err = user.Current()
	} else {
		u, err = user.Lookup(name)
	}
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return shim.Account{}, &unknownUserError{name: name}
		}
		return shim.Account{}, fmt.Errorf("look up user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return shim.Account{}, fmt.Errorf("user %q: uid %q or gid %q is not numeric", name, u.Uid, u.Gid)
	}
	a := shim.Account{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		return shim.Account{}, fmt.Errorf("groups of user %q: %w", name, err)
	}
	// Exactly the account's groups, its primary one included, as
	// initgroups(3) sets them: nothing of the shim's.
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil && !slices.Contains(a.Groups, uint32(g)) {
			a.Groups = append(a.Groups, uint32(g))
		}
	}
	return a, nil
}
