package store

import (
	"context"
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
	cfg = cfg.WithDefaults()
	counts := map[string]int{}
	t, err := Follow(ctx, js, TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(),
		Filter: "*." + cfg.Prefix + ".*." + string(events.KindJournal), StartTime: since})
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	defer t.Stop()
	if t.Empty() {
		return counts, nil
	}
	for {
		m, err := t.Next(ctx)
		if err != nil {
			return nil, fmt.Errorf("read journal: %w", err)
		}
		if j, ok := m.Event.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
			counts[m.Event.Node]++
		}
		if m.Pending == 0 {
			return counts, nil
		}
	}
}
