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

// A stall of the server holding the node lease bucket, longer than the
// bucket's TTL, with nothing killed and no election: the server answered
// nobody (every client's traffic held by a proxy), no agent's renewal
// was stored, and its TTL expired the leases meanwhile. The reconciler, whose connection never dropped, recorded
// each live agent down ("lease expired") and up 0.1 s later (a fresh
// user's finding M3: a 7 s stall of a loaded cluster, 5 live agents and a
// provisioner). A live agent has no down now; an agent that died in the
// stall is still recorded down, once the grace after the bucket answered
// again has passed.
func TestAgentLivenessAcrossABucketStall(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a server for longer than the lease TTL: not in -short")
	}
	// One server, every client through a proxy that holds all their
	// traffic for 7 s: the server runs on and its TTL expires the leases
	// no renewal reached. No connection drops (no reconnect's grace) and
	// nothing is elected (no election's grace).
	srv := storetest.StartProcServer(t)
	// The reconciler's connection and the agents' pass through
	// proxies of their own: the agents' traffic is resumed a second
	// after the reconciler's, so the reconciler reads every lease the
	// stall expired before any agent claims its lease again (on the
	// user's cluster the downs were recorded in the same 0.1 s as the
	// claims; here each of them is, without the grace, every time).
	proxy, agentProxy := storetest.StartProxy(t, strings.TrimPrefix(srv.URL(), "nats://")), storetest.StartProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenNodeLeases(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ttl := st.TTL()
	connect := func(p *storetest.Proxy) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		njs, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, njs
	}

	rnc, _ := connect(proxy)
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- engine.Serve(sctx, rnc, engine.Config{Stream: cfg, Logger: testLogger(t).With("serve", "r")})
	}()
	t.Cleanup(func() { scancel(); <-done })
	agentsOf := func(node string) []string {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("the reconciler ended: %v", err)
		default:
		}
		return agentEvents(t, js, cfg, node)
	}

	// Live agents, each on its own connection, renewing as agents do
	// (store.AcquireLease: every TTL/4, claiming again a lease that
	// expired).
	live := []string{"ace", "bob", "cat", "dot"}
	for _, n := range live {
		_, ajs := connect(agentProxy)
		akv, err := ajs.KeyValue(ctx, kv.Bucket())
		if err != nil {
			t.Fatal(err)
		}
		l, err := store.AcquireLease(ctx, akv, n, store.NewHolder("node", n), testLogger(t).With("agent", n))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
	}
	for _, n := range live {
		waitfor.Until(t, time.Minute, n+"'s up", func() bool { return len(agentsOf(n)) == 1 })
	}
	// eve: claimed by hand and never renewed, a dead agent: its down
	// says the grace after the watch's start is over (the stall below
	// must not fall in it).
	claim(t, kv, "eve", "e1")
	waitfor.Until(t, time.Minute+engine.AgentGrace(ttl), "eve's down", func() bool {
		return slices.Equal(agentsOf("eve"), []string{"up e1", "down e1 expired"})
	})
	// fox: an agent that dies as the stall begins.
	stopFox := hold(t, kv, "fox", "f1", ttl/4)
	waitfor.Until(t, time.Minute, "fox's up", func() bool { return len(agentsOf("fox")) == 1 })
	stopFox()

	// What each live agent has before the stall: on a loaded machine
	// (-race, load 20) a live agent can miss its renewals for longer
	// than the 2 s TTL before it, and have a down and an up already.
	ups := map[string][]string{}
	for _, n := range live {
		waitfor.Until(t, time.Minute, n+"'s newest agent event an up", func() bool {
			ups[n] = agentsOf(n)
			return strings.HasPrefix(ups[n][len(ups[n])-1], "up ")
		})
	}
	stall := ttl + 2*time.Second // the user's: 7 s, a 5 s TTL
	proxy.Stall()
	agentProxy.Stall()
	stalled := time.Now()
	<-time.After(stall) // the fault's length, not a wait for an event
	proxy.Resume()
	held := time.Since(stalled)
	<-time.After(time.Second) // the agents' lag behind it, as above
	agentProxy.Resume()
	t.Logf("every client's traffic held for %s, the agents' for %s (the bucket's TTL %s)",
		held.Round(time.Millisecond), time.Since(stalled).Round(time.Millisecond), ttl)

	waitfor.Until(t, 2*time.Minute, "fox's down", func() bool {
		return slices.Equal(agentsOf("fox"), []string{"up f1", "down f1 expired"})
	})
	t.Logf("fox's down recorded %s after the stall began", time.Since(stalled).Round(time.Millisecond))
	// fox's down comes after the grace, when the live agents' renewals
	// have long been judged: none of them has a down since the stall.
	falseDowns := 0
	for _, n := range live {
		if got := agentsOf(n); !slices.Equal(got, ups[n]) {
			falseDowns++
			t.Errorf("%s's agent lived through the stall and renewed its lease once the server answered; its agent events: %q, want %q (as before the stall)", n, got, ups[n])
		}
	}
	t.Logf("live agents recorded down: %d of %d", falseDowns, len(live))
}
