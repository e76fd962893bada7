package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/rollout/feed"
)

// noArgs is cobra.NoArgs for a command that has no subcommands: an
// argument is refused as what it is, an argument the command does not
// take (cobra.NoArgs calls it an unknown command, which sends a user
// looking for a subcommand that never existed), exit 2. hint, when not
// empty, says where such an argument belongs ("for one node: meshfold
// state NODE").
func noArgs(hint string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		q := make([]string, len(args))
		for i, a := range args {
			q[i] = strconv.Quote(a)
		}
		msg := fmt.Sprintf("%s takes no arguments (got %s)", cmd.CommandPath(), strings.Join(q, " "))
		if hint != "" {
			msg += ": " + hint
		}
		return withCode(exitUsage, errors.New(msg))
	}
}

// noRollout is the error of a rollout verb whose FLEET has no rollout in
// the stream (feed.ErrNoRollout, which it matches): a name the user got
// wrong, exit 2, said as the user meets it with where the names are.
// Other errors come back as they are.
func noRollout(err error, fleet string) error {
	if !errors.Is(err, feed.ErrNoRollout) {
		return err
	}
	return withCode(exitUsage, &quietErr{
		msg: fmt.Sprintf("no rollout of fleet %q ('meshfold rollout ls' lists the fleets that have one; 'meshfold apply -f FLEET.yaml' starts one)", fleet),
		err: err,
	})
}

// quietErr is an error whose text is its own message, matching the error
// it wraps without repeating it.
type quietErr struct {
	msg string
	err error
}

func (e *quietErr) Error() string { return e.msg }
func (e *quietErr) Unwrap() error { return e.err }
