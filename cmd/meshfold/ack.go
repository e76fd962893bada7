package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
)

func init() { register(newAckCmd) }

func newAckCmd(a *app) *cobra.Command {
	var o operatorFlags
	var upto uint64
	var force bool
	cmd := &cobra.Command{
		Use:   "ack NODE --by NAME [--upto SEQ] [--reason TEXT]",
		Short: "Acknowledge a node's journal warnings, so that they stop flagging it",
		Long: `ack publishes an ack event for NODE: its journal warnings (entries of level
warn or error; 'meshfold audit NODE' shows them) stored before the ack, or at
or before stream sequence --upto SEQ, have been read by an operator. They no
longer put the node under "needs an operator": 'meshfold fleet' and the web
console count them on an 'acked' line instead, with who acknowledged them and
when; 'meshfold state NODE' shows the ack, and 'meshfold audit NODE' every
ack, who gave it and when. A warning stored later flags the node again.

The node keeps the ack that covers the most: an ack of fewer warnings than an
earlier one changes nothing, so ack publishes nothing when it would change
nothing (no warning of the node is left unacknowledged, or --upto is at or
below the ack in force) and says so on stderr, exit 0; --force publishes it
anyway. An ack changes no plan, knock or owed item: what
a warning is about is read, not fixed ('meshfold state NODE' says what still
holds).

A node with no event in the stream is refused (exit 2, nothing published): a
mistyped name would make a phantom node that 'meshfold fleet' lists; --new
acks such a node anyway.

Prints the event's stream sequence; exit 1 if the publish failed, 2 on a
usage error.`,
		Example: `  meshfold ack ace --by alice
  meshfold ack ace --by alice --upto 186 --reason "serve restart, converged since"
  meshfold audit ace | grep -E ' (warn|error):'   # the warnings, before acking them`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("upto") && upto == 0 {
				return withCode(exitUsage, errors.New("--upto 0: stream sequences start at 1; leave --upto out to acknowledge every warning stored so far"))
			}
			ctx, cancel := o.context(cmd)
			defer cancel()
			check := checkKnown // a node with warnings may have no want
			if o.newNode {
				check = checkNone
			}
			if !o.newNode && !force {
				if why := a.ackChangesNothing(ctx, args[0], upto); why != "" {
					fmt.Fprintf(a.stderr, "ack %s: %s: nothing published (--force publishes it anyway)\n", args[0], why)
					return nil
				}
			}
			return a.publishEach(ctx, events.KindAck, args[:1], false, check, false, func() events.Payload {
				return &events.Ack{By: o.by, Upto: upto, Reason: o.reason}
			})
		},
	}
	o.add(a, cmd, true, false)
	cmd.Flags().Uint64Var(&upto, "upto", 0, "acknowledge the warnings stored at or before this stream sequence (default: every one stored before the ack)")
	cmd.Flags().BoolVar(&force, "force", false, "publish the ack even when it would change nothing")
	cmd.Flags().BoolVar(&o.newNode, "new", false, "ack a node that has no event in the stream yet (refused without it: a mistyped name would make a phantom node)")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishes(cmd, events.KindAck)
}

// ackChangesNothing says why an ack of node through upto (0: every
// warning stored so far) would change nothing: the node has no journal
// warning the ack in force (query.Reader.State's View.Ack) leaves
// unacknowledged, or none at or below upto. "" when it would change
// something, or when the state or the journal cannot be read (the ack is
// then published, as before).
func (a *app) ackChangesNothing(ctx context.Context, node string, upto uint64) string {
	nc, err := a.conn.connect("meshfold-cli", a)
	if err != nil {
		return ""
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return ""
	}
	if c, err := r.Count(ctx, node); err != nil || c == 0 {
		return "" // publishEach refuses an unknown node (checkKnown)
	}
	seqs, err := r.WarningSeqs(ctx, time.Time{})
	if err != nil {
		return ""
	}
	if len(seqs[node]) == 0 { // no state needed (a node just acked --new may not be folded yet)
		return "it has no journal warning to acknowledge ('meshfold audit " + node + "' shows its journal)"
	}
	ns, err := r.State(ctx, node)
	if err != nil {
		return ""
	}
	prev := ns.View.Ack
	for _, s := range seqs[node] {
		if !prev.Acked(s) && (upto == 0 || s <= upto) {
			return ""
		}
	}
	switch {
	case prev != nil && upto != 0 && upto <= prev.Upto:
		return fmt.Sprintf("its journal warnings are already acknowledged through #%d (by %s, #%d); --upto %d adds none", prev.Upto, prev.By, prev.Seq, upto)
	case prev != nil && len(seqs[node]) > 0:
		return fmt.Sprintf("its %s are already acknowledged through #%d (by %s, #%d)", plural(len(seqs[node]), "journal warning"), prev.Upto, prev.By, prev.Seq)
	case upto != 0 && len(seqs[node]) > 0:
		return fmt.Sprintf("none of its journal warnings is stored at or before #%d", upto)
	}
	return "it has no journal warning to acknowledge ('meshfold audit " + node + "' shows its journal)"
}
