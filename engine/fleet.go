package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// FleetJournalEvery is the least time between two entries of the
// fleet-wide journal (<prefix>._fleet.journal): a flood of events on
// subjects that name no valid node makes one entry per interval, with
// their count, not one per event.
const FleetJournalEvery = 10 * time.Second

// fleetJournal counts the events whose subject names no valid node since
// its last entry. It is shared by every partition of a Reconciler.
type fleetJournal struct {
	mu      sync.Mutex
	count   int
	first   uint64 // the sequence of the first counted
	example string // its subject
	last    time.Time
}

// badSubject counts a message whose subject names no valid node, for the
// fleet journal's next entry. A session reads from its checkpoint, so a
// restart counts again only what the last checkpoint did not cover.
func (r *Reconciler) badSubject(ctx context.Context, seq uint64, subject string) {
	r.m.BadSubject.Inc()
	f := &r.fleet
	f.mu.Lock()
	if f.count == 0 {
		f.first, f.example = seq, subject
	}
	f.count++
	f.mu.Unlock()
	r.flushFleet(ctx)
}

// flushFleet writes the fleet journal's entry when one is due: something
// was counted and the last entry is FleetJournalEvery old.
func (r *Reconciler) flushFleet(ctx context.Context) {
	f := &r.fleet
	f.mu.Lock()
	if f.count == 0 || time.Since(f.last) < r.cfg.FleetJournalEvery {
		f.mu.Unlock()
		return
	}
	n, first, example := f.count, f.first, f.example
	f.count, f.last = 0, time.Now()
	f.mu.Unlock()
	msg := fmt.Sprintf("%d event(s) on subjects that name no valid node, not folded; the first at sequence %d, on %s",
		n, first, events.Short(example))
	r.log.Warn("events on subjects that name no valid node, not folded", "count", n, "first_seq", first, "subject", events.Short(example))
	j := events.Stamp(&events.Journal{Level: events.LevelError, Msg: msg, Cause: first}, time.Now())
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	if _, err := r.pub.Append(ctx, events.FleetNode, j); err != nil {
		r.log.Warn("fleet journal entry not published", "err", err)
	}
}

// fleetLoop writes the fleet journal's due entries until ctx is done; a
// last one on the way out.
func (r *Reconciler) fleetLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.FleetJournalEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.flushFleet(context.WithoutCancel(ctx))
			return
		case <-t.C:
			r.flushFleet(ctx)
		}
	}
}

// logJournal logs a journal effect once it is published: a rejection is
// logged once, by the session that stores its entry, not again on every
// refold (a refold finds the entry stored and skips it).
func (r *Reconciler) logJournal(e reconcile.Effect) {
	j, ok := e.Payload.(*events.Journal)
	if !ok {
		return
	}
	log := r.log.Info
	switch j.Level {
	case events.LevelError, events.LevelWarn:
		log = r.log.Warn
	}
	log("journaled", "node", e.Node, "level", j.Level, "cause", j.Cause, "msg", j.Msg)
}
