package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

func init() { register(newStateCmd) }

// stateReply is what `meshfold state -o json|yaml` prints. Source says where
// the state came from: "reconciler" (live, from the state service),
// "snapshot" (the stored snapshot, the stream holding no newer event of
// the node: no reconciler answered), "snapshot+stream" (the stored
// snapshot with the node's events past it folded: no reconciler answered)
// or "stream" (its events folded: no reconciler answered and no snapshot
// holds it).
type stateReply struct {
	Source      query.Source          `json:"source"`
	View        reconcile.View        `json:"view"`
	Composition reconcile.Composition `json:"composition"`
	// Stuck is what is stuck now (reconcile.View.Stuck at the present).
	Stuck reconcile.Stuck `json:"stuck"`
	// Sources are the files the node's provisioner could not fill, and
	// why (DESIGN.md §12).
	Sources []audit.SourceProblem `json:"source_problems,omitempty"`
	// FeedLost, when set, is since when the node's live agent has read
	// no plan (its lease says so: store.Holder.FeedLost).
	FeedLost time.Time `json:"feed_lost,omitzero"`
}

func newStateCmd(a *app) *cobra.Command {
	var out outputFlag
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "state NODE",
		Short: "A node's current folded state and composition",
		Long: `state shows NODE's current state: the provisioner account the plan names
beside the account what runs names, counts of modules, declared files and held
modules, each held module with its reason and pending build, owed items, the
last knock, the last settled plan and how stale the last have is, and for
each module of the last have its runtime state (running, failed, stopped),
restarts since its apply, last exit and the files it waits for. The 'agent'
and 'prov' lines say whether the node agent and the provisioner client are
up or DOWN and since when (their leases, as the reconciler recorded them):
a provisioner down while the plan declares a file answers no knock and fills
nothing until one runs again, and the 'source' lines of such a node are what
it last saw.

It asks the reconciler's state service (NATS micro service "meshfold",
endpoints state and composition on $MESHFOLD.<prefix>.state.<node> and
$MESHFOLD.<prefix>.composition.<node>). When no reconciler answers (every
reconciler down, or the one of the node's partition, before another takes
it over) it reads the node's stored snapshot and folds the node's events
the stream holds past it, as a reconciler resuming from that snapshot
would, and says so ("from the stored snapshot and the node's events past
it"): a snapshot alone is as old as the last checkpoint before the outage.
When no snapshot holds the node, it folds all of its events from the
stream, as audit does. Read-only; it holds no secret.

It says what is stuck, too: a pause (by whom, since when, and what resuming
would publish: a want or approval taken in while paused shows there as
pending), a retirement, each file a settled plan declares that was never
filled since its module was placed (and how long ago that plan settled), and
the age of each owed item (older than an hour: stuck).

-o json prints one JSON object (source, view, composition, stuck); -o yaml the
same as YAML.`,
		Example: `  meshfold state ace
  meshfold state ace -o yaml
  meshfold state ace -o json | jq .stuck
  meshfold state ace -o json | jq .view.provisioner   # {"up":false,"time":…,"why":"expired",…}`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := out.get()
			if err != nil {
				return err
			}
			return runState(cmd.Context(), a, args[0], format, timeout)
		},
	}
	out.add(cmd, "print one JSON object (-o json)")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the reconciler before reading the snapshot")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runState(ctx context.Context, a *app, node string, format string, timeout time.Duration) error {
	if !events.ValidName(node) {
		return withCode(exitUsage, fmt.Errorf("node %q: %w", node, events.ErrBadName))
	}
	nc, err := a.conn.connect("meshfold-state", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{Timeout: timeout})
	if err != nil {
		return err
	}
	ns, err := r.State(ctx, node)
	if errors.Is(err, query.ErrUnknownNode) {
		return fmt.Errorf("%w (asked at %s: a mistyped name, or another server? 'meshfold fleet --all' lists the nodes)", err, serverURL(nc))
	}
	if err != nil {
		return err
	}
	now := time.Now()
	sources, serr := r.Sources(ctx, node)
	// Reported by a provisioner that is down since: as it last saw them.
	ps := audit.MarkStale(sources[node], ns.View.ProvisionerDown())
	// Reported gone by the node's agent: not "last filled at" only.
	ps = audit.MarkGone(ps, ns.View.Missing)
	// Whether its agent, alive, reads its plans: its lease says (no
	// snapshot can: a fresh user's finding M8).
	feeds, ferr := r.FeedsLost(ctx, node)
	lost := feeds[node]
	if v := ns.View; v.Agent != nil && !v.Agent.Up {
		lost = time.Time{} // down: said as such
	}
	if format != outTable {
		return writeValue(a.stdout, format, stateReply{Source: ns.Source, View: ns.View, Composition: ns.Composition, Stuck: ns.View.Stuck(now),
			Sources: ps, FeedLost: lost})
	}
	text := audit.StateText(ns.View, ns.Composition, now, ns.Source.Text())
	if !lost.IsZero() {
		text += "needs an operator: " + audit.FeedLostText(lost, now) + "\n"
	}
	if ferr != nil {
		text += fmt.Sprintf("note: whether the agent reads its plans (its lease) could not be read: %v\n", ferr)
	}
	if serr != nil {
		text += fmt.Sprintf("note: why files are unfilled (the provisioner's reports) could not be read: %v\n", serr)
	}
	if len(ps) > 0 {
		text += audit.SourcesHeader(ps) + audit.SourcesText(node, ps, now)
	}
	_, err = io.WriteString(a.stdout, text)
	return err
}

// reader returns the read side over nc for the stream the flags name;
// c's Stream is set from them.
func (f *streamFlags) reader(nc *nats.Conn, c query.Config) (*query.Reader, error) {
	c.Stream = f.config()
	r, err := query.New(nc, c)
	if errors.Is(err, events.ErrInvalid) {
		return nil, withCode(exitUsage, fmt.Errorf("--prefix: %w", err))
	}
	return r, err
}
