package store_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A tail with EndOnLoss (the reconciler's partitions) asks for its next
// pull only once the last one's messages are all delivered: every pull
// asks for a full batch. The client's default asks again when half are
// pending (a pull of 251 while the last one is still delivering), and
// such overlapping pulls on a connection that also carries asynchronous
// publishes went unanswered now and then (benchmarks.md, "The raw
// pipeline's 10 s stalls"), a read stalled until two heartbeats missed.
func TestTailPullsOneBatchAtATime(t *testing.T) {
	ctx := testCtx(t)
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	data, err := events.Encode(knock(1))
	if err != nil {
		t.Fatal(err)
	}
	const n = 1300
	subj := cfg.Subjects().Event("ace", events.KindKnock)
	for range n {
		if _, err := js.PublishAsync(subj, data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acknowledged")
	}
	var mu sync.Mutex
	var batches []int
	sub, err := nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT.>", func(m *nats.Msg) {
		var req struct {
			Batch int `json:"batch"`
		}
		if err := json.Unmarshal(m.Data, &req); err == nil {
			mu.Lock()
			batches = append(batches, req.Batch)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), Heartbeat: time.Second, EndOnLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	for i := range n {
		if m, err := tail.Next(ctx); err != nil || m.Event.Seq != uint64(i+1) {
			t.Fatalf("message %d: %+v, %v", i+1, m.Event, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) < 3 {
		t.Fatalf("pulls %v: want at least three to read %d messages", batches, n)
	}
	for _, b := range batches {
		if b != batches[0] {
			t.Fatalf("pulls asked for %v messages: want every one a full batch (%d), none asked while another was delivering", batches, batches[0])
		}
	}
}
