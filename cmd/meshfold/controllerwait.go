package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/query"
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
// controller's own latency, not the wait). None: it reads the fleet's
// controller lease (r: query.Reader.ControllerHolder). A live holder
// (renewed within half its TTL) is a controller that has not recorded the
// rollout yet, as one refolding after a lost consumer (a fresh user's
// finding m2: recorded 2.2 s on, while the note asked whether one ran):
// apply waits as long again, and if it still has not, a note names the
// holder and says it has not recorded it yet. A holder that stopped
// renewing: a note says it is gone or stalled and when its lease expires.
// No holder, or a lease apply's credentials may not read: a note says
// that nothing steps the rollout until a controller runs and what to
// check (rollout.ControllerCheck), before 'rollout status' could say
// "unattended" (rollout.UnattendedAfter, 30 s). It never fails the
// command: the start is stored, and a controller started later takes it.
func (a *app) awaitController(ctx context.Context, js jetstream.JetStream, r *query.Reader, scfg store.StreamConfig, fleet string, id uint64, wait time.Duration) {
	if wait <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	waited, extended := wait, false
	none := func() {
		fmt.Fprintf(a.stderr, "note: no rollout controller recorded rollout %d of fleet %s within %s: nothing steps it until one runs "+
			"(one taking over from a controller that died waits out its lease TTL first, %s by default). %s "+
			"'meshfold rollout status %s' says \"unattended\" once a step it owes has waited %s\n",
			id, fleet, waited, engine.DefaultLeaseTTL, rollout.ControllerCheck, fleet, rollout.UnattendedAfter)
	}
	// expired says what the lease says once the wait is over, or, for a
	// live holder the first time, waits as long again (true).
	expired := func() (again bool) {
		hctx, hcancel := context.WithTimeout(ctx, holdersWait)
		h, ttl, err := r.ControllerHolder(hctx, fleet)
		hcancel()
		now := time.Now()
		switch {
		case err != nil || !h.Held:
			if err != nil && !query.Unreadable(err) {
				fmt.Fprintf(a.stderr, "note: fleet %s's rollout controller lease could not be read: %v\n", fleet, err)
			}
			none()
		case now.Sub(h.Renewed) <= ttl/2 && !extended:
			extended = true
			deadline.Reset(wait)
			waited += wait
			return true
		case now.Sub(h.Renewed) <= ttl/2:
			fmt.Fprintf(a.stderr, "note: the rollout controller of fleet %s, %s (holding its lease since %s, renewed %s ago), has not recorded rollout %d within %s: "+
				"it runs, and has not recorded it yet (a controller refolding after a lost consumer takes seconds); "+
				"'meshfold rollout status %s' shows its steps once it does, and says \"unattended\" if a step it owes waits %s\n",
				fleet, h.Who, h.Since.UTC().Format(time.RFC3339), now.Sub(h.Renewed).Round(100*time.Millisecond), id, waited, fleet, rollout.UnattendedAfter)
		default:
			fmt.Fprintf(a.stderr, "note: the rollout controller of fleet %s, %s, has not recorded rollout %d within %s and has not renewed its lease since %s (%s ago): "+
				"it is gone or stalled; another controller takes the fleet over once the lease expires, at %s (its TTL, %s), and steps the rollout; "+
				"'meshfold rollout status %s' shows when\n",
				fleet, h.Who, id, waited, h.Renewed.UTC().Format("15:04:05.000Z"), now.Sub(h.Renewed).Round(100*time.Millisecond),
				h.Renewed.Add(ttl).UTC().Format("15:04:05Z"), ttl, fleet)
		}
		return false
	}
	unread := func(err error) {
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
		case <-deadline.C:
			if !expired() {
				return
			}
		case <-ctx.Done():
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
