package query

import (
	"context"
	"time"

	"github.com/meshfold/meshfold/store"
)

// FeedsLost returns, per node, since when its live agent has read no
// plan, as the agents' leases say it now (store.FeedsLost): of node, or
// of every node when node is "". A node whose agent reads its plans, or
// whose agent is of a build that does not say it, is absent. Live, like
// [Reader.Sources]: the snapshots cannot hold it (a reconciler folds
// events, and an agent that lost its feed published none).
//
// Errors: the stream's lookup; the lease bucket's read.
func (r *Reader) FeedsLost(ctx context.Context, node string) (map[string]time.Time, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	var of []string
	if node != "" {
		of = []string{node}
	}
	return store.FeedsLost(ctx, r.js, cfg, of)
}
