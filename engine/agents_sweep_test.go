package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// unansweredInfo is a stream whose first stream info (the agent sweep's
// request) is one the server never answers, as when it stops after
// taking it: it blocks until release is closed and then until its
// context ends. Later ones are answered: the server's, within 20 s
// rather than the sweep's deadline, which the test makes 200 ms so that
// the unanswered one ends soon; a real stream info under -race on 2
// loaded cores took longer, its sweep failed and was tried again, and
// the test counted 4 or 5 infos where 3 were due.
type unansweredInfo struct {
	jetstream.Stream
	calls   atomic.Int32
	entered chan struct{} // closed by the first call
	release chan struct{}
}

func (s *unansweredInfo) Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	if s.calls.Add(1) == 1 {
		close(s.entered)
		<-s.release
		<-ctx.Done()
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	return s.Stream.Info(ctx, opts...)
}

// The agent liveness sweep's stream info runs off the watch's loop,
// under a deadline, and is retried until it succeeds, once for the
// watch's start and once for each reconnect: while its request waits for
// an answer that never comes, the loop records a lease's release; once
// the request's deadline passes, the sweep is tried again and records
// the down it is for (cat's, whose lease went while no reconciler
// watched). The sweep made its request on the loop with the watch's
// context: the loop recorded nothing until the watch ended (a server
// stopped under it: TestAgentLivenessAcrossServerRestart's bob had no
// down for 27 s), and a failed sweep was not tried again.
func TestAgentSweepOffTheLoop(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out a grace after the watch's start: not in -short")
	}
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 2})
	ctx, cancelCtx := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCtx()
	const ttl = time.Second
	kv, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	if _, err := pub.Append(ctx, "cat", events.Stamp(&events.Agent{State: events.AgentUp, Claim: "k1", Host: "h1", PID: 1},
		time.Now())); err != nil {
		t.Fatal(err)
	}
	agentsOf := func(node string) []string { return agentEventsOf(ctx, t, js, cfg, node) }

	s := &unansweredInfo{Stream: stream, entered: make(chan struct{}), release: make(chan struct{})}
	var release sync.Once
	var reconnects atomic.Uint64
	log := slog.New(slog.NewTextHandler(sweepTestLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := &agentWatch{kv: kv, stream: s, subj: cfg.Subjects(), pub: pub, log: log,
		leases: map[string]*nodeLease{}, last: map[string]*agentRecord{}, dirty: map[string]bool{}, now: time.Now,
		held: map[string]bool{}, reconnects: reconnects.Load, sweepTimeout: 200 * time.Millisecond}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.run(wctx) }()
	t.Cleanup(func() {
		release.Do(func() { close(s.release) })
		cancel()
		<-done
	})

	select {
	case <-s.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the watch made no sweep")
	}
	v, _ := json.Marshal(store.Holder{Role: "node", Name: "ace", Host: "h1", PID: 2, Token: "a1"})
	// ace's agent renews its lease (the same value: no transition) until
	// it releases it: a lease put once lives one TTL (1 s), which the wait
	// for its up outran under -race on a loaded machine, and its expiry
	// was recorded instead of its release.
	renew := func() {
		t.Helper()
		if _, err := kv.Put(ctx, "ace", v); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	waitfor.Until(t, 20*time.Second, "ace's up while the sweep waits", func() bool {
		if slices.Equal(agentsOf("ace"), []string{"up a1"}) {
			return true
		}
		renew()
		return false
	})
	renew()
	if err := kv.Delete(ctx, "ace"); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 20*time.Second, "ace's down (released) while the sweep waits", func() bool {
		return slices.Equal(agentsOf("ace"), []string{"up a1", "down a1 released"})
	})
	if got := agentsOf("cat"); !slices.Equal(got, []string{"up k1"}) {
		t.Fatalf("cat's agent events before the sweep was answered: %q", got)
	}

	// The unanswered request ends at its deadline; the sweep is tried
	// again, and cat's down recorded when the watch's grace ends.
	release.Do(func() { close(s.release) })
	waitfor.Until(t, AgentGrace(ttl)+20*time.Second, "cat's down (expired), found by the sweep tried again", func() bool {
		return slices.Equal(agentsOf("cat"), []string{"up k1", "down k1 expired"})
	})
	// A sweep that is answered asks twice: the nodes with agent events,
	// then those with prov events (their provisioners' leases).
	if n := s.calls.Load(); n != 3 {
		t.Errorf("%d stream infos for the watch's start, want 3 (a sweep failed, one answered: agents and provisioners)", n)
	}
	// A reconnect owes another sweep.
	reconnects.Add(1)
	waitfor.Until(t, 20*time.Second, "a sweep after the reconnect", func() bool { return s.calls.Load() == 5 })
}

// agentEventsOf returns node's agent events, oldest first, each as
// "state claim why" (why only on a down).
func agentEventsOf(ctx context.Context, t testing.TB, js jetstream.JetStream, cfg store.StreamConfig, node string) []string {
	t.Helper()
	var out []string
	if err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
		if a, ok := m.Event.Payload.(*events.Agent); ok {
			out = append(out, strings.TrimSpace(string(a.State)+" "+a.Claim+" "+string(a.Why)))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

type sweepTestLog struct{ t testing.TB }

func (w sweepTestLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
