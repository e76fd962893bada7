package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// leaseBucket returns a lease bucket with a 1 s TTL.
func leaseBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, _, js := storetest.Start(t)
	kv, err := js.CreateKeyValue(testCtx(t), jetstream.KeyValueConfig{Bucket: "MESH_NODES", History: 1, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// A second claim on a lease whose holder is alive (renewing it) is
// refused with an error naming the holder's host, pid and since.
func TestLeaseRefusesASecondHolder(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	h := store.NewHolder("node", "ace")
	a, err := store.AcquireLease(ctx, kv, "ace", h, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	_, err = store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	var held *store.HeldError
	if !errors.As(err, &held) || !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("second claim: %v, want a HeldError", err)
	}
	if held.Holder.Token != h.Token || held.Holder.Host != h.Host || held.Holder.PID != os.Getpid() || !held.Holder.Since.Equal(h.Since) {
		t.Errorf("holder named %+v, want %+v", held.Holder, h)
	}
	for _, s := range []string{"node ace", "host " + h.Host, "pid " + strconv.Itoa(os.Getpid()), "since " + h.Since.Format(time.RFC3339)} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	select {
	case <-a.Lost():
		t.Fatalf("the holder lost its lease: %v", a.Err())
	default:
	}
}

// A released lease is deleted, so the next claim takes it at once.
func TestLeaseReleaseFreesTheKey(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	a, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "ace"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after Release: %v, want the key deleted", err)
	}
	b, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A renewal the server stored but whose reply came after its deadline
// leaves the holder a revision behind its key: Release still deletes
// the key, which holds its token, so the next claim (and a watcher)
// sees it released at once, not after the TTL. The bucket's TTL is a
// minute so that no renewal tick mends the revision first.
func TestLeaseReleasedAfterALateRenewal(t *testing.T) {
	t.Parallel()
	_, _, js := storetest.Start(t)
	ctx := testCtx(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "MESH_NODES", History: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "ace", e.Value(), e.Revision()); err != nil { // the late renewal
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "ace"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after Release: %v, want the key deleted", err)
	}
}

// A claim whose create the server stored but whose reply came after its
// deadline finds its own token in the key when it tries again: it holds
// the lease, at once, instead of waiting out a "holder" that is itself.
func TestLeaseClaimFindsItsOwnKey(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	h := store.NewHolder("node", "ace")
	own, _ := json.Marshal(h)
	if _, err := kv.Create(ctx, "ace", own); err != nil { // the late create
		t.Fatal(err)
	}
	start := time.Now()
	l, err := store.AcquireLease(ctx, kv, "ace", h, nil)
	if err != nil {
		t.Fatalf("claim over its own key: %v", err)
	}
	if waited := time.Since(start); waited > l.TTL()/2 {
		t.Errorf("the claim waited %s over its own key (TTL %s)", waited, l.TTL())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "ace"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after Release: %v, want the key deleted", err)
	}
}

// stopDuringCreate is a bucket whose Create is answered after the claim
// was stopped: the server stores the key, the claimant's context is
// cancelled meanwhile, and the reply comes after it, as a SIGTERM just
// after an agent's create reached the server.
type stopDuringCreate struct {
	jetstream.KeyValue
	stop context.CancelFunc
}

func (kv stopDuringCreate) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(context.WithoutCancel(ctx), key, value, opts...)
	kv.stop()
	if ctx.Err() != nil {
		return 0, ctx.Err() // the reply came after the caller's context ended
	}
	return rev, err
}

// A claim stopped while its create is on its way leaves no key behind:
// the claim fails with its context's error and the key is deleted, so
// the next claimant takes it at once and a watcher sees it released.
// (A TTL of a minute: no expiry removes the key first.)
func TestLeaseClaimStoppedDuringItsCreateLeavesNoKey(t *testing.T) {
	t.Parallel()
	_, _, js := storetest.Start(t)
	kv, err := js.CreateKeyValue(testCtx(t), jetstream.KeyValueConfig{Bucket: "MESH_NODES", History: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(testCtx(t))
	_, err = store.AcquireLease(ctx, stopDuringCreate{KeyValue: kv, stop: stop}, "ace", store.NewHolder("node", "ace"), nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("claim stopped during its create: %v, want context.Canceled", err)
	}
	if _, err := kv.Get(testCtx(t), "ace"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after the stopped claim: %v, want no key", err)
	}
}

// lostToADelete is a bucket whose first Create loses a race on a
// replicated bucket: another claimant creates the key and deletes it
// again (a reconciler group member's check of the stream key, which it
// releases at once) while this create is on its way, and the server
// answers it with the raw wrong-last-sequence reply of a replicated
// stream, 10164, which nats.go returns unwrapped from a create that
// followed a delete marker.
type lostToADelete struct {
	jetstream.KeyValue
	lost *bool
}

func (kv lostToADelete) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if *kv.lost {
		return kv.KeyValue.Create(ctx, key, value, opts...)
	}
	*kv.lost = true
	other, _ := json.Marshal(store.NewHolder("reconciler", "MESH"))
	rev, err := kv.KeyValue.Create(ctx, key, other)
	if err != nil {
		return 0, err
	}
	if err := kv.KeyValue.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		return 0, err
	}
	return 0, &jetstream.APIError{Code: 400, ErrorCode: 10164, Description: "wrong last sequence"}
}

// A claim whose create lost a race with another claimant's create and
// release (the server's raw 10164 on a replicated bucket) reads the key
// again and takes it: it fails neither with the reply nor as held. Four
// `meshfold reconcile --group` instances started at once on a 3-server
// cluster each check the stream key this way, and one exited with
// "lease stream: … err_code=10164 … wrong last sequence" before this.
func TestLeaseClaimAfterARaceWithADelete(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	var lost bool
	l, err := store.AcquireLease(ctx, lostToADelete{KeyValue: kv, lost: &lost}, "stream", store.NewHolder("reconciler", "MESH"), nil)
	if err != nil {
		t.Fatalf("claim after a lost race with a delete: %v", err)
	}
	if !lost {
		t.Fatal("the race was not played")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The lease of a holder that died (its key is never renewed) is taken
// once the key expires, within about the bucket's TTL.
func TestLeaseOfADeadHolderIsTakenAfterItsTTL(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	dead, _ := json.Marshal(store.Holder{Role: "node", Name: "ace", Host: "gone", PID: 1, Since: time.Now().UTC(), Token: "dead"})
	if _, err := kv.Create(ctx, "ace", dead); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	waited := time.Since(start)
	t.Logf("took a dead holder's lease after %s (TTL %s)", waited.Round(time.Millisecond), l.TTL())
	e, err := kv.Get(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	var h store.Holder
	if err := json.Unmarshal(e.Value(), &h); err != nil || h.Token == "dead" {
		t.Fatalf("key holds %s, %v; want the new holder", e.Value(), err)
	}
	// Its since is the take's, not the wait's start (a fresh user's
	// finding: a controller's lease said since 6 s before it was taken,
	// before its previous holder was killed). The dead key was
	// written before start and expires a TTL after: nothing took it
	// before half a TTL had passed.
	if took := h.Since.Sub(start); took < l.TTL()/2 {
		t.Errorf("the lease says held since %s after the claim began, want at least half the TTL (%s): "+
			"since the wait began, not the take", took, l.TTL()/2)
	}
}

// A holder whose key was taken by a successor (it could not renew within
// the TTL) learns it at its next renewal: Lost closes, Err names the
// successor, and Release leaves the successor's key alone.
func TestLeaseLostToASuccessor(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	a, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The successor's key replaces the holder's in one write: a delete
	// then a create left the holder's renewal (every 250 ms) a window
	// between them, in which it found its key gone and claimed it again,
	// and the create failed (key exists) under load.
	succ, _ := json.Marshal(store.Holder{Role: "node", Name: "ace", Host: "elsewhere", PID: 42, Since: time.Now().UTC(), Token: "succ"})
	if _, err := kv.Put(ctx, "ace", succ); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-ctx.Done():
		t.Fatal("the lease was never found lost")
	}
	var held *store.HeldError
	if err := a.Err(); !errors.As(err, &held) || held.Holder.Host != "elsewhere" || held.Holder.PID != 42 {
		t.Fatalf("Err = %v, want the successor named", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "ace")
	if err != nil || string(e.Value()) != string(succ) {
		t.Fatalf("after Release: %v %s, want the successor's key kept", err, e.Value())
	}
}

// A standby that claims a held lease again and again says it waits for
// the holder once at info, then at debug, and again at info for a new
// holder (a fresh user's finding: a group member logged the rollout
// lease's holder every ~3.5 s, 289 lines in 18 minutes).
func TestLeaseHeldSaidOncePerHolder(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	var rec levelsSeen
	log := slog.New(&rec)
	claimHeld := func() {
		t.Helper()
		if _, err := store.AcquireLease(ctx, kv, "bob", store.NewHolder("node", "bob"), log); !errors.Is(err, store.ErrLeaseHeld) {
			t.Fatalf("claim of a held lease: %v, want ErrLeaseHeld", err)
		}
	}
	for _, holder := range []string{"first", "second"} {
		a, err := store.AcquireLease(ctx, kv, "bob", store.NewHolder("node", "bob"), nil)
		if err != nil {
			t.Fatal(err)
		}
		claimHeld()
		claimHeld()
		claimHeld()
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := rec.take(), []slog.Level{slog.LevelInfo, slog.LevelDebug, slog.LevelDebug}; !slices.Equal(got, want) {
			t.Errorf("%s holder: 'lease held' said at %v, want %v", holder, got, want)
		}
	}
}

// levelsSeen is a slog handler recording the level of each "lease held"
// record.
type levelsSeen struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (h *levelsSeen) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelsSeen) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "lease held") {
		h.mu.Lock()
		h.levels = append(h.levels, r.Level)
		h.mu.Unlock()
	}
	return nil
}
func (h *levelsSeen) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelsSeen) WithGroup(string) slog.Handler      { return h }
func (h *levelsSeen) take() []slog.Level {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.levels
	h.levels = nil
	return l
}

// A value that is no meshfold lease (a stray 'nats kv put' of the key)
// written over a held lease is no successor: the holder writes its lease
// back and keeps it, where it stopped before naming an empty holder (a
// fresh user's finding V5: "  is held by another live process: host ,
// pid 0, since 0001-01-01…"). A claim on such a key waits for its expiry
// as for a dead holder's, and an error of one names the bucket, the key
// and the value.
func TestLeaseForeignValueIsNoHolder(t *testing.T) {
	t.Parallel()
	kv := leaseBucket(t)
	ctx := testCtx(t)
	h := store.NewHolder("node", "ace")
	a, err := store.AcquireLease(ctx, kv, "ace", h, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	if _, err := kv.Put(ctx, "ace", []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for back := false; !back; {
		select {
		case e := <-w.Updates():
			var got store.Holder
			if e != nil && json.Unmarshal(e.Value(), &got) == nil && got.Token == h.Token && e.Revision() > 1 && string(e.Value()) != `{"v":1}` {
				back = e.Revision() > 2 // after the foreign put (revision 2)
			}
		case <-a.Lost():
			t.Fatalf("the holder stopped at a foreign value: %v", a.Err())
		case <-ctx.Done():
			t.Fatal("the holder never wrote its lease back over the foreign value")
		}
	}
	select {
	case <-a.Lost():
		t.Fatalf("the holder lost its lease: %v", a.Err())
	default:
	}

	if _, err := kv.Put(ctx, "bob", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	b, err := store.AcquireLease(ctx, kv, "bob", store.NewHolder("node", "bob"), nil)
	if err != nil {
		t.Fatalf("claim of a key holding a foreign value: %v, want it taken once it expires", err)
	}
	defer b.Release(ctx)

	msg := (&store.HeldError{Key: "ace", Bucket: "MESH_NODES", Foreign: `"{\"v\":1}"`}).Error()
	if !strings.Contains(msg, `the lease key ace of MESH_NODES holds a value that is no meshfold process's lease ("{\"v\":1}"`) || strings.Contains(msg, "pid 0") {
		t.Errorf("HeldError of a foreign value: %q", msg)
	}
}
