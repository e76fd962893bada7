package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// reads is how many times the tests below read while a replica is held
// behind: a read goes to one of the three servers, at random, so the
// held one answers a direct get a third of the time, and 60 reads all
// miss it once in 10^10 runs.
const reads = 60

// A read from the leader (store.LeaderReads: LastMsg, a get by
// sequence) sees a write the stream acknowledged, while a
// replica is behind and answers direct gets with what it had: on a real
// 3-server cluster whose third server's replication is held
// (storetest.Lag), right after the ack. (ReadNode's bound is read so
// too; its consumer cannot be created while a server's system routes are
// held, so it is not read here.)
func TestLeaderReadsSeeAcknowledgedWrites(t *testing.T) {
	c, lag := storetest.StartLaggingCluster(t, 3)
	js := connectTo(t, c.Servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	want := func() *events.Want { return events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()) }
	first, err := pub.Append(ctx, "ace", want())
	if err != nil {
		t.Fatal(err)
	}
	c.WaitDirectGets(cfg.Name)
	leader := c.StreamLeader(cfg.Name)
	held := c.Servers[2]
	if held == leader {
		held = c.Servers[1]
	}
	lag.Hold(held.Name())
	defer lag.Release()
	ack, err := pub.Append(ctx, "ace", want())
	if err != nil {
		t.Fatal(err)
	}
	// The lever works: the held replica answers direct gets with the
	// want before.
	stale := 0
	for range reads {
		m, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindWant)
		if err != nil {
			t.Fatal(err)
		}
		if m.Event.Seq == first.Seq {
			stale++
		}
	}
	if stale == 0 {
		t.Fatalf("no direct get of %d answered by the held replica", reads)
	}
	t.Logf("%d of %d direct gets answered by the held replica", stale, reads)
	// Connected to the third server (neither the leader nor the held
	// one: the request must find the leader), and to the leader. (The
	// held server's own clients reach no JetStream API: the hold holds
	// the system account's routes, where API requests travel too.)
	var conns []jetstream.JetStream
	for _, srv := range c.Servers {
		if srv != held {
			conns = append(conns, connectTo(t, srv))
		}
	}
	for _, js := range conns {
		l := store.Leader(js, cfg.Name)
		for range reads {
			m, err := store.LastMsg(ctx, l, cfg.Subjects(), "ace", events.KindWant)
			if err != nil || m.Event.Seq != ack.Seq {
				t.Fatalf("LastMsg from the leader: seq %d, %v; acknowledged at %d", m.Event.Seq, err, ack.Seq)
			}
			raw, err := l.GetMsg(ctx, ack.Seq)
			if err != nil || raw.Sequence != ack.Seq || raw.Header.Get(jetstream.MsgIDHeader) != m.MsgID {
				t.Fatalf("GetMsg(%d) from the leader: %+v, %v", ack.Seq, raw, err)
			}
		}
	}
	if _, err := store.Leader(js, cfg.Name).GetLastMsgForSubject(ctx, cfg.Subjects().Stored("nobody", events.KindWant)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("no message from the leader: %v, want jetstream.ErrMsgNotFound", err)
	}
	if _, err := store.LastMsg(ctx, store.Leader(js, cfg.Name), cfg.Subjects(), "nobody", events.KindWant); !errors.Is(err, store.ErrNoMessage) {
		t.Fatalf("LastMsg of no message from the leader: %v, want store.ErrNoMessage", err)
	}
}

// connectTo connects to srv alone.
func connectTo(t *testing.T, srv *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
