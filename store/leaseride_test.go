package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A claim made right after a kill -9 of the server leading the lease
// bucket (and the meta group) gets its lease once a new leader is
// elected: its create, unanswered, is asked again. With one create, the
// claim ended at once or after the TTL ("lease stream: ... no response
// from stream"), and a reconciler's HoldStream with it.
func TestLeaseClaimRidesOutItsLeadersKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	k := pc.PrepareMetaKill(t)
	_, js := pc.ConnectVia(t, k.Other)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ttl = 5 * time.Second
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "MESH_LEASES", History: 1, TTL: ttl, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.MoveLeader(ctx, js, "KV_MESH_LEASES", k.Meta); err != nil {
		t.Fatal(err)
	}

	killed := pc.KillMeta(t, k)
	cctx, ccancel := context.WithTimeout(ctx, 40*time.Second)
	defer ccancel()
	h := store.NewHolder("reconciler", "MESH")
	l, err := store.AcquireLeaseTTL(cctx, kv, ttl, "stream", h, nil)
	if err != nil {
		t.Fatalf("claim %s after %s, the bucket's and meta leader, was killed: %v", time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta), err)
	}
	took := time.Since(killed)
	defer l.Release(ctx)
	// A direct get may be answered by a replica not yet holding the
	// claim's write (acknowledged by a quorum): read until it does.
	for deadline := time.Now().Add(10 * time.Second); ; {
		e, err := kv.Get(ctx, "stream")
		if err == nil && strings.Contains(string(e.Value()), h.Token) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the claim the key reads %v (err %v), not the claim's token", e, err)
		}
		time.Sleep(50 * time.Millisecond) // the pace of the reads, not a wait for an event
	}
	t.Logf("lease claimed %s after the kill", took.Round(time.Millisecond))
}

// lostAnswers is a lease bucket whose first create is unanswered: made
// (stored) when store is true, not made otherwise, and before its
// attempt ends another holder's create is made when rival is set.
type lostAnswers struct {
	jetstream.KeyValue
	store bool
	rival func()

	mu      sync.Mutex
	creates int
	updates int
}

func (l *lostAnswers) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	l.mu.Lock()
	l.creates++
	first := l.creates == 1
	l.mu.Unlock()
	if !first {
		return l.KeyValue.Create(ctx, key, value, opts...)
	}
	if l.store {
		if _, err := l.KeyValue.Create(context.WithoutCancel(ctx), key, value, opts...); err != nil {
			return 0, err
		}
	}
	if l.rival != nil {
		l.rival()
	}
	<-ctx.Done()
	return 0, ctx.Err()
}

func (l *lostAnswers) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	l.mu.Lock()
	l.updates++
	l.mu.Unlock()
	return l.KeyValue.Update(ctx, key, value, rev)
}

// A claim whose create goes unanswered asks again and holds the lease;
// when the unanswered create was stored, the key with its own token is
// written again at its revision before the claim returns (held by an
// answered write, its TTL restarted), and the lease holds that revision.
func TestLeaseClaimAsksAgainAnUnansweredCreate(t *testing.T) {
	t.Parallel()
	for _, stored := range []bool{false, true} {
		ctx := testCtx(t)
		_, _, js := storetest.Start(t)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "MESH_NODES", History: 1, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		la := &lostAnswers{KeyValue: kv, store: stored}
		h := store.NewHolder("node", "ace")
		t0 := time.Now()
		l, err := store.AcquireLeaseTTL(ctx, la, 10*time.Second, "ace", h, nil)
		if err != nil {
			t.Fatalf("stored %v: claim after %s: %v", stored, time.Since(t0).Round(time.Millisecond), err)
		}
		e, err := kv.Get(ctx, "ace")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(e.Value()), h.Token) {
			t.Fatalf("stored %v: the key holds %s, not the claim's", stored, e.Value())
		}
		if stored && la.updates != 1 {
			t.Errorf("stored: %d updates, want the one write at our create's revision", la.updates)
		}
		// The lease renews at the revision it holds: a renewal stored
		// proves it is the key's.
		if err := l.Release(ctx); err != nil {
			t.Errorf("stored %v: release: %v", stored, err)
		}
		if _, err := kv.Get(ctx, "ace"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("stored %v: after the release the key is %v, want deleted (released at the revision held)", stored, err)
		}
	}
}

// The fencing: a claim whose create went unanswered while a live
// holder's create was stored is refused (a HeldError), never believed
// held from its own asking again.
func TestLeaseClaimUnansweredNeverTakesALiveHoldersKey(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	var rival *store.Lease
	var rivalErr error
	la := &lostAnswers{KeyValue: kv, rival: func() {
		rival, rivalErr = store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	}}
	_, err := store.AcquireLeaseTTL(ctx, la, time.Second, "ace", store.NewHolder("node", "ace"), nil)
	if rivalErr != nil {
		t.Fatal(rivalErr)
	}
	defer rival.Release(ctx)
	if !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("claim beside a live holder: %v, want ErrLeaseHeld", err)
	}
	select {
	case <-rival.Lost():
		t.Fatalf("the live holder lost its lease: %v", rival.Err())
	default:
	}
}
