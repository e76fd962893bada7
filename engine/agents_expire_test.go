package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// hangingGets is a lease bucket whose gets of the nodes named n<i>, once
// armed, go as get says (by default: no answer until the request's
// deadline, a server gone), counted; other gets, and everything else,
// reach the bucket.
type hangingGets struct {
	jetstream.KeyValue
	armed atomic.Bool
	calls atomic.Int32
	get   func(ctx context.Context) error
}

func (kv *hangingGets) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if !strings.HasPrefix(key, "n") || !kv.armed.Load() {
		return kv.KeyValue.Get(ctx, key)
	}
	kv.calls.Add(1)
	if kv.get != nil {
		return nil, kv.get(ctx)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A tick's expiry pass is bounded as a whole and ends at the first lease
// read that got no answer: with the server gone, each of N unrenewed
// leases was read with its own 5 s deadline, and the loop was held N×5 s.
// A read refused for another reason does not end the pass.
func TestExpiryPassIsBounded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		get   func(ctx context.Context) error
		reads int32
	}{
		{"no answer", nil, 1},
		{"no responders", func(context.Context) error { return nats.ErrNoResponders }, 1},
		{"denied", func(context.Context) error { return nats.ErrPermissionViolation }, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			kv := &hangingGets{get: c.get}
			kv.armed.Store(true)
			w := &agentWatch{kv: kv, log: slog.New(slog.DiscardHandler), ttl: time.Second, now: time.Now,
				leases: map[string]*nodeLease{}, expireTimeout: 200 * time.Millisecond}
			long := time.Now().Add(-time.Hour)
			for i := range 10 {
				w.leases[fmt.Sprintf("n%d", i)] = &nodeLease{present: true, seen: long, rev: 1}
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				w.expire(context.Background())
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second): // one get each: 50 s
				t.Fatalf("the expiry pass still runs after 20 s, %d reads", kv.calls.Load())
			}
			if n := kv.calls.Load(); n != c.reads {
				t.Fatalf("%d lease reads, want %d", n, c.reads)
			}
		})
	}
}

// While the connection is not connected, the watch's tick reads no lease
// (the expiry pass) and records nothing: a release the watch sees is
// recorded at once, and the unrenewed leases are read once the
// connection is back.
func TestExpiryPassWaitsForTheConnection(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 2})
	ctx, cancelCtx := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCtx()
	const ttl = time.Second
	bucket, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	put := func(node, token string) {
		t.Helper()
		v, _ := json.Marshal(store.Holder{Role: "node", Name: node, Host: "h1", PID: 2, Token: token})
		if _, err := bucket.Put(ctx, node, v); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		put(fmt.Sprintf("n%d", i), fmt.Sprintf("k%d", i))
	}
	kv := &hangingGets{KeyValue: bucket}
	var connected atomic.Bool
	pub := store.NewPublisher(js, cfg.Subjects())
	w := &agentWatch{kv: kv, stream: stream, subj: cfg.Subjects(), pub: pub, log: slog.New(slog.NewTextHandler(sweepTestLog{t}, nil)),
		leases: map[string]*nodeLease{}, last: map[string]*agentRecord{}, dirty: map[string]bool{}, now: time.Now,
		held: map[string]bool{}, connected: connected.Load, sweepTimeout: sweepTimeout}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.run(wctx) }()
	defer func() {
		cancel()
		<-done
	}()
	agentsOf := func(node string) []string { return agentEventsOf(ctx, t, js, cfg, node) }
	// The n<i> leases, not renewed after n9's up, are unrenewed for
	// longer than the TTL once a TTL has passed (the ups are recorded from
	// the watch's entries, which do not wait for ticks). n9 is renewed
	// until its up: put once before the watch started, it lived one TTL
	// (1 s), which the watch's start can outrun under -race on a loaded
	// machine, and the watch then never saw it.
	waitfor.Until(t, 20*time.Second, "n9's up", func() bool {
		if slices.Equal(agentsOf("n9"), []string{"up k9"}) {
			return true
		}
		put("n9", "k9")
		return false
	})
	kv.armed.Store(true)
	unrenewed := time.Now().Add(2 * ttl)
	waitfor.Until(t, 20*time.Second, "the n<i> leases unrenewed for two TTLs", func() bool { return time.Now().After(unrenewed) })
	put("ace", "a1")
	// The bucket keeps one value a key: a delete stored before the watch
	// delivered the put replaces it, and the watch sees only a release of
	// a lease it never saw (no transition). Wait for the up first.
	waitfor.Until(t, 20*time.Second, "ace's up", func() bool { return slices.Equal(agentsOf("ace"), []string{"up a1"}) })
	if err := bucket.Delete(ctx, "ace"); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 20*time.Second, "ace's down (released)", func() bool {
		return slices.Equal(agentsOf("ace"), []string{"up a1", "down a1 released"})
	})
	if n := kv.calls.Load(); n != 0 {
		t.Fatalf("%d lease reads while the connection was not connected, want 0", n)
	}
	connected.Store(true)
	waitfor.Until(t, 20*time.Second, "the unrenewed leases read once connected", func() bool { return kv.calls.Load() > 0 })
}
