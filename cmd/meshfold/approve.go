package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newApproveCmd) }

func newApproveCmd(a *app) *cobra.Command {
	var (
		o            operatorFlags
		allowMissing bool
	)
	cmd := &cobra.Command{
		Use:   "approve NODE... MODULE BUILD --by NAME | approve --all MODULE BUILD --by NAME",
		Short: "Approve MODULE at BUILD on nodes (an operator's yes)",
		Long: `approve publishes an operator's yes for one module at one build, one event
per node. A module whose want says requires_approval moves to a new build
only once that build is approved; until then the plan holds it at what runs
and shows the wanted build as pending ('meshfold state NODE'). An approval
is kept per (module, build) and is never used up. Approving another build
than the pending one moves nothing (a note says so, as it says of a module
the newest want does not gate); take an approval back with 'meshfold revoke'.

A MODULE the node's newest want does not name (a mistyped name, or a node
with no want yet) is refused: exit 2, nothing published to any node named,
and the message names the want's modules ("did you mean …?" when one is
close). To approve ahead of the want that will name it, give --ahead. With
--all, only a MODULE no node's newest want names is refused.

The last two arguments are MODULE and BUILD; the ones before them name the
nodes, or --all approves on every node whose newest want names MODULE (a
note on stderr counts the nodes it skipped: an approval on a node that does
not run MODULE would let a later placement there run it with no approval
anyone looked at). To approve ahead on such nodes, name them and give
--ahead (--all --ahead approves on every node that has a want). --by names who
approved (required); it is kept in the stream for audit. Prints each
approval's stream sequence, one line per node; exit 1 if any publish failed,
2 on a usage error.

A node with no event in the stream at all is refused (exit 2, nothing
published): a mistyped name would store an approval the real node never
sees, and make a phantom node that 'meshfold fleet' lists. To approve ahead
of a new node's first want and its agent's first connection, give --new
(which implies --ahead).

BUILD is checked as 'meshfold want' checks a want's: a build of no build's
form (neither sha256:<64 hex>, what 'meshfold build push' prints, nor
another runtime's <scheme>:<id>) is refused with exit 2, whatever the flags;
a sha256: build the builds bucket does not hold is refused with exit 1
(--allow-missing-build approves it anyway, ahead of its push). Each refusal
names the stored builds nearest to it. BUILD may be the short form messages
print (sha256: and 12 hex digits or more): it names the one stored build it
begins, which a note says and the approval holds whole (no stored build or
several: exit 2).

` + allRetiredHelp,
		Example: `  meshfold approve novox web "$BUILD" --by alice   # a bundle build (BUILD=$(meshfold build push …)): stored, or refused
  meshfold approve novox nats img:nats-2.10.24 --by alice
  meshfold approve novox ace nats img:nats-2.10.24 --by alice
  meshfold approve --all nats img:nats-2.10.24 --by alice   # the nodes whose want names nats
  meshfold approve ace nats img:nats-2.11.0 --by alice --ahead   # before the want naming nats
  meshfold approve newbie nats img:nats-2.10.24 --by alice --new   # before newbie's first want and connection`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := o.context(cmd)
			defer cancel()
			n := len(args)
			module, build := args[n-2], args[n-1]
			check := checkKnown // an approval may come before the want, not before the node
			if o.newNode {
				check = checkNone
			}
			build, err := a.resolveBuildPrefix(ctx, build)
			if err != nil {
				return err
			}
			if err := a.checkBuildArg(ctx, module, build, allowMissing, false); err != nil {
				return err
			}
			return a.publishEach(ctx, events.KindApprove, args[:n-2], o.all, check, o.ahead || o.newNode, func() events.Payload {
				return &events.Approve{Module: module, Build: build, By: o.by}
			})
		},
	}
	o.add(a, cmd, false, true)
	cmd.Flags().BoolVar(&o.newNode, "new", false, "approve on a node that has no event in the stream yet (refused without it: a mistyped name would make a phantom node)")
	cmd.Flags().BoolVar(&o.ahead, "ahead", false, aheadFlagHelp("approve"))
	cmd.Flags().BoolVar(&allowMissing, "allow-missing-build", false, "approve a sha256: build the builds bucket does not hold (yet); a build of no build's form is refused still")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishes(cmd, events.KindApprove)
}

// approvalNote says when node's newest want does not name module (or the
// node has no want), or names it at another build than build, or does
// not require its approval: the approval moves nothing now (a fresh
// user's finding L14: one of a build not pending was taken silently).
// "" when the want names module at build with requires_approval, or the
// want cannot be read.
func (a *app) approvalNote(ctx context.Context, js jetstream.JetStream, node, module, build string) string {
	_, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return ""
	}
	// From the leader: a want published a moment ago (the usual order,
	// want then approve) may not be applied yet by a replica.
	m, err := store.LastMsg(ctx, store.Leader(js, scfg.Name), scfg.Subjects(), node, events.KindWant)
	if errors.Is(err, store.ErrNoMessage) {
		return fmt.Sprintf("node %s has no want yet; the approval is kept for when one names %s", node, module)
	}
	w, ok := m.Event.Payload.(*events.Want)
	if err != nil || !ok {
		return ""
	}
	for _, wm := range w.Modules {
		switch {
		case wm.Name != module:
		case wm.Build != build:
			return fmt.Sprintf("node %s's newest want (#%d) names %s at %s, not %s: this approval moves nothing now; it is kept for when a want names that build",
				node, m.Event.Seq, module, shortBuild(wm.Build), shortBuild(build))
		case !wm.RequiresApproval:
			return fmt.Sprintf("node %s's newest want (#%d) does not require an approval of %s: nothing waits for this one; it is kept for when a want does",
				node, m.Event.Seq, module)
		default:
			return ""
		}
	}
	return fmt.Sprintf("node %s's newest want (#%d) names no module %s; the approval is kept for when one does", node, m.Event.Seq, module)
}

// checkBuildArg refuses build, the BUILD argument of approve (revoke
// true: of revoke), as 'meshfold want' refuses a want's (checkBuilds): a
// build of no build's form exit 2, a sha256: build the builds bucket
// lacks exit 1 unless allowMissing; each naming the nearest stored. A
// revoke refused for a missing build says how to take back the approval
// of a build removed since.
func (a *app) checkBuildArg(ctx context.Context, module, build string, allowMissing, revoke bool) error {
	w := &events.Want{Modules: []events.WantModule{{Name: module, Build: build}}}
	if err := bundle.CheckForm(build); err == nil && (allowMissing || !strings.HasPrefix(build, bundle.BuildScheme)) {
		return nil // nothing more to check: no connection
	}
	nc, err := a.conn.connect("meshfold-cli", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	err = checkBuilds(ctx, r, w, allowMissing)
	var coded *codedError
	if err != nil && revoke && !errors.As(err, &coded) { // missing, not malformed
		return fmt.Errorf("%w\n(an approval of a build removed since, 'meshfold build rm --force', is taken back with --allow-missing-build)", err)
	}
	return err
}
