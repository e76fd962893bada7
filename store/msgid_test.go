package store_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestEffectKeyApartFromSnapshots: the effect-id key survives the
// snapshot bucket's deletion, and a key an older deployment kept in its
// snapshot bucket is the one used (issue 17).
func TestEffectKeyApartFromSnapshots(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// An older deployment's key, where it kept it.
	legacy := bytes.Repeat([]byte{7}, 32)
	kv, err := js.KeyValue(ctx, snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "effect-key", legacy); err != nil {
		t.Fatal(err)
	}
	key, err := store.EffectKey(ctx, js, cfg, snaps)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(key, legacy) {
		t.Fatalf("key %x, want the snapshot bucket's %x", key, legacy)
	}
	if _, err := js.KeyValue(ctx, cfg.Name+store.EffectKeyBucketSuffix); err != nil {
		t.Fatalf("keys bucket: %v", err)
	}
	// The operator deletes the snapshot bucket to force a refold.
	if err := js.DeleteKeyValue(ctx, snaps.Bucket()); err != nil {
		t.Fatal(err)
	}
	snaps2, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := store.EffectKey(ctx, js, cfg, snaps2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, legacy) {
		t.Fatalf("after the snapshot bucket's deletion: key %x, want %x", again, legacy)
	}
}

// TestEffectKeyNew: with no key anywhere, one is made, 32 bytes, and
// every later call returns it.
func TestEffectKeyNew(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	a, err := store.EffectKey(ctx, js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.EffectKey(ctx, js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 32 || !bytes.Equal(a, b) {
		t.Fatalf("keys %x and %x, want one of 32 bytes", a, b)
	}
}

// TestEffectKeyDeniedKeysBucket: a reconciler whose credentials predate
// the keys bucket is denied it; the snapshot bucket's key is used, with
// ErrKeysDenied, at once rather than after a timeout.
func TestEffectKeyDeniedKeysBucket(t *testing.T) {
	// Not parallel: it times the denial against 4 s.
	ctx := testCtx(t)
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"r": {Deny: []string{"$JS.API.*.*.KV_MESH_KEYS"}}})
	_, js := ps.Connect(t, "r")
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	legacy := bytes.Repeat([]byte{9}, 32)
	kv, err := js.KeyValue(ctx, snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "effect-key", legacy); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	key, err := store.EffectKey(ctx, js, cfg, snaps)
	if !errors.Is(err, store.ErrKeysDenied) {
		t.Fatalf("err = %v, want ErrKeysDenied", err)
	}
	if !bytes.Equal(key, legacy) {
		t.Fatalf("key %x, want the snapshot bucket's %x", key, legacy)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("took %s: the denial was waited out, not detected", took)
	}
}

// TestEffectMsgID: an effect's message id is its id and the first 16 hex
// digits of HMAC-SHA256(key, id), whichever key and however many
// goroutines ask at once (the hashers are pooled per key); EffectIDOf
// takes it back and refuses any other.
func TestEffectMsgID(t *testing.T) {
	t.Parallel()
	keys := [][]byte{bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)}
	want := func(key []byte, id string) string {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(id))
		return id + "." + hex.EncodeToString(h.Sum(nil))[:16]
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				key := keys[(g+i)%2]
				id := fmt.Sprintf("node-%d.plan.%d.0", g, i)
				got := store.EffectMsgID(key, id)
				if got != want(key, id) {
					t.Errorf("EffectMsgID(%x, %s) = %s, want %s", key[:1], id, got, want(key, id))
					return
				}
				if back, ok := store.EffectIDOf(key, got); !ok || back != id {
					t.Errorf("EffectIDOf(%s) = %q, %v", got, back, ok)
					return
				}
				other := keys[(g+i+1)%2]
				for _, bad := range []string{want(other, id), got[:len(got)-1], got + "0", id, strings.ToUpper(got)} {
					if _, ok := store.EffectIDOf(key, bad); ok {
						t.Errorf("EffectIDOf(%s) accepted %s", got, bad)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
