package store_test

import (
	"bytes"
	"testing"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestEffectKeyApartFromSnapshots: the effect-id key survives the
// snapshot bucket's deletion, and a key an older deployment kept in its
// snapshot bucket is the one used (issue 17).
func TestEffectKeyApartFromSnapshots(t *testing.T) {
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
