package query_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// `meshfold fleet` started seconds after a kill -9 of the server leading
// the cluster's meta group reads the summaries once a new meta leader is
// elected (a fresh user's finding M3: it failed ~4 s after the kill with
// a bare "read summaries of MESH_SNAPSHOTS: context deadline exceeded").
// The summaries' pass creates a consumer, which only the meta leader
// answers; one creation sent while there is none is never answered, and
// failed at the client's 5 s API timeout. The read's context is fleet's:
// no deadline, the --timeout as the ride-out's bound (store.WithRideOut).
func TestFleetRowsRideOutAMetaLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	k := pc.PrepareMetaKill(t)
	nc, js := pc.ConnectVia(t, k.Other)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := reconcile.NewState("ace")
	st.Fold(events.Event{Seq: 1, Node: "ace", Kind: events.KindWant, Time: time.Now(),
		Payload: events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1"}}}, time.Now())})
	data, err := reconcile.MarshalState(st)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := reconcile.MarshalSummary(st)
	if err != nil {
		t.Fatal(err)
	}
	p := events.Partition("ace", cfg.Partitions)
	if err := snaps.PutSummarizedAt(ctx, p, map[string][]byte{"ace": data}, map[string][]byte{"ace": sum}, nil); err != nil {
		t.Fatal(err)
	}
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Stream(ctx); err != nil { // looked up before: only the consumer waits
		t.Fatal(err)
	}
	bucket := "KV_" + cfg.Name + store.SnapshotBucketSuffix
	for _, s := range []string{cfg.Name, bucket} {
		if err := pc.MoveLeader(ctx, js, s, k.Other); err != nil {
			t.Fatal(err)
		}
	}

	killed := pc.KillMeta(t, k)
	rctx := store.WithRideOut(context.Background(), 40*time.Second) // fleet's: no deadline
	rows, err := r.FleetRows(rctx, time.Now(), time.Hour)
	if err != nil {
		t.Fatalf("FleetRows %s after %s, the meta leader, was killed: %v", time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta), err)
	}
	t.Logf("FleetRows read %s after the kill", time.Since(killed).Round(time.Millisecond))
	if len(rows) != 1 || rows[0].Node != "ace" {
		t.Fatalf("FleetRows = %v, want ace's row", rows)
	}

	// Past the bound, it says the stream did not answer (not a bare
	// deadline): kill a second server, so that no meta leader can be
	// elected.
	pc.Kill(3 - k.Meta - k.Other)
	start := time.Now()
	_, err = r.FleetRows(store.WithRideOut(context.Background(), 3*time.Second), time.Now(), time.Hour)
	if !errors.Is(err, store.ErrNoLeader) {
		t.Fatalf("FleetRows with 2 of 3 servers killed: %v (after %s), want one matching store.ErrNoLeader", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("with 2 of 3 servers killed: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
}
