package console

import (
	"context"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// NodeView is one node of the fleet as a [Source] loads it: its view, or
// why it could not be read.
type NodeView = query.NodeView

// Source is where the console reads: everything it shows comes through
// these calls, and none of them writes. A *query.Reader is one (the read
// side every reader of a deployment uses); tests may pass their own.
type Source interface {
	// Fleet returns every node the stored snapshots hold, in no order.
	// Errors: one matching query.ErrNoSnapshots when no reconciler has
	// checkpointed yet (the console shows an empty fleet).
	Fleet(ctx context.Context) ([]NodeView, error)
	// WarningSeqs returns the stream sequences of each node's journal
	// entries of level warn or error stored at or after since, in stream
	// order: the row tells those an ack covers, or that cleared, apart
	// (audit.FleetRow.SetWarningSeqs).
	WarningSeqs(ctx context.Context, since time.Time) (map[string][]uint64, error)
	// Live asks the reconciler for node's current view and composition.
	// Errors: query.ErrNoReconciler when none answers,
	// query.ErrUnknownNode.
	Live(ctx context.Context, node string) (reconcile.View, reconcile.Composition, error)
	// History reads node's events in stream order within b; a read
	// bounded by b.Until is partial (audit.History.Partial). A node with
	// no event is an empty history, not an error.
	History(ctx context.Context, node string, b query.Bounds) (*audit.History, error)
	// Begins says where h's history begins when the stream no longer
	// holds the node's first events ("" when it does).
	Begins(ctx context.Context, h *audit.History) string
	// Follow calls fn with every event stored from now on, in stream
	// order, until ctx is done or reading fails; started (nil: none)
	// once every event stored from then on will be fn's.
	Follow(ctx context.Context, started func(), fn func(events.Event)) error
	// Lag says, per partition, up to which event the stored snapshots
	// cover every node's and the stream's newest event
	// (query.Reader.Lag); TailNodes the nodes with events past the
	// checkpoints of lag, each with its newest one's sequence, reading
	// at most limit events a partition (complete false past it).
	// Errors: Lag's match query.ErrNoSnapshots when no reconciler has
	// checkpointed yet.
	Lag(ctx context.Context) (query.SnapshotLag, error)
	TailNodes(ctx context.Context, lag query.SnapshotLag, limit int) (nodes map[string]uint64, complete bool, err error)
	// Sources returns, per node, the files its provisioner could not
	// fill and why (node "" for every node), live from the provisioners'
	// reports (DESIGN.md §12).
	Sources(ctx context.Context, node string) (map[string][]audit.SourceProblem, error)
	// Unanswered returns, of nodes (each its newest knock's cause as its
	// view holds it), those whose newest knock no provisioner answered
	// within audit.KnockGrace of now, each with its audit.NoProvisioner
	// problem (audit.KnockUnanswered: the rule `fleet` applies).
	Unanswered(ctx context.Context, nodes map[string]uint64, now time.Time) (map[string]audit.SourceProblem, error)
}

var _ Source = (*query.Reader)(nil)

// StreamChecker is a [Source] that can say whether the stream answers now
// (a *query.Reader is one: [query.Reader.StreamAnswers]). The console asks
// it every streamPoll, and its fleet page says when the stream does not
// answer: what it shows is then as of the last event it saw, not of now.
// A Source that is not one is taken to answer.
type StreamChecker interface {
	// StreamAnswers returns nil when the stream's leader answers, else
	// why not.
	StreamAnswers(ctx context.Context) error
}

var _ StreamChecker = (*query.Reader)(nil)

// StoreChecker is a [StreamChecker] that can say whether serve's store
// takes writes (a *query.Reader is one: [query.Reader.StoreStatus]). A
// store that takes none still answers every read, so the stream answers
// while nothing is stored: the console asks it beside StreamAnswers, and
// its fleet page opens with it (a fresh user's finding G1: fleet said
// all was well while the stream took no write for 10 minutes).
type StoreChecker interface {
	StoreStatus(ctx context.Context) (store.StoreStatus, error)
}

var _ StoreChecker = (*query.Reader)(nil)
