package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newStateCmd) }

// Sources of `meshfold state`.
const (
	sourceReconciler = "reconciler"
	sourceSnapshot   = "snapshot"
)

// stateReply is what `meshfold state -o json|yaml` prints. Source says where
// the state came from: "reconciler" (live, from the state service) or
// "snapshot" (the stored snapshot: no reconciler answered).
type stateReply struct {
	Source      string                `json:"source"`
	View        reconcile.View        `json:"view"`
	Composition reconcile.Composition `json:"composition"`
	// Stuck is what is stuck now (reconcile.View.Stuck at the present).
	Stuck reconcile.Stuck `json:"stuck"`
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
restarts since its apply, last exit and the files it waits for.

It asks the reconciler's state service (NATS micro service "meshfold",
endpoints state and composition on $MESHFOLD.<prefix>.state.<node> and
$MESHFOLD.<prefix>.composition.<node>). When no reconciler answers it reads
the node's stored snapshot instead, and says so: a snapshot is as old as
the reconciler's last checkpoint. Read-only; it holds no secret.

It says what is stuck, too: a pause (by whom, since when, and what resuming
would publish: a want or approval taken in while paused shows there as
pending), a retirement, each file a settled plan declares that was never
filled since its module was placed (and how long ago that plan settled), and
the age of each owed item (older than an hour: stuck).

-o json prints one JSON object (source, view, composition, stuck); -o yaml the
same as YAML.`,
		Example: `  meshfold state ace
  meshfold state ace -o yaml
  meshfold state ace -o json | jq .stuck`,
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
	r, note, err := fetchState(ctx, nc, a.stream, node, timeout)
	if err != nil {
		return err
	}
	now := time.Now()
	if format != outTable {
		r.Stuck = r.View.Stuck(now)
		return writeValue(a.stdout, format, r)
	}
	_, err = io.WriteString(a.stdout, audit.StateText(r.View, r.Composition, now, note))
	return err
}

// fetchState asks the state service, then falls back to the snapshot. note
// says, for the text output, where the state came from.
func fetchState(ctx context.Context, nc *nats.Conn, sf streamFlags, node string, timeout time.Duration) (stateReply, string, error) {
	v, c, err := engine.RequestState(ctx, nc, sf.prefix, node, timeout)
	switch {
	case err == nil:
		return stateReply{Source: sourceReconciler, View: v, Composition: c}, "the reconciler (live)", nil
	case errors.Is(err, engine.ErrUnknownNode):
		return stateReply{}, "", fmt.Errorf("node %q is unknown: the reconciler has folded no event of it", node)
	case !errors.Is(err, engine.ErrNoReconciler):
		return stateReply{}, "", err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return stateReply{}, "", err
	}
	st, err := loadSnapshot(ctx, js, sf, node)
	if err != nil {
		return stateReply{}, "", err
	}
	return stateReply{Source: sourceSnapshot, View: st.View(), Composition: reconcile.CompositionOf(st)},
		"the stored snapshot: no reconciler answered", nil
}

// openSnapshots opens the stream's snapshot bucket without creating it: a
// read-only verb must not make one.
func openSnapshots(ctx context.Context, js jetstream.JetStream, sf streamFlags) (*store.Snapshots, store.StreamConfig, error) {
	_, cfg, err := sf.openStream(ctx, js)
	if err != nil {
		return nil, cfg, err
	}
	snaps, err := store.FindSnapshots(ctx, js, cfg)
	if errors.Is(err, store.ErrNoSnapshots) {
		return nil, cfg, fmt.Errorf("no snapshots yet (bucket %s does not exist): no reconciler has checkpointed", cfg.Name+store.SnapshotBucketSuffix)
	}
	return snaps, cfg, err
}

func loadSnapshot(ctx context.Context, js jetstream.JetStream, sf streamFlags, node string) (*reconcile.State, error) {
	snaps, _, err := openSnapshots(ctx, js, sf)
	if err != nil {
		return nil, fmt.Errorf("no reconciler answered, and %w", err)
	}
	data, _, err := snaps.GetNode(ctx, node)
	if errors.Is(err, store.ErrNoSnapshot) {
		return nil, fmt.Errorf("node %q is unknown: no reconciler answered and no snapshot holds it", node)
	}
	if err != nil {
		return nil, err
	}
	st, err := reconcile.UnmarshalState(data)
	if err != nil {
		return nil, fmt.Errorf("snapshot of %s: %w", node, err)
	}
	return st, nil
}
