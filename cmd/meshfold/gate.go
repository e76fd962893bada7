package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
)

// The gate of DESIGN.md §4: which modules move to a new build only with an
// operator's approval, whatever the controller's want says (a fresh user's
// finding M7: the controller lifted requires_approval by leaving the flag
// out of its next want).

func init() {
	register(newGateCmd)
	register(newUngateCmd)
}

const gateHelp = `A module gated on a node moves to a new build only with an operator's
approval of that build ('meshfold approve'); until then the plan holds it at
what runs. A want that marks a module requires_approval gates it, and the
gate stays when a later want leaves the flag out, drops the module or is
published after a retire: the controller, which writes the want, cannot lift
it. Only an operator's ungate does. 'meshfold state NODE' lists the node's
gates, who or what set each, and whether the newest want still marks it.`

func newGateCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "gate NODE... MODULE --by NAME [--reason TEXT] | gate --all MODULE --by NAME [--reason TEXT]",
		Short: "Make MODULE move to a new build on nodes only with an operator's approval",
		Long: `gate publishes a gate event for each node: MODULE moves to a new build there
only with an approval, whatever the controller's wants say, until an
operator ungates it. Use it for the modules CI must not ship alone, before
or after a want names them: a module no want names yet is gated for when one
does (its first placement waits for an approval too). A module gated already
keeps its first gate (who set it, and since when); a note says so.

` + gateHelp + `

The last argument is MODULE; the ones before it name the nodes, or --all
gates it on every node that has a want. Prints each event's stream sequence,
one line per node; exit 1 if any publish failed, 2 on a usage error.

` + knownNodeHelp + "\n\n" + allRetiredHelp,
		Example: `  meshfold gate ace db --by alice --reason "schema migrations need a DBA's yes"
  meshfold gate ace bob db --by alice
  meshfold gate --all payments --by alice   # every node with a want`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: a.completeNodes(-1),
	}
	return a.gateVerb(cmd, &o, false)
}

func newUngateCmd(a *app) *cobra.Command {
	var o operatorFlags
	cmd := &cobra.Command{
		Use:   "ungate NODE... MODULE --by NAME [--reason TEXT] | ungate --all MODULE --by NAME [--reason TEXT]",
		Short: "Lift the gate of MODULE on nodes: it moves without an approval again",
		Long: `ungate publishes a gate event with lift for each node: the node's gate of
MODULE is lifted, so MODULE moves to the build its want names without an
approval, unless the newest want itself marks it requires_approval (it stays
held while the want carries the flag, and a later want with the flag gates
it again; a note says so). Approvals given stay; a node that has no gate of
MODULE changes nothing (a note says so: mistyped?).

` + gateHelp + `

The last argument is MODULE; the ones before it name the nodes, or --all
lifts it on every node that has a want. Prints each event's stream
sequence, one line per node; exit 1 if any publish failed, 2 on a usage
error.

` + knownNodeHelp + "\n\n" + allRetiredHelp,
		Example: `  meshfold ungate ace db --by alice --reason "db leaves the approval process"
  meshfold ungate --all db --by alice`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: a.completeNodes(-1),
	}
	return a.gateVerb(cmd, &o, true)
}

// gateVerb completes gate (lift false) and ungate (lift true): the last
// argument is the module, the others the nodes.
func (a *app) gateVerb(cmd *cobra.Command, o *operatorFlags, lift bool) *cobra.Command {
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, cancel := o.context(cmd)
		defer cancel()
		module := args[len(args)-1]
		check := checkKnown // a gate may come before the want, not before the node
		if o.newNode {
			check = checkNone
		}
		return a.publishEach(ctx, events.KindGate, args[:len(args)-1], o.all, check, true, func() events.Payload {
			return &events.Gate{Module: module, Lift: lift, By: o.by, Reason: o.reason}
		})
	}
	o.add(a, cmd, true, true)
	o.addNew(cmd, true)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishes(cmd, events.KindGate)
}

// gateNotes says, per node, what a gate event g changes there, read from
// the node's state before it (query.Reader.State): a gate of a module
// gated already keeps the first; a lift of a module not gated changes
// nothing; a lift of one the newest want marks requires_approval leaves
// it held while the want carries the flag. A node whose state cannot be
// read gets no note.
func (a *app) gateNotes(ctx context.Context, nc *nats.Conn, nodes []string, g *events.Gate) map[string]string {
	return a.stateNotes(ctx, nc, nodes, func(n string, ns query.NodeState) string {
		i := slices.IndexFunc(ns.View.Gates, func(x reconcile.Gate) bool { return x.Module == g.Module })
		switch {
		case !g.Lift && i >= 0:
			return fmt.Sprintf("%s is gated on %s already (%s): the first gate stands", events.Short(g.Module), n, gateOrigin(ns.View.Gates[i]))
		case g.Lift && i < 0:
			return fmt.Sprintf("%s has no gate of %s (mistyped? 'meshfold state %s' lists its gates): the ungate is stored and lifts nothing", n, events.Short(g.Module), n)
		case g.Lift && ns.View.Gates[i].Wanted:
			return fmt.Sprintf("%s's newest want (#%d) marks %s requires_approval: it stays held for an approval while a want carries the flag, and a want with it gates it again",
				n, ns.View.Want, events.Short(g.Module))
		}
		return ""
	})
}

// gateOrigin says who or what set a gate.
func gateOrigin(g reconcile.Gate) string {
	if g.By != "" {
		return fmt.Sprintf("by %s at #%d", events.Text(g.By), g.Seq)
	}
	return fmt.Sprintf("since want #%d marked it requires_approval", g.Seq)
}
