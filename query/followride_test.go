package query_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The reads of query that create a consumer, the lag's read past a
// checkpoint (Reader.TailNodes: `meshfold fleet`, the console's states)
// and the live follow (Reader.Follow: the console's live view, `meshfold
// events --follow`), started right after a kill -9 of the server leading
// the cluster's meta group, read once a new meta leader is elected: their
// consumer is created through store.FollowRidingOut. With one creation,
// sent while there was no meta leader and never answered, each waited out
// its caller's whole deadline.
func TestReadsRideOutAMetaLeaderKill(t *testing.T) {
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
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	want := func() events.Payload {
		return events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1"}}}, time.Now())
	}
	ack, err := pub.Append(ctx, "ace", want())
	if err != nil {
		t.Fatal(err)
	}
	var sl query.SnapshotLag
	for p := range subj.N() {
		pl := query.PartitionLag{Partition: p}
		if p == subj.Partition("ace") {
			pl.Last = ack.Seq
		}
		sl.Partitions = append(sl.Partitions, pl)
	}
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Stream(ctx); err != nil { // looked up before: only the consumers wait
		t.Fatal(err)
	}
	if err := pc.MoveLeader(ctx, js, cfg.Name, k.Other); err != nil {
		t.Fatal(err)
	}

	killed := pc.KillMeta(t, k)
	// Longer than an election (4–9 s), shorter than the test's: a read
	// that waits it out fails.
	rctx, rcancel := context.WithTimeout(ctx, 40*time.Second)
	defer rcancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		nodes, _, err := r.TailNodes(rctx, sl, 100)
		if err != nil {
			t.Errorf("TailNodes %s after %s, the meta leader, was killed: %v", time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta), err)
			return
		}
		if nodes["ace"] != ack.Seq {
			t.Errorf("TailNodes named %v, want ace at #%d", nodes, ack.Seq)
		}
		t.Logf("TailNodes read %s after the kill", time.Since(killed).Round(time.Millisecond))
	})
	wg.Go(func() {
		fctx, fcancel := context.WithCancel(rctx)
		defer fcancel()
		started := make(chan struct{})
		seen := make(chan events.Event, 1)
		followed := make(chan error, 1)
		go func() {
			followed <- r.Follow(fctx, func() { close(started) }, func(ev events.Event) {
				select {
				case seen <- ev:
				default:
				}
			})
		}()
		select {
		case <-started:
		case err := <-followed:
			t.Errorf("Follow %s after %s, the meta leader, was killed: %v (started: no)", time.Since(killed).Round(time.Millisecond), pc.Name(k.Meta), err)
			return
		}
		t.Logf("Follow started %s after the kill", time.Since(killed).Round(time.Millisecond))
		if _, err := pub.Append(rctx, "bob", want()); err != nil {
			t.Errorf("append after the follow started: %v", err)
			return
		}
		select {
		case ev := <-seen:
			if ev.Node != "bob" {
				t.Errorf("Follow read %s's event, want bob's", ev.Node)
			}
		case err := <-followed:
			t.Errorf("Follow ended before bob's event: %v", err)
		case <-rctx.Done():
			t.Errorf("Follow saw no event in 40 s")
		}
	})
	wg.Wait()
}
