package engine_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A group member started after an ungrouped reconciler died (its stream
// lease never released) waits for that lease to expire, then joins and
// takes every partition; an ungrouped reconciler is then refused beside
// it, naming it.
func TestGroupWaitsOutADeadUngroupedReconciler(t *testing.T) {
	t.Parallel()
	e, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx := testCtx(t)
	const ttl = time.Second
	// The lease bucket with a 1 s TTL, and the key of an ungrouped
	// reconciler that died holding it.
	if _, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "test", Instance: "setup", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, cfg.Name+engine.LeaseBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := json.Marshal(store.Holder{Role: "reconciler", Name: cfg.Name, Host: "gone", PID: 1, Since: time.Now().UTC(), Token: "dead"})
	if _, err := kv.Create(ctx, engine.StreamLeaseKey, dead); err != nil {
		t.Fatal(err)
	}
	a := startMember(t, embeddedConnector(e), cfg, "a", ttl, engine.Faults{})
	eventually(t, "member a to own every partition", func() bool { return len(a.g.Owned()) == cfg.Partitions })

	_, err = engine.HoldStream(ctx, js, cfg, 0, nil)
	if !errors.Is(err, engine.ErrBesideGroup) {
		t.Fatalf("HoldStream beside a live group: %v, want ErrBesideGroup", err)
	}
	a.stop(t)
}
