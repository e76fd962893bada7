package engine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// lostAnswers is a lease bucket whose next create or update of key,
// once armed, is stored but answered with a timeout, as a loaded or
// electing cluster answers a write after the client's deadline. It
// counts the creates and updates of key the bucket stored.
type lostAnswers struct {
	jetstream.KeyValue
	key              string
	loseCreate       atomic.Bool
	loseUpdate       atomic.Bool // the next one
	loseUpdates      atomic.Bool // every one
	creates, updates atomic.Int32
}

func (kv *lostAnswers) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, value, opts...)
	if key != kv.key || err != nil {
		return rev, err
	}
	kv.creates.Add(1)
	if kv.loseCreate.CompareAndSwap(true, false) {
		return 0, context.DeadlineExceeded
	}
	return rev, nil
}

func (kv *lostAnswers) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, last)
	if key != kv.key || err != nil {
		return rev, err
	}
	kv.updates.Add(1)
	if kv.loseUpdate.CompareAndSwap(true, false) || kv.loseUpdates.Load() {
		return 0, context.DeadlineExceeded
	}
	return rev, nil
}

// leaseAnswerRig runs one member of a group on a 2-partition stream,
// its lease bucket wrapped in kv, and hands its grants out.
func leaseAnswerRig(t *testing.T, arm func(kv *lostAnswers)) (kv *lostAnswers, grants <-chan Grant) {
	t.Helper()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(sweepTestLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g, err := JoinGroup(ctx, js, GroupConfig{Stream: cfg, Name: "g", Instance: "a", TTL: 3 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	kv = &lostAnswers{KeyValue: g.kv, key: leaseKey(0)}
	arm(kv)
	g.kv = kv
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	// What a reconciler does with its grants: each partition stops when
	// revoked.
	out := make(chan Grant, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case gr := <-g.Grants():
				out <- gr
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gr.Revoked.Done()
					gr.Stopped()
				}()
			case <-rctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		wg.Wait()
	})
	return kv, out
}

func grantOf(t *testing.T, grants <-chan Grant, p int) Grant {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case gr := <-grants:
			if gr.Partition == p {
				return gr
			}
		case <-deadline:
			t.Fatalf("no grant of partition %d within 20 s", p)
		}
	}
}

// A renewal stored by the server but answered after the client's
// deadline leaves the lease its holder's: the next renewal, refused as
// stale, finds the bucket holding the lease's own value at a newer
// revision and renews from it. Every lease of a member under -race on two
// loaded cores was revoked as lost that way (TestGroupFailoverOnCluster:
// 8 partitions lost at once, retaken 12 s later).
func TestLeaseRenewalStoredUnanswered(t *testing.T) {
	t.Parallel()
	kv, grants := leaseAnswerRig(t, func(kv *lostAnswers) {})
	gr := grantOf(t, grants, 0)
	kv.loseUpdate.Store(true)
	waitfor.Until(t, 20*time.Second, "two renewals answered after the unanswered one, or the lease lost", func() bool {
		return kv.updates.Load() >= 3 || gr.Revoked.Err() != nil
	})
	if err := gr.Revoked.Err(); err != nil {
		t.Fatalf("partition 0 revoked after a renewal stored without an answer: %v", context.Cause(gr.Revoked))
	}
	if kv.loseUpdate.Load() {
		t.Fatal("no renewal went unanswered")
	}
}

// A member whose every renewal is stored but answered after its deadline
// (a cluster that answers slower than the member waits, for longer than
// the TTL) keeps its lease: each renewal refused as stale finds the one
// before stored, and the deadline moves on from when the first
// unanswered one was sent, as it would from an answered one. Kept at the
// deadline of the last answered renewal, it was revoked a TTL later
// while the server kept renewing the key.
func TestLeaseRenewalsStoredUnansweredForLong(t *testing.T) {
	t.Parallel()
	kv, grants := leaseAnswerRig(t, func(kv *lostAnswers) {})
	gr := grantOf(t, grants, 0)
	kv.loseUpdates.Store(true)
	from, ttl := time.Now(), 3*time.Second
	waitfor.Until(t, time.Minute, "two TTLs of unanswered renewals, or the lease lost", func() bool {
		return time.Since(from) > 2*ttl || gr.Revoked.Err() != nil
	})
	if err := gr.Revoked.Err(); err != nil {
		t.Fatalf("partition 0 revoked after %s of renewals stored without an answer (TTL %s): %v",
			time.Since(from).Round(time.Millisecond), ttl, context.Cause(gr.Revoked))
	}
	if !gr.Valid() {
		t.Fatal("the lease is past its deadline")
	}
	if n := kv.updates.Load(); n < 4 {
		t.Fatalf("%d renewals stored in two TTLs", n)
	}
}

// A create stored by the server but answered after the client's
// deadline gives the lease to its creator at the next look: the create
// sent again is refused (the key exists), and the bucket holds the first
// one's value. The member waited out the TTL of its own lease before.
func TestLeaseCreateStoredUnanswered(t *testing.T) {
	t.Parallel()
	kv, grants := leaseAnswerRig(t, func(kv *lostAnswers) { kv.loseCreate.Store(true) })
	gr := grantOf(t, grants, 0)
	if kv.loseCreate.Load() {
		t.Fatal("no create went unanswered")
	}
	if n := kv.creates.Load(); n != 1 {
		t.Fatalf("partition 0 granted after %d creates stored, want 1 (the unanswered one's lease, not a new one after it expired)", n)
	}
	if !gr.Valid() {
		t.Fatal("the lease taken is not valid")
	}
}
