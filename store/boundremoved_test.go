package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// trimmedRead is a stream of n events of ace's (of kind journal at warn
// level, or want), then one of bob's, and a function that sets the
// stream's MaxMsgs to 1: a limit that removes every one of ace's, its
// newest (a bounded read's end) too.
func trimmedRead(t *testing.T, n int, journals bool) (jetstream.JetStream, store.StreamConfig, uint64, func()) {
	t.Helper()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx := testCtx(t)
	pub := store.NewPublisher(js, cfg.Subjects())
	var futures []jetstream.PubAckFuture
	for i := range n {
		var p events.Payload = want("pg:1")
		if journals {
			p = events.Stamp(&events.Journal{Level: events.LevelWarn, Msg: "warning", Cause: uint64(i + 1)}, t0)
		}
		f, err := pub.AppendAsync(ctx, "ace", p)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	var end uint64
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			end = max(end, ack.Sequence)
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if _, err := pub.Append(ctx, "bob", want("pg:1")); err != nil {
		t.Fatal(err)
	}
	trim := func() {
		c := stream.CachedInfo().Config
		c.MaxMsgs = 1
		if _, err := js.UpdateStream(context.Background(), c); err != nil {
			t.Error(err)
		}
	}
	return js, cfg, end, trim
}

// trimmedEvents is how many events of ace's the reads below are given:
// more than the client pulls in one batch (500), so that its first read
// delivers only some and the limit removes the rest before they are.
const trimmedEvents = 3000

// TestReadNodeEndsWhenALimitRemovesItsEnd: a ReadNode whose end (the
// node's newest event as the leader had it) a limit removes while the
// read is under way, before its consumer delivered it, ends short of it,
// without error, soon: it waited until its context ended (reviewer's
// finding; store.Tail.NextUpTo asks the leader again while it waits).
func TestReadNodeEndsWhenALimitRemovesItsEnd(t *testing.T) {
	t.Parallel()
	js, cfg, end, trim := trimmedRead(t, trimmedEvents, false)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var once sync.Once
	var last uint64
	started := time.Now()
	err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), "ace", 0, 0, func(m store.Msg) error {
		once.Do(trim) // the end goes while the read is under way
		last = m.Event.Seq
		return nil
	})
	if err != nil {
		t.Fatalf("ReadNode after its end was removed: %v (after %v)", err, time.Since(started))
	}
	if last >= end {
		t.Fatalf("ReadNode read up to #%d, its end: the limit removed nothing it had not read", last)
	}
	t.Logf("read up to #%d of #%d in %v", last, end, time.Since(started).Round(time.Millisecond))
}

// TestNextUpToEndsWhenTheEndIsRemoved: a tail that has not delivered its
// read's end waits while the leader holds it, and returns gone once a
// limit removed it: what ReadNode, JournalWarningSeqs and
// query.TailNodes wait with.
func TestNextUpToEndsWhenTheEndIsRemoved(t *testing.T) {
	t.Parallel()
	js, cfg, end, trim := trimmedRead(t, 1, false)
	ctx := testCtx(t)
	// Past end: the tail delivers nothing of ace's.
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), Filter: cfg.Subjects().StoredNode("ace"), Start: end + 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	leader := store.Leader(js, cfg.Name)
	wctx, cancel := context.WithTimeout(ctx, 1200*time.Millisecond)
	defer cancel()
	if _, gone, err := tail.NextUpTo(wctx, leader, end); gone || err != context.DeadlineExceeded {
		t.Fatalf("NextUpTo with its end held: gone %v, %v; want it waiting", gone, err)
	}
	trim()
	if _, gone, err := tail.NextUpTo(ctx, leader, end); !gone || err != nil {
		t.Fatalf("NextUpTo with its end removed: gone %v, %v", gone, err)
	}
}
