package engine_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// A reconciler that stays up while its server restarts (a standalone
// server's restart, a whole cluster's) records no down for an agent that
// renews its lease once the server is back, though its lease expired
// while no server ran; an agent that died meanwhile is recorded down
// when the grace after the reconnect ends.
func TestAgentLivenessAcrossServerRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a server and waits out its lease TTL: not in -short")
	}
	dir := t.TempDir()
	addr := storetest.FreeAddr(t) // held while the server restarts
	start := func() *embedded.Server {
		e, err := embedded.Start(embedded.Config{DataDir: dir, Listen: addr})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := start()
	t.Cleanup(func() { e.Shutdown() })
	ctx := testCtx(t)
	// connect dials as the roles do: reconnecting forever with their
	// pacing (store.ConnectConfig), to whichever server listens at addr.
	connect := func(name string) (*nats.Conn, jetstream.JetStream) {
		opts, err := store.ConnectConfig{URLs: []string{"nats://" + addr}, Name: name, Logger: testLogger(t)}.Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect("", opts...)
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
	_, js := connect("test")
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	kv, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	rnc, _ := connect("reconciler")
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- engine.Serve(sctx, rnc, engine.Config{Stream: cfg, Logger: testLogger(t)}) }()
	t.Cleanup(func() { cancel(); <-done })

	// ace: a live agent, renewing its lease on its own connection.
	_, ajs := connect("agent-ace")
	akv, err := ajs.KeyValue(ctx, cfg.Name+store.NodeLeaseBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := store.AcquireLease(ctx, akv, "ace", store.NewHolder("node", "ace"), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	agentsOf := func(node string) []string { return agentEvents(t, js, cfg, node) }
	waitfor.Until(t, 20*time.Second, "ace's up", func() bool { return len(agentsOf("ace")) == 1 })
	aceUp := agentsOf("ace")

	// bob: claimed by hand just before the server stops, never renewed:
	// an agent that dies as the server goes away.
	claim(t, kv, "bob", "b1")
	waitfor.Until(t, 20*time.Second, "bob's up", func() bool { return len(agentsOf("bob")) == 1 })
	e.Shutdown()
	// The outage itself (not a wait for something): longer than the
	// TTL, so both leases expire on the server's return.
	<-time.After(2 * ttl)
	e = start()
	back := time.Now()

	grace := engine.AgentGrace(ttl)
	waitfor.Until(t, grace+20*time.Second, "bob's down", func() bool {
		return slices.Equal(agentsOf("bob"), []string{"up b1", "down b1 expired"})
	})
	if took := time.Since(back); took < grace-time.Second {
		t.Errorf("bob's down was recorded %s after the server's return, before the grace (%s)", took, grace)
	}
	// bob's down came when the grace ended, the reconciler's view of ace
	// being settled then: ace has no down.
	if got := agentsOf("ace"); !slices.Equal(got, aceUp) {
		t.Errorf("ace's agent renewed its lease once the server was back; its agent events: %q, want %q", got, aceUp)
	}
	select {
	case <-lease.Lost():
		t.Fatalf("ace's lease was lost: %v", lease.Err())
	default:
	}
}
