package query_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The builds check of `want` and `apply` (Reader.MissingBuilds), asked
// right after a kill -9 of the server leading the builds bucket, answers
// once the bucket has a new leader: each ask is bounded and asked again.
// Before, its one ask of the dead leader waited out the verb's whole
// --timeout (a fresh user's finding: apply failed at 60 s, want at 30 s,
// while the bucket had a new leader 3-6 s after the kill).
func TestMissingBuildsRidesOutTheBucketLeadersKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("not a real bundle, but bytes under their build")
	build := bundle.BuildOf(data)
	st := bundle.NewStore(js, cfg.Name)
	if _, _, err := st.Push(ctx, build, "test", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	bucketStream := "OBJ_" + st.Bucket()
	leader := pc.AwaitLeader(t, ctx, js, bucketStream, 30*time.Second)
	other := (leader + 1) % pc.N()
	nc, _ := pc.ConnectVia(t, other)
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	w := &events.Want{Modules: []events.WantModule{{Name: "app", Build: build}}}

	pc.Kill(leader)
	killed := time.Now()
	// Longer than an election (4-9 s), shorter than the test's: an ask
	// that waits out its deadline fails.
	rctx, rcancel := context.WithTimeout(ctx, 40*time.Second)
	defer rcancel()
	missing, err := r.MissingBuilds(rctx, w)
	if err != nil {
		t.Fatalf("MissingBuilds %s after %s, the builds bucket's leader, was killed: %v", time.Since(killed).Round(time.Millisecond), pc.Name(leader), err)
	}
	if len(missing) != 0 {
		t.Fatalf("MissingBuilds: %v; want none (the build is stored)", missing)
	}
	t.Logf("MissingBuilds answered %s after the kill", time.Since(killed).Round(time.Millisecond))
}
