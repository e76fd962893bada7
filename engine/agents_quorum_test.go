package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// Two of a 3-server cluster's servers killed with SIGKILL for longer than
// the node lease bucket's TTL, then started again; every agent lives
// throughout and renews its lease once it can. The grouped reconcilers
// recorded some of them down ("lease expired, not renewed") once the
// quorum was back, and nothing recorded them up again until the agent
// happened to publish a have, up to --resync (10 min) later (a fresh
// user's finding, G1): fleet, state and rollouts' budgets counted live
// nodes down. An agent recorded down while it lives is recorded up again
// once its renewals are stored.
func TestAgentLivenessAcrossAQuorumLoss(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills two servers of three: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	bucket := cfg.Name + store.NodeLeaseBucketSuffix
	if _, err := store.OpenNodeLeases(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	leader := pc.AwaitLeader(t, ctx, js, "KV_"+bucket, time.Minute)
	// The server kept leads the bucket and the stream, as on the user's
	// cluster: it takes writes, unanswered, for seconds after it lost its
	// quorum. Connections are spread over the three servers.
	if err := pc.MoveLeader(ctx, js, cfg.Name, leader); err != nil {
		t.Fatal(err)
	}
	urls := strings.Split(pc.URLs(), ",")
	connect := func(name string, first int) *nats.Conn {
		order := append([]string{urls[first]}, append(append([]string{}, urls[:first]...), urls[first+1:]...)...)
		opts, err := store.ConnectConfig{URLs: order, Name: name, Logger: testLogger(t).With("conn", name)}.Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect("", append(opts, nats.DontRandomize())...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	ready := make(chan struct{}, 2)
	for i, name := range []string{"r1", "r2"} {
		rnc := connect(name, (leader+i)%3)
		go func() {
			done <- engine.Serve(sctx, rnc, engine.Config{Stream: cfg, Group: "g", Instance: name, Logger: testLogger(t).With("serve", name),
				Ready: func(context.Context, *engine.Reconciler) { ready <- struct{}{} }})
		}()
	}
	t.Cleanup(func() { scancel(); <-done; <-done })
	// Both running before the kill: a start that meets the quorum loss
	// ends within its bounds, which is not this test's subject.
	for range 2 {
		select {
		case <-ready:
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("a reconciler ended as it started: %v", err)
		case <-time.After(2 * time.Minute):
			t.Fatal("the reconcilers not running after 2 minutes")
		}
	}

	var live []string
	for i := range 8 {
		n := fmt.Sprintf("n%02d", i)
		live = append(live, n)
		anc := connect("agent-"+n, i%3)
		ajs, err := jetstream.New(anc)
		if err != nil {
			t.Fatal(err)
		}
		akv, err := ajs.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		l, err := store.AcquireLease(ctx, store.LeaseBucket(akv, anc), n, store.NewHolder("node", n), testLogger(t).With("agent", n))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Abandon() })
	}
	agentsOf := func(node string) []string {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("a reconciler ended: %v", err)
		default:
		}
		return agentEvents(t, js, cfg, node)
	}
	for _, n := range live {
		waitfor.Until(t, 2*time.Minute, n+"'s up", func() bool { return len(agentsOf(n)) == 1 })
	}
	var killed []int
	for i := range 3 {
		if i != leader {
			pc.Kill(i)
			killed = append(killed, i)
		}
	}
	t0 := time.Now()
	t.Logf("at %s killed %s and %s; %s (the bucket's and the stream's leader) runs", t0.Format("15:04:05.000"), pc.Name(killed[0]), pc.Name(killed[1]), pc.Name(leader))
	time.Sleep(40 * time.Second) // the outage, as the user's
	for _, i := range killed {
		pc.Restart(i)
	}
	back := time.Now()
	t.Logf("restarted after %s", back.Sub(t0).Round(time.Millisecond))
	up := func(n string) bool {
		ev := agentsOf(n)
		return len(ev) > 0 && strings.HasPrefix(ev[len(ev)-1], "up ")
	}
	for _, n := range live {
		waitfor.Until(t, 90*time.Second, n+" recorded up", func() bool { return up(n) })
		t.Logf("%s: %q, seen up %s after the restart", n, agentsOf(n), time.Since(back).Round(time.Millisecond))
	}
}
