package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A bucket's status asked while its stream is not found (as right after
// its creation on a cluster, 10059, where the server answering its info
// does not know it yet) is asked again until it is found: asked once, it
// ended a reconciler's start at load ~50 ("lease bucket MESH_LEASES: …
// 10059 stream not found"). Here the bucket is deleted and made again a
// moment after the ask began.
func TestKVStatusAsksAgainWhileNotFound(t *testing.T) {
	_, _, js := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{Bucket: "B", History: 1, TTL: 7 * time.Second}
	kv, err := store.OpenKV(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, cfg.Bucket); err != nil {
		t.Fatal(err)
	}
	type result struct {
		st  jetstream.KeyValueStatus
		err error
	}
	res := make(chan result, 1)
	go func() {
		st, err := store.KVStatus(ctx, js, kv)
		res <- result{st, err}
	}()
	<-time.After(300 * time.Millisecond) // the bucket missing a while: the fault, not a wait for an event
	if _, err := js.CreateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("status of a bucket made again: %v, want it once found", r.err)
	}
	if got := r.st.TTL(); got != cfg.TTL {
		t.Errorf("TTL %s, want %s", got, cfg.TTL)
	}
}
