package query

import (
	"context"
	"fmt"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// Follow calls fn with every event stored from now on, in stream order,
// until ctx is done (then it returns nil) or reading fails. started (nil:
// none) is called once the server delivers to it every event stored from
// then on: an event stored before it is called is one a reader must read
// otherwise (the console reads the snapshots' lag after it). A message
// that is no valid event (a subject naming no valid node) is skipped:
// there is nothing of it to show.
//
// Errors: the stream's lookup errors; the read's errors.
func (r *Reader) Follow(ctx context.Context, started func(), fn func(events.Event)) error {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return err
	}
	// The consumer's creation rides out a meta leader's election
	// (store.FollowRidingOut: one ask sent while there is none is never
	// answered).
	t, err := store.FollowRidingOut(ctx, r.js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), New: true})
	if err != nil {
		return fmt.Errorf("follow: %w", err)
	}
	defer t.Stop()
	if started != nil {
		started() // store.Follow returns once its consumer is on the server
	}
	for {
		m, err := t.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow: %w", err)
		}
		if m.Event.Kind == "" {
			continue // a subject naming no valid node: nothing to show
		}
		fn(m.Event)
	}
}
