package query

import (
	"context"

	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
)

// Rollout returns fleet's rollout state: its newest rollout refolded from
// its start to the stream's end as it is now (DESIGN.md §11; the state is
// too big to snapshot at 10,000 targets, so every reader refolds, as the
// controller does after a restart). View and Why read it.
//
// Errors: feed.ErrNoRollout when the stream holds no rollout of the
// fleet; the stream's lookup and read errors.
func (r *Reader) Rollout(ctx context.Context, fleet string) (*rollout.State, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	return feed.Replay(ctx, r.js, cfg, nil, fleet)
}

// RolloutFleets returns the fleets the stream holds a rollout of, sorted.
//
// Errors: the stream's lookup and info errors.
func (r *Reader) RolloutFleets(ctx context.Context) ([]string, error) {
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	return feed.Fleets(ctx, stream, cfg.Subjects())
}
