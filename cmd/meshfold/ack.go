package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
)

func init() { register(newAckCmd) }

func newAckCmd(a *app) *cobra.Command {
	var o operatorFlags
	var upto uint64
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
earlier one changes nothing. An ack changes no plan, knock or owed item: what
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
			return a.publishEach(ctx, events.KindAck, args[:1], false, check, func() events.Payload {
				return &events.Ack{By: o.by, Upto: upto, Reason: o.reason}
			})
		},
	}
	o.add(cmd, true, false)
	cmd.Flags().Uint64Var(&upto, "upto", 0, "acknowledge the warnings stored at or before this stream sequence (default: every one stored before the ack)")
	cmd.Flags().BoolVar(&o.newNode, "new", false, "ack a node that has no event in the stream yet (refused without it: a mistyped name would make a phantom node)")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}
