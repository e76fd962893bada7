package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Several partitions writing snapshots at once through one connection
// whose async-publish pending limit is far below their puts (the 100,000
// node refold: 16 partitions of up to 1,024 puts against the default
// 4,000) all succeed: a full pending limit is backpressure, not a
// failure. Each write's revisions are the bucket's, so the next
// conditional write does not conflict; a stale revision still does.
func TestPutNodesAtSharedPendingLimit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, _, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16))
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Another writer on the connection fills its pending limit with
	// publishes answered only after a second, longer than a publish
	// waits for room (200 ms): the first snapshot puts meet a stall.
	slow, err := nc.Subscribe("slow.>", func(m *nats.Msg) {
		time.AfterFunc(time.Second, func() { _ = m.Respond([]byte(`{"stream":"SLOW","seq":1}`)) })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if _, err := js.PublishAsync(fmt.Sprintf("slow.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	const partitions, nodes, rounds = 6, 300, 2
	revs := putRounds(t, ctx, snaps, partitions, nodes, rounds)
	for p := range partitions {
		if len(revs[p]) != nodes {
			t.Fatalf("partition %d: %d revisions recorded, want %d", p, len(revs[p]), nodes)
		}
	}
	// A stale expected revision is still refused.
	node := "n0-0"
	stale := map[string]uint64{node: revs[0][node] - 1}
	err = snaps.PutNodesAt(ctx, 0, map[string][]byte{node: []byte("stale")}, stale)
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale put: %v, want ErrConflict", err)
	}
}

// Snapshot puts sent through a Publisher (Snapshots.PublishThrough) share
// its pending limit with its other publishes: a full limit is
// backpressure, as the client's is, every put lands at its revision, and
// a stale revision is still refused with ErrConflict. They do not go
// through the JetStream context the bucket was opened with: its pending
// limit is held full for longer than the test, and the puts do not wait
// for it.
func TestPutNodesThroughPublisher(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, _, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1))
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects(), store.WithMaxPending(16))
	snaps.PublishThrough(pub)
	// The context's limit: full until after the test's deadline.
	never, err := nc.Subscribe("never.>", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer never.Unsubscribe()
	// The Publisher's: full for a second, longer than a send waits for
	// room (200 ms).
	slow, err := nc.Subscribe("slow.>", func(m *nats.Msg) {
		time.AfterFunc(time.Second, func() { _ = m.Respond([]byte(`{"stream":"SLOW","seq":1}`)) })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishAsync("never.0", nil); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if _, err := pub.ResendMsgAsync(&nats.Msg{Subject: fmt.Sprintf("slow.%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	const partitions, nodes, rounds = 4, 200, 2
	revs := putRounds(t, ctx, snaps, partitions, nodes, rounds)
	for p := range partitions {
		for node, rev := range revs[p] {
			got, at, err := snaps.NodeAt(ctx, p, node)
			if err != nil || at != rev || string(got) != "state 1" {
				t.Fatalf("%s: %q at %d (%v), want %q at %d", node, got, at, err, "state 1", rev)
			}
		}
		if len(revs[p]) != nodes {
			t.Fatalf("partition %d: %d revisions recorded, want %d", p, len(revs[p]), nodes)
		}
	}
	node := "n0-0"
	stale := map[string]uint64{node: revs[0][node] - 1}
	err = snaps.PutNodesAt(ctx, 0, map[string][]byte{node: []byte("stale")}, stale)
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale put: %v, want ErrConflict", err)
	}
}

// putRounds puts rounds of nodes' states ("state <round>") in each of
// partitions, the partitions at once, and returns each partition's
// revisions as PutNodesAt recorded them.
func putRounds(t *testing.T, ctx context.Context, snaps *store.Snapshots, partitions, nodes, rounds int) []map[string]uint64 {
	t.Helper()
	revs := make([]map[string]uint64, partitions)
	errc := make(chan error, partitions)
	for p := range partitions {
		revs[p] = map[string]uint64{}
		go func() {
			for round := range rounds {
				states := make(map[string][]byte, nodes)
				for i := range nodes {
					states[fmt.Sprintf("n%d-%d", p, i)] = fmt.Appendf(nil, "state %d", round)
				}
				if err := snaps.PutNodesAt(ctx, p, states, revs[p]); err != nil {
					errc <- fmt.Errorf("partition %d round %d: %w", p, round, err)
					return
				}
			}
			errc <- nil
		}()
	}
	for range partitions {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	return revs
}
