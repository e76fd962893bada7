package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The journal's warnings (`meshfold fleet`, the console) read right after
// a kill -9 of the server leading the cluster's meta group are counted
// once a new meta leader is elected: the read's consumer is created
// through store.FollowRidingOut, asked again while unanswered. With
// one creation, sent while there was no meta leader and so never
// answered, the read waited out its caller's whole deadline.
func TestJournalWarningsRideOutAMetaLeaderKill(t *testing.T) {
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
	// The new stream's first leader, before the appends that precede the
	// kill (one was answered "no response from stream" in CI).
	pc.AwaitLeader(t, ctx, js, cfg.Name, 30*time.Second)
	pub := store.NewPublisher(js, cfg.Subjects())
	since := time.Now().Add(-time.Minute)
	for _, lvl := range []events.Level{events.LevelWarn, events.LevelInfo, events.LevelError} {
		if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Journal{Level: lvl, Msg: "disk", Cause: 1}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	if err := pc.MoveLeader(ctx, js, cfg.Name, k.Other); err != nil {
		t.Fatal(err)
	}

	killed := pc.KillMeta(t, k)
	// Longer than an election (4–9 s), shorter than the test's: a read
	// that waits it out fails.
	rctx, rcancel := context.WithTimeout(ctx, 40*time.Second)
	defer rcancel()
	counts, err := store.JournalWarnings(rctx, js, cfg, since)
	if err != nil {
		t.Fatalf("journal warnings %s after %s, the meta leader, was killed: %v", time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta), err)
	}
	if counts["ace"] != 2 {
		t.Fatalf("journal warnings %v, want ace: 2", counts)
	}
	t.Logf("journal warnings read %s after %s, the meta leader, was killed", time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta))
}
