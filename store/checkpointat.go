package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// CheckpointAt is [Snapshots.Checkpoint] with the time the checkpoint
// was stored (the key's revision time, server clock): how old a reader's
// view of the partition's states is. seq 0 and a zero time when none is
// stored.
//
// Errors: the get's; a value that is no decimal sequence.
func (s *Snapshots) CheckpointAt(ctx context.Context, partition int) (seq uint64, at time.Time, err error) {
	e, err := s.kv.Get(ctx, checkpointKey(partition))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("get checkpoint of partition %d: %w", partition, err)
	}
	seq, err = strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("checkpoint of partition %d: %q: %w", partition, e.Value(), err)
	}
	return seq, e.Created(), nil
}
