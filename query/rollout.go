package query

import (
	"context"
	"errors"
	"maps"
	"slices"

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
	s, err := feed.Replay(ctx, r.js, cfg, nil, fleet)
	if err != nil {
		return nil, err
	}
	r.heldHaves(ctx, s)
	return s, nil
}

// heldHaves gives each of the rollout's nodes of which neither the
// rollout nor the stream holds a have (its haves aged out: --max-age)
// the newest have the reconciler's state holds, when older than the
// start (rollout.State.SetEarlierHave): what it runs, for the delivery
// view's RUNNING and builds (a fresh user's finding F8: both were blank
// for the nodes whose haves had aged out, while state and fleet knew
// what they run). It asks the state service alone, one request per such
// node, and stops asking at the first that fails (no reconciler, or
// credentials that may not ask): the view then says what the stream
// holds, as before.
func (r *Reader) heldHaves(ctx context.Context, s *rollout.State) {
	ro := s.Rollout
	if ro == nil {
		return
	}
	for _, name := range slices.Sorted(maps.Keys(ro.Nodes)) {
		n := ro.Nodes[name]
		if n.Have != nil || n.Earlier != nil {
			continue
		}
		v, _, err := r.Live(ctx, name)
		if errors.Is(err, ErrUnknownNode) {
			continue
		}
		if err != nil {
			return
		}
		if v.HaveSeq == 0 || v.HaveSeq >= ro.ID {
			continue
		}
		h := &rollout.Have{Modules: make([]rollout.HaveModule, len(v.Runtime))}
		for i, m := range v.Runtime {
			h.Modules[i] = rollout.HaveModule{Name: m.Module, Build: m.Build, State: m.State, Health: m.Health, Restarts: m.Restarts, Exit: m.Exit}
		}
		s.SetEarlierHave(name, v.HaveSeq, v.HaveTime, h)
	}
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

// RolloutFleetsWithoutStart returns the fleets the stream holds rollout
// events of but no start (it aged out: feed.FleetsWithoutStart), sorted.
//
// Errors: the stream's lookup and info errors.
func (r *Reader) RolloutFleetsWithoutStart(ctx context.Context) ([]string, error) {
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	return feed.FleetsWithoutStart(ctx, stream, cfg.Subjects())
}

// RolloutRemains returns what the stream holds of fleet's newest rollout
// whose start its limits dropped (feed.ReadRemains): what `rollout ls`
// and the console's rollouts page list as "start gone".
//
// Errors: the stream's lookup, info, reads and follow.
func (r *Reader) RolloutRemains(ctx context.Context, fleet string) (feed.Remains, error) {
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return feed.Remains{}, err
	}
	return feed.ReadRemains(ctx, r.js, stream, cfg, fleet)
}
