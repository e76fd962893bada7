package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// stalledTail is an EndOnLoss tail with 500 ms heartbeats, from the
// stream's first message (stored), whose client reaches the server
// through a proxy: the proxy's stall holds the heartbeats, as a loaded
// machine starving the client or the server for two of them does.
// lossAsk bounds its ask of the consumer after missed heartbeats.
func stalledTail(t *testing.T, lossAsk time.Duration) (context.Context, *storetest.Proxy, *store.Publisher, *store.Tail) {
	t.Helper()
	ctx := testCtx(t)
	e, _, direct, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	proxy := storetest.StartProxy(t, strings.TrimPrefix(e.ClientURL(), "nats://"))
	nc, err := nats.Connect(proxy.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(direct, cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", knock(1)); err != nil {
		t.Fatal(err)
	}
	tail, err := store.Follow(ctx, js, store.WithLossAsk(store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(),
		Heartbeat: 500 * time.Millisecond, EndOnLoss: true}, lossAsk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tail.Stop)
	return ctx, proxy, pub, tail
}

// An EndOnLoss tail whose heartbeats were missed, its consumer still on
// its server, reads on: the consumer answers the ask that follows, and
// the client has pulled again. Missed heartbeats alone ended the tail
// (CI: "the tail's consumer was lost: nats: no heartbeat received"
// before any stepdown, under load), and a reconciler's partition or a
// node's feed moved to a new consumer, asked of the meta leader, with a
// warning, for a consumer that lived.
func TestTailReadsOnAfterMissedHeartbeats(t *testing.T) {
	t.Parallel()
	// The ask gets a minute: the stall ends when the client has
	// reported the missed heartbeats, however loaded the machine.
	ctx, proxy, pub, tail := stalledTail(t, time.Minute)
	if m, err := tail.Next(ctx); err != nil || m.Event.Seq != 1 {
		t.Fatalf("first message: %+v, %v", m.Event, err)
	}
	proxy.Stall()
	waitfor.Until(t, time.Minute, "the client's report of missed heartbeats", func() bool { return tail.HeartbeatsMissed() > 0 })
	proxy.Resume()
	if _, err := pub.Append(ctx, "ace", knock(2)); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := tail.Next(rctx)
	if err != nil || m.Event.Seq != 2 {
		t.Fatalf("after %d reports of missed heartbeats: %+v, %v; want message 2", tail.HeartbeatsMissed(), m.Event, err)
	}
}

// An EndOnLoss tail whose heartbeats were missed and whose consumer does
// not answer within the ask's bound (its server stopped, or the way to
// it) ends with ErrConsumerLost, saying both.
func TestTailEndsWhenMissedHeartbeatsGoUnanswered(t *testing.T) {
	t.Parallel()
	// The stall holds the ask too, until the tail ended. Whether the
	// first message came before it does not matter.
	ctx, proxy, _, tail := stalledTail(t, 200*time.Millisecond)
	proxy.Stall()
	defer proxy.Resume()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	m, err := tail.Next(rctx)
	if err == nil && m.Event.Seq == 1 {
		_, err = tail.Next(rctx)
	}
	if !errors.Is(err, store.ErrConsumerLost) || !errors.Is(err, jetstream.ErrNoHeartbeat) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("heartbeats and the ask held: %v; want ErrConsumerLost, no heartbeat and the ask's deadline", err)
	}
	t.Log(err)
}
