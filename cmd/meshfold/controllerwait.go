package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// DefaultControllerWait is how long apply waits, by default, for a rollout
// controller to record the rollout it started (--wait). A live controller
// records it "running" as soon as it folds the start and its pages:
// milliseconds after the publish (rollout.Record, the fold's load).
const DefaultControllerWait = 2 * time.Second

// awaitController waits, at most wait, for a rollout controller's first
// fact on fleet's rollout subjects after the start at id: a record,
// published, refused or tick (rollout.ControllerFact's kinds; each is
// published only by a controller, store/auth's controller role). It reads
// the stream, as 'rollout status' does, with the operator's reads: an
// ordered consumer from id+1 over the fleet's rollout subjects. A fact in
// time: it returns at once, saying nothing (the common case costs the
// controller's own latency, not the wait). None: a note on stderr says
// that nothing steps the rollout until a controller runs and what to
// check (rollout.ControllerCheck), before 'rollout status' could say
// "unattended" (rollout.UnattendedAfter, 30 s). It never fails the
// command: the start is stored, and a controller started later takes it.
func (a *app) awaitController(ctx context.Context, js jetstream.JetStream, scfg store.StreamConfig, fleet string, id uint64, wait time.Duration) {
	if wait <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	none := func() {
		fmt.Fprintf(a.stderr, "note: no rollout controller recorded rollout %d of fleet %s within %s: nothing steps it until one runs "+
			"(one taking over from a controller that died waits out its lease TTL first, %s by default). %s "+
			"'meshfold rollout status %s' says \"unattended\" once a step it owes has waited %s\n",
			id, fleet, wait, engine.DefaultLeaseTTL, rollout.ControllerCheck, fleet, rollout.UnattendedAfter)
	}
	unread := func(err error) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			none()
			return
		}
		if ctx.Err() != nil {
			return // interrupted: nothing to say
		}
		fmt.Fprintf(a.stderr, "note: whether a rollout controller took rollout %d could not be read: %v; 'meshfold rollout status %s' says what it does\n", id, err, fleet)
	}
	subj := scfg.Subjects()
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: scfg.Name, Subjects: subj, Filter: subj.Rollout(fleet, "*"), Start: id + 1})
	if err != nil {
		unread(err)
		return
	}
	defer tail.Stop()
	for {
		select {
		case x := <-tail.C():
			if x.Err != nil {
				unread(x.Err)
				return
			}
			if _, kind, _ := subj.ParseRollout(x.Msg.Subject()); isControllerKind(rollout.Kind(kind)) {
				return
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				none()
			}
			return
		}
	}
}

// isControllerKind reports whether k is one of the rollout controller's
// own events (rollout.ControllerFact).
func isControllerKind(k rollout.Kind) bool {
	switch k {
	case rollout.KindRecord, rollout.KindPublished, rollout.KindRefused, rollout.KindTick:
		return true
	}
	return false
}
