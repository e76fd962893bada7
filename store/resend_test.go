package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestResendOfAStoredCopy pins what the server answers a message sent
// again (ResendAsync) whose first copy is stored, fenced where the first
// was (the subject's last sequence is now the copy's): on a replicated
// stream the message id is checked before the fence, and the answer is a
// duplicate of the copy's sequence; on a single replica the fence is
// checked first, and the answer is a conflict (the engine's ownCopy then
// reads the subject's last message). nats-server v2.15.2.
func TestResendOfAStoredCopy(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 3} {
		var js jetstream.JetStream
		var cfg store.StreamConfig
		if replicas == 1 {
			_, _, js, _, cfg = storetest.StartStream(t, store.StreamConfig{Partitions: 1})
		} else {
			_, _, js, _, cfg = storetest.StartClusterStream(t, 3, store.StreamConfig{Partitions: 1, Replicas: 3})
		}
		pub := store.NewPublisher(js, cfg.Subjects())
		j := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: "effect"}, time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC))
		pr, err := pub.Prepare(t.Context(), "ace", j, store.WithMsgID("ace.journal.1.0"))
		if err != nil {
			t.Fatal(err)
		}
		answer := func(f jetstream.PubAckFuture, err error) (*jetstream.PubAck, error) {
			if err != nil {
				return nil, err
			}
			select {
			case a := <-f.Ok():
				return a, nil
			case err := <-f.Err():
				return nil, store.ServerError(err)
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
				return nil, nil
			}
		}
		first, err := answer(pub.SendAsync(pr, true, 0))
		if err != nil {
			t.Fatalf("R%d: first send: %v", replicas, err)
		}
		again, err := answer(pub.ResendAsync(pr, true, 0))
		switch {
		case replicas == 1 && !errors.Is(err, store.ErrConflict):
			t.Errorf("R1: the copy sent again behind a stale fence: %v %+v, want a conflict", err, again)
		case replicas == 3 && (err != nil || !again.Duplicate || again.Sequence != first.Sequence):
			t.Errorf("R3: the copy sent again behind a stale fence: %v %+v, want a duplicate of %d", err, again, first.Sequence)
		}
	}
}
