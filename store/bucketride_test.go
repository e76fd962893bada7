package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// openers are the buckets a start opens, creating them when missing: a
// reconciler's start (engine.startUp) all three, a node agent's claim
// the node leases, a provisioner's start the fill status and secrets.
var openers = map[string]func(context.Context, jetstream.JetStream, store.StreamConfig) (jetstream.KeyValue, error){
	store.NodeLeaseBucketSuffix: store.OpenNodeLeases,
	store.SecretsBucketSuffix: func(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig) (jetstream.KeyValue, error) {
		return store.OpenSecrets(ctx, js, cfg, true)
	},
	store.FillStatusBucketSuffix: func(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig) (jetstream.KeyValue, error) {
		return store.OpenFillStatus(ctx, js, cfg, true)
	},
}

// A start's bucket opens, asked right after a kill -9 of the server that
// led the cluster's meta group and the buckets, open once their leaders
// are elected: each lookup is asked again (store.AskAgain). With one
// ask, sent while the bucket had no leader and so never answered, a
// reconciler's start ended after its 30 s ("lease bucket MESH_NODES:
// context deadline exceeded") and a provisioner went on without its
// fill status bucket.
func TestBucketOpensRideOutAMetaLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	k := pc.PrepareMetaKill(t)
	_, js := pc.ConnectVia(t, k.Other)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	for suffix, open := range openers {
		if _, err := open(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
		if err := pc.MoveLeader(ctx, js, "KV_"+cfg.Name+suffix, k.Meta); err != nil {
			t.Fatal(err)
		}
	}

	killed := pc.KillMeta(t, k)
	// Longer than an election (4–9 s), shorter than the test's: an open
	// that waits it out fails.
	octx, ocancel := context.WithTimeout(ctx, 40*time.Second)
	defer ocancel()
	var wg sync.WaitGroup
	for suffix, open := range openers {
		wg.Go(func() {
			if _, err := open(octx, js, cfg); err != nil {
				t.Errorf("open %s%s %s after %s, its leader and the meta leader, was killed: %v", cfg.Name, suffix, time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta), err)
				return
			}
			t.Logf("%s%s opened %s after the kill", cfg.Name, suffix, time.Since(killed).Round(time.Millisecond))
		})
	}
	wg.Wait()
}

// lateCreate is a JetStream whose first bucket creation is made but its
// answer lost (the ask outlived its attempt, or the meta leader that
// took it was deposed after proposing it).
type lateCreate struct {
	jetstream.JetStream
	mu      sync.Mutex
	creates int
}

func (l *lateCreate) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	l.mu.Lock()
	l.creates++
	first := l.creates == 1
	l.mu.Unlock()
	if first {
		if _, err := l.JetStream.CreateKeyValue(context.WithoutCancel(ctx), cfg); err != nil {
			return nil, err
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.JetStream.CreateKeyValue(ctx, cfg)
}

// A bucket's creation whose answer is lost is asked again, and the
// bucket it made is adopted (the next lookup finds it, or the creation
// is answered "already in use"): the start goes on, instead of waiting
// out its whole bound on the first ask.
func TestBucketOpenAdoptsALateCreation(t *testing.T) {
	t.Parallel()
	_, _, js := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for suffix, open := range openers {
		l := &lateCreate{JetStream: js}
		t0 := time.Now()
		if _, err := open(ctx, l, cfg); err != nil {
			t.Fatalf("open %s%s after %s: %v", cfg.Name, suffix, time.Since(t0).Round(time.Millisecond), err)
		}
		if l.creates != 1 {
			t.Errorf("%s%s: %d creations, want 1 (the second ask's lookup finds it)", cfg.Name, suffix, l.creates)
		}
	}
}

// noPeersFirst is a JetStream whose first stream and bucket creations
// are refused "no suitable peers for placement" (10005), as a cluster
// just formed (its peers not yet current) or with a server restarting
// refuses a replicated one for a moment.
type noPeersFirst struct {
	jetstream.JetStream
	mu              sync.Mutex
	streams, bucket int
}

var errNoPeers = &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}

func (n *noPeersFirst) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	n.mu.Lock()
	n.streams++
	first := n.streams == 1
	n.mu.Unlock()
	if first {
		return nil, errNoPeers
	}
	return n.JetStream.CreateStream(ctx, cfg)
}

func (n *noPeersFirst) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	n.mu.Lock()
	n.bucket++
	first := n.bucket == 1
	n.mu.Unlock()
	if first {
		return nil, errNoPeers
	}
	return n.JetStream.CreateKeyValue(ctx, cfg)
}

// A start's stream and bucket creations refused for want of peers
// (10005) are asked again within their bound, and succeed once the
// cluster places them, instead of ending the start on the first refusal.
func TestCreationsAskAgainWithoutPeers(t *testing.T) {
	t.Parallel()
	_, _, js := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := &noPeersFirst{JetStream: js}
	_, cfg, err := store.EnsureStream(ctx, n, store.StreamConfig{})
	if err != nil {
		t.Fatalf("EnsureStream: %v", err)
	}
	for suffix, open := range openers {
		n.bucket = 0
		if _, err := open(ctx, n, cfg); err != nil {
			t.Fatalf("open %s%s: %v", cfg.Name, suffix, err)
		}
		if n.bucket != 2 {
			t.Errorf("%s%s created after %d asks, want 2", cfg.Name, suffix, n.bucket)
		}
	}
	if n.streams != 2 {
		t.Errorf("stream created after %d asks, want 2", n.streams)
	}
}
