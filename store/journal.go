package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
)

// JournalWarnings counts, per node, the journal entries of level warn or
// error stored at or after since, in one ordered read of the journal
// subjects (DESIGN.md §6: what `meshfold fleet` and the web console show
// as journal warnings). A message whose subject or payload cannot be read
// is not counted.
//
// Errors: the consumer's errors, ctx's error.
func JournalWarnings(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, since time.Time) (map[string]int, error) {
	seqs, err := JournalWarningSeqs(ctx, js, cfg, since)
	if err != nil {
		return nil, err
	}
	counts := make(map[string]int, len(seqs))
	for node, s := range seqs {
		counts[node] = len(s)
	}
	return counts, nil
}

// JournalWarningSeqs is [JournalWarnings] with the stream sequence of each
// entry, per node, in stream order: what tells a warning older than the
// node's convergence from a newer one (issue 25).
//
// Errors: as JournalWarnings.
func JournalWarningSeqs(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, since time.Time) (map[string][]uint64, error) {
	cfg = cfg.WithDefaults()
	counts := map[string][]uint64{}
	filter := "*." + cfg.Prefix + ".*." + string(events.KindJournal)
	// The newest journal entry as the stream's leader has it bounds the
	// read, as ReadNode's: the consumer may be placed on a replica behind
	// the leader, whose count of pending messages then ends before
	// entries the stream acknowledged. Only the bound's removal (a limit,
	// meanwhile) ends the read short of it.
	leader := Leader(js, cfg.Name)
	last, err := leader.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return counts, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read journal: last entry: %w", err)
	}
	if last.Time.Before(since) {
		return counts, nil
	}
	end := last.Sequence
	// Its consumer's creation rides out a meta leader's election.
	t, err := FollowRidingOut(ctx, js, TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), Filter: filter, StartTime: since})
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	defer t.Stop()
	if t.Empty() && leader.Removed(ctx, end) {
		return counts, nil
	}
	for {
		x, gone, err := t.NextUpTo(ctx, leader, end)
		if err != nil {
			return nil, fmt.Errorf("read journal: %w", err)
		}
		if gone {
			return counts, nil // end was removed meanwhile
		}
		m := t.Decode(x)
		if m.Event.Seq > end {
			return counts, nil // end was removed meanwhile
		}
		if j, ok := m.Event.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
			counts[m.Event.Node] = append(counts[m.Event.Node], m.Event.Seq)
		}
		if m.Event.Seq == end || (m.Pending == 0 && leader.Removed(ctx, end)) {
			return counts, nil
		}
	}
}
