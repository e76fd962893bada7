package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newApproveCmd) }

func newApproveCmd(a *app) *cobra.Command {
	var by string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "approve NODE MODULE BUILD --by NAME",
		Short: "Approve MODULE on NODE at BUILD (an operator's yes)",
		Long: `approve publishes an operator's yes for one module at one build. A module
whose want says requires_approval moves to a new build only once that build
is approved; until then the plan holds it at what runs and shows the wanted
build as pending ('meshfold state NODE'). An approval may come before or
after the want, is kept per (module, build) and is never used up. Approving
another build than the pending one moves nothing.

--by names who approved (required); it is kept in the stream for audit.
On success it prints the stream sequence of the stored approval.`,
		Example: `  meshfold approve novox nats img:nats-2.10.24 --by alice`,
		Args:    cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return runApprove(ctx, a, args[0], args[1], args[2], by)
		},
	}
	cmd.Flags().StringVar(&by, "by", "", "who approves (required)")
	_ = cmd.MarkFlagRequired("by")
	addPublishTimeout(cmd, &timeout)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runApprove(ctx context.Context, a *app, nodeName, module, build, by string) error {
	if !events.ValidName(nodeName) {
		return withCode(exitUsage, &events.FieldError{Field: "NODE", Value: nodeName, Err: events.ErrBadName})
	}
	ap := events.Stamp(&events.Approve{Module: module, Build: build, By: by}, time.Now())
	if err := ap.Validate(); err != nil {
		return withCode(exitUsage, err)
	}
	nc, js, pub, err := a.openPublisher(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	ack, err := pub.AppendRetrying(ctx, nodeName, ap)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "approve %s %s %s: stream sequence %d\n", nodeName, module, build, ack.Seq)
	// An approval may come before the want that needs it (DESIGN.md §4),
	// so it is stored either way; a typo in the node or module is worth a
	// word on stderr.
	if note := a.approvalNote(ctx, js, nodeName, module); note != "" {
		fmt.Fprintln(a.stderr, "note:", note)
	}
	return nil
}

// approvalNote says when node's newest want does not name module (or the
// node has no want), or "" when it does or the want cannot be read.
func (a *app) approvalNote(ctx context.Context, js jetstream.JetStream, node, module string) string {
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return ""
	}
	m, err := store.LastMsg(ctx, stream, scfg.Subjects(), node, events.KindWant)
	if errors.Is(err, store.ErrNoMessage) {
		return fmt.Sprintf("node %s has no want yet; the approval is kept for when one names %s", node, module)
	}
	w, ok := m.Event.Payload.(*events.Want)
	if err != nil || !ok {
		return ""
	}
	for _, wm := range w.Modules {
		if wm.Name == module {
			return ""
		}
	}
	return fmt.Sprintf("node %s's newest want (#%d) names no module %s; the approval is kept for when one does", node, m.Event.Seq, module)
}
