package engine

import (
	"context"
	"fmt"
	"log/slog"
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
	// aged is the stream's first sequence when an aged-out gap was last
	// noted.
	aged uint64
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
//
// The line is the one r.log.Info or r.log.Warn("journaled", "node", …,
// "level", …, "cause", …, "msg", …) writes, built as a record handed to
// the logger's handler: slog.Logger takes the caller's program counter
// for every record (runtime.Callers, a fifth of the call), which no
// handler of meshfold prints (no AddSource), and the level as an
// events.Level is an any that the text handler formats through fmt. A
// dense live fold logs a line for a fifth of its inputs (issue 27).
func (r *Reconciler) logJournal(e reconcile.Effect) {
	j, ok := e.Payload.(*events.Journal)
	if !ok {
		return
	}
	level := slog.LevelInfo
	switch j.Level {
	case events.LevelError, events.LevelWarn:
		level = slog.LevelWarn
	}
	h, ctx := r.log.Handler(), context.Background()
	if !h.Enabled(ctx, level) {
		return
	}
	rec := slog.NewRecord(time.Now(), level, "journaled", 0)
	rec.AddAttrs(slog.String("node", e.Node), slog.String("level", string(j.Level)),
		slog.Uint64("cause", j.Cause), slog.String("msg", j.Msg))
	_ = h.Handle(ctx, rec) // as slog.Logger, which drops a handler's error
}

// agedOut notes, once per gap, that the stream begins at first, past a
// partition's checkpoint + 1: the events at sequences checkpoint+1 ..
// first-1 aged out of the stream (--max-age, a size limit) before they
// were folded, and whatever of them belonged to the partition's nodes is
// missing from their states. The stream's first sequence is the same for
// every partition, so the first partition to see a gap notes it on the
// fleet journal (which nodes lost events is no longer knowable), and logs
// it.
func (r *Reconciler) agedOut(ctx context.Context, partition int, checkpoint, first uint64) {
	r.fleet.mu.Lock()
	noted := r.fleet.aged >= first
	r.fleet.aged = max(r.fleet.aged, first)
	r.fleet.mu.Unlock()
	if noted {
		return
	}
	msg := fmt.Sprintf("events up to sequence %d aged out of the stream before they were folded (partition %d's checkpoint was %d): the states of nodes whose events they were miss them",
		first-1, partition, checkpoint)
	r.log.Error("events aged out of the stream before they were folded", "partition", partition, "checkpoint", checkpoint, "stream_first", first)
	j := events.Stamp(&events.Journal{Level: events.LevelError, Msg: msg, Cause: first}, time.Now())
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	if _, err := r.pub.Append(ctx, events.FleetNode, j); err != nil {
		r.log.Warn("fleet journal entry not published", "err", err)
	}
}
