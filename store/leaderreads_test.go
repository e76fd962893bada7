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

// leaderReads is how many leader reads the test below makes on each
// connection while the replica is held: the leader alone answers one (a
// replica answers at most a 503, which the read does not take), so a few
// check it as well as many, and the hold is shorter on a loaded machine.
const leaderReads = 10

// A read from the leader (store.LeaderReads: LastMsg, a get by
// sequence, a next message, ReadNode's bound) sees a write the stream acknowledged, while a
// replica is behind and answers direct gets with what it had: on a real
// 3-server cluster whose third server's replication is held
// (storetest.Lag), right after the ack, from a client of any server.
func TestLeaderReadsSeeAcknowledgedWrites(t *testing.T) {
	t.Parallel()
	c, lag := storetest.StartLaggingCluster(t, 3)
	js := connectTo(t, c.Servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	want := func() *events.Want { return events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()) }
	first, err := pub.AppendRetrying(ctx, "ace", want())
	if err != nil {
		t.Fatal(err)
	}
	c.WaitDirectGets(cfg.Name)
	held := c.Follower(cfg.Name)
	lag.Hold(held.Name())
	defer lag.Release()
	ack, err := pub.AppendRetrying(ctx, "ace", want())
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
	// Connected to each server, the held one too.
	var conns []jetstream.JetStream
	for _, srv := range c.Servers {
		conns = append(conns, connectTo(t, srv))
	}
	for _, js := range conns {
		l := store.Leader(js, cfg.Name)
		for range leaderReads {
			m, err := store.LastMsg(ctx, l, cfg.Subjects(), "ace", events.KindWant)
			if err != nil || m.Event.Seq != ack.Seq {
				t.Fatalf("LastMsg from the leader: seq %d, %v; acknowledged at %d", m.Event.Seq, err, ack.Seq)
			}
			raw, err := l.GetMsg(ctx, ack.Seq)
			if err != nil || raw.Sequence != ack.Seq || raw.Header.Get(jetstream.MsgIDHeader) != m.MsgID {
				t.Fatalf("GetMsg(%d) from the leader: %+v, %v", ack.Seq, raw, err)
			}
			// The node's next event past the first, on a wildcard: the
			// acknowledged one; none past it.
			next, err := l.NextMsg(ctx, first.Seq+1, cfg.Subjects().StoredNode("ace"))
			if err != nil || next.Sequence != ack.Seq {
				t.Fatalf("NextMsg(%d) from the leader: %+v, %v; acknowledged at %d", first.Seq+1, next, err, ack.Seq)
			}
			if _, err := l.NextMsg(ctx, ack.Seq+1, cfg.Subjects().StoredNode("ace")); !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Fatalf("NextMsg(%d) past the node's last event: %v, want jetstream.ErrMsgNotFound", ack.Seq+1, err)
			}
		}
	}
	// ReadNode, started while the replica is held, reads up to the
	// newest event as the leader has it: its bound is read from the
	// leader (with a direct get it was the held replica's), and its
	// consumer, which the server may place on the held replica, is
	// waited for past its count of pending messages until it delivers the
	// bound. Each read has delivered its first event before the hold
	// ends.
	type result struct {
		seqs []uint64
		err  error
	}
	n := len(conns) * (reads / 6)
	results, started := make(chan result, n), make(chan struct{}, n)
	for _, js := range conns {
		for range reads / 6 {
			go func() {
				var seqs []uint64
				err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), "ace", 0, 0, func(m store.Msg) error {
					if seqs = append(seqs, m.Event.Seq); len(seqs) == 1 {
						started <- struct{}{}
					}
					return nil
				})
				results <- result{seqs, err}
			}()
		}
	}
	for range n {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the reads did not start")
		}
	}
	lag.Release()
	for range n {
		if r := <-results; r.err != nil || len(r.seqs) != 2 || r.seqs[1] != ack.Seq {
			t.Fatalf("ReadNode read %v, %v; the node's events are at %d and %d", r.seqs, r.err, first.Seq, ack.Seq)
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

// TestJournalWarningsReadToTheLeadersEnd: JournalWarningSeqs, started
// while a replica is held behind its leader, counts every warning the
// stream acknowledged before the call: its read is bounded by the newest
// journal entry as the leader has it, and its consumer, which the server
// may place on the held replica, is waited for past its count of pending
// messages (it reported nothing pending at the held replica's end, and
// the read stopped there).
func TestJournalWarningsReadToTheLeadersEnd(t *testing.T) {
	t.Parallel()
	c, lag := storetest.StartLaggingCluster(t, 3)
	js := connectTo(t, c.Servers[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	warn := func() *events.Journal {
		return events.Stamp(&events.Journal{Level: events.LevelWarn, Msg: "warning"}, time.Now())
	}
	first, err := pub.AppendRetrying(ctx, "ace", warn())
	if err != nil {
		t.Fatal(err)
	}
	c.WaitDirectGets(cfg.Name)
	held := c.Follower(cfg.Name)
	lag.Hold(held.Name())
	defer lag.Release()
	ack, err := pub.AppendRetrying(ctx, "ace", warn())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		seqs []uint64
		err  error
	}
	var conns []jetstream.JetStream
	for _, srv := range c.Servers {
		conns = append(conns, connectTo(t, srv))
	}
	n := len(conns) * (reads / 6)
	results := make(chan result, n)
	for _, js := range conns {
		for range reads / 6 {
			go func() {
				seqs, err := store.JournalWarningSeqs(ctx, js, cfg, time.Time{})
				results <- result{seqs["ace"], err}
			}()
		}
	}
	// The reads on the held replica end at its end before the release
	// when they do not wait for the leader's: each read that ended then
	// is checked below. The release comes once a read has had the time
	// to, which no event marks: the check holds either way after it.
	early := 0
	for range n {
		select {
		case r := <-results:
			early++
			if r.err != nil || len(r.seqs) != 2 || r.seqs[1] != ack.Seq {
				t.Fatalf("JournalWarningSeqs while a replica is held: %v, %v; the warnings are at %d and %d", r.seqs, r.err, first.Seq, ack.Seq)
			}
			continue
		case <-time.After(2 * time.Second):
		}
		break
	}
	lag.Release()
	for range n - early {
		if r := <-results; r.err != nil || len(r.seqs) != 2 || r.seqs[1] != ack.Seq {
			t.Fatalf("JournalWarningSeqs: %v, %v; the warnings are at %d and %d", r.seqs, r.err, first.Seq, ack.Seq)
		}
	}
}
