package engine_test

import (
	"context"
	"slices"
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

// One server of a 3-server cluster killed with SIGKILL: the one leading
// the node lease bucket (KV_<stream>_NODES). Its agents live throughout,
// but none could renew its lease during the election (no leader takes a
// write) and every lease expired on the replicas; the reconciler, whose
// own connection never dropped, recorded every agent of the mesh down
// ("lease expired"), then up when it claimed its lease again (a fresh
// user's finding, G1). A live agent has no down now; an agent that died
// with the server is still recorded down, once the grace after the
// bucket's new leader has passed.
func TestAgentLivenessAcrossALeaseLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	bucket := cfg.Name + store.NodeLeaseBucketSuffix
	kv, err := store.OpenNodeLeases(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// connect dials as the roles do (store.ConnectConfig): every server's
	// URL, reconnecting forever with their pacing.
	leaderOf := func() int {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return pc.Leader(lctx, js, "KV_"+bucket)
	}
	// A bucket just made elects its first leader within a second here,
	// several under load (one read right after found none at -parallel 4).
	leader := pc.AwaitLeader(t, ctx, js, "KV_"+bucket, 30*time.Second)
	// Every connection below prefers a server other than the bucket's
	// leader: the reconciler's never drops (no reconnect starts its
	// grace), as on the user's cluster.
	urls := strings.Split(pc.URLs(), ",")
	other := (leader + 1) % len(urls)
	urls[0], urls[other] = urls[other], urls[0]
	connect := func(name string) (*nats.Conn, jetstream.JetStream) {
		opts, err := store.ConnectConfig{URLs: urls, Name: name, Logger: testLogger(t).With("conn", name)}.Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect("", append(opts, nats.DontRandomize())...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	rnc, _ := connect("reconciler")
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- engine.Serve(sctx, rnc, engine.Config{Stream: cfg, Logger: testLogger(t).With("serve", "r")})
	}()
	t.Cleanup(func() { scancel(); <-done })

	live := []string{"ace", "bob", "cat", "dot"}
	for _, n := range live {
		_, ajs := connect("agent-" + n)
		akv, err := ajs.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		l, err := store.AcquireLease(ctx, akv, n, store.NewHolder("node", n), testLogger(t).With("agent", n))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
	}
	// A reconciler that ended (a start that gave up under load) records
	// nothing more: said at once, with its error, not as a minute's wait
	// for an up (once seen, at load ~13, with nothing else said).
	agentsOf := func(node string) []string {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("the reconciler ended: %v", err)
		default:
		}
		return agentEvents(t, js, cfg, node)
	}
	for _, n := range live {
		waitfor.Until(t, time.Minute, n+"'s up", func() bool { return len(agentsOf(n)) == 1 })
	}
	ups := map[string][]string{}
	for _, n := range live {
		ups[n] = agentsOf(n)
	}
	// eve: claimed by hand and never renewed, a dead agent: its down
	// says the grace after the watch's start is over (the kill below
	// must not fall in it).
	claim(t, kv, "eve", "e1")
	waitfor.Until(t, time.Minute+engine.AgentGrace(5*time.Second), "eve's down", func() bool {
		return slices.Equal(agentsOf("eve"), []string{"up e1", "down e1 expired"})
	})
	// fox: an agent that dies as the server does (it renews its lease
	// until then).
	stopFox := hold(t, kv, "fox", "f1", 500*time.Millisecond)
	waitfor.Until(t, time.Minute, "fox's up", func() bool { return len(agentsOf("fox")) == 1 })
	stopFox()
	pc.Kill(leader)
	killed := time.Now()
	t.Logf("killed %s, the node lease bucket's leader", pc.Name(leader))
	waitfor.Until(t, time.Minute, "a new leader of the node lease bucket", func() bool {
		i := leaderOf()
		return i >= 0 && i != leader
	})
	elected := time.Since(killed)
	t.Logf("new leader after %s", elected.Round(time.Millisecond))
	waitfor.Until(t, 2*time.Minute, "fox's down", func() bool {
		return slices.Equal(agentsOf("fox"), []string{"up f1", "down f1 expired"})
	})
	t.Logf("fox's down recorded %s after the kill", time.Since(killed).Round(time.Millisecond))
	// fox's down comes after the grace, when the live agents' renewals
	// have long been judged: none of them has a down.
	for _, n := range live {
		if got := agentsOf(n); !slices.Equal(got, ups[n]) {
			t.Errorf("%s's agent lived and renewed its lease once the bucket had a leader; its agent events: %q, want %q", n, got, ups[n])
		}
	}
}
