package store_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A node's feed reads a message published after its server (a real
// nats-server process) was killed -9 and started again as soon as its
// connection is back, not two missed heartbeats later (a fresh user's
// finding M4: after every `serve` restart every agent read no plan for
// 10–12 s after it had reconnected, its consumer gone with the server).
// The feed's heartbeat here is 14 s (the client's most with its default
// 30 s pull expiry): the read must come from the tail's ask at the
// reconnect, within a deadline below the 28 s the heartbeats alone take. The feed says the loss once and
// its end once.
func TestFollowNodeReadsAtOnceAfterItsServerRestarts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts a server process: not in -short")
	}
	s := storetest.StartProcServer(t)
	reconnected := make(chan time.Time, 8)
	_, js := s.Connect(t, nats.ReconnectHandler(func(*nats.Conn) {
		select {
		case reconnected <- time.Now():
		default:
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())

	type read struct {
		cause uint64
		at    time.Time
	}
	reads := make(chan read, 8)
	log := &recordLog{}
	fctx, fcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { fcancel(); <-done }()
	go func() {
		defer close(done)
		store.FollowNode(fctx, js, store.NodeFollow{Stream: cfg, Node: "n1", Kind: events.KindKnock,
			Heartbeat: 14 * time.Second, Log: slog.New(log),
			Handle: func(_ context.Context, m store.Msg) {
				reads <- read{cause: m.Event.Payload.(*events.Knock).Cause, at: time.Now()}
			}})
	}()
	awaitRead := func(cause uint64, within time.Duration) time.Time {
		t.Helper()
		timer := time.NewTimer(within)
		defer timer.Stop()
		for {
			select {
			case r := <-reads:
				if r.cause == cause {
					return r.at
				}
				t.Fatalf("read knock %d, want %d", r.cause, cause)
			case <-timer.C:
				t.Fatalf("knock %d not read within %s; the feed's log:\n%s", cause, within, log)
			}
		}
	}
	if _, err := pub.AppendRetrying(ctx, "n1", knock(1)); err != nil {
		t.Fatal(err)
	}
	awaitRead(1, time.Minute)

	s.Stop() // SIGKILL, as kill -9
	s.Restart()
	var back time.Time
	select {
	case back = <-reconnected:
	case <-time.After(time.Minute):
		t.Fatal("the connection did not come back within a minute of the restart")
	}
	if _, err := pub.AppendRetrying(ctx, "n1", knock(2)); err != nil {
		t.Fatal(err)
	}
	// Two missed heartbeats are 28 s from the reconnect: 20 s from the
	// publish is far past the reconnect's ask (one CONSUMER.INFO, then a
	// creation after 0-200 ms) on a loaded machine, short of the
	// heartbeats.
	at := awaitRead(2, 20*time.Second)
	t.Logf("knock published after the restart read %s after the connection came back", at.Sub(back).Round(time.Millisecond))
	said := log.said(map[string]string{"WARN knock feed lost": "lost", "INFO knock feed reads again": "again"})
	if strings.Join(said, ",") != "lost,again" {
		t.Errorf("the feed said %v, want its loss once and its end once:\n%s", said, log)
	}
	if !strings.Contains(log.String(), "gone when the connection came back") {
		t.Errorf("the feed's loss does not say its consumer was gone when the connection came back:\n%s", log)
	}
}

// An EndOnLoss tail whose connection alone dropped (its server and its
// consumer live on) reads on after the reconnect: the consumer answers
// the ask the reconnect makes, and the tail does not end. Taking every
// reconnect for a loss would move every feed of a fleet to a new
// consumer at a network blip.
func TestTailReadsOnAfterAReconnectToALiveConsumer(t *testing.T) {
	t.Parallel()
	ctx, proxy, pub, tail := stalledTail(t, 0)
	if m, err := tail.Next(ctx); err != nil || m.Event.Seq != 1 {
		t.Fatalf("first message: %+v, %v", m.Event, err)
	}
	proxy.Drop()
	waitfor.Until(t, time.Minute, "the reconnect's ask of the consumer", func() bool { return tail.Reasked() > 0 })
	if _, err := pub.Append(ctx, "ace", knock(2)); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := tail.Next(rctx)
	if err != nil || m.Event.Seq != 2 {
		t.Fatalf("after %d reconnects: %+v, %v; want message 2", tail.Reasked(), m.Event, err)
	}
}
