package engine_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// One server of a 3-server cluster killed with SIGKILL: the one leading
// the MESH stream (the event stream), the node lease bucket led by
// another. A fresh user saw every agent of the mesh recorded down, then
// up, after such a kill; this test has not reproduced it (nor has the
// same with the CLI: docs/architecture.md, "Agent liveness across a crash
// of the stream's leader"), and guards that no live agent is recorded
// down. Six live agents hold their leases on connections spread over the
// three servers (two on the killed one); the reconciler's connection is to
// a server not killed, so no reconnect starts its grace. An agent that
// dies as the server does (fox) is still recorded down, and one claimed
// after the election that dies (gus) says expiries are judged again.
// Placements: the stream's leader alone; the stream's and the meta
// group's leader; the stream's and the node lease bucket's leader (the
// leases expire in its election: TestAgentLivenessAcrossALeaseLeaderKill's
// case, with the stream leaderless too).
func TestAgentLivenessAcrossAStreamLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	for _, tc := range []struct {
		name         string
		meta, bucket bool // the killed server leads the meta group, the node lease bucket too
	}{
		{"stream leader alone", false, false},
		{"stream and meta leader", true, false},
		{"stream and lease bucket leader", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if (tc.meta || tc.bucket) && os.Getenv("MESHFOLD_TEST_ALL_PLACEMENTS") == "" {
				// 30-60 s each under the race detector, and the suite must stay
				// well under CI's 15 minutes: the bucket's placement is
				// TestAgentLivenessAcrossALeaseLeaderKill's case, and the meta
				// leader's made no difference in 6 runs.
				t.Skip("set MESHFOLD_TEST_ALL_PLACEMENTS=1 to run this placement")
			}
			testStreamLeaderKill(t, tc.meta, tc.bucket)
		})
	}
}

func testStreamLeaderKill(t *testing.T, meta, bucketToo bool) {
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
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
	// The placement: server x leads the stream (and the meta group when
	// meta), server y the node lease bucket (x too when bucketToo), server
	// z neither. The meta leader stays where it is (a stepdown of the meta
	// group is a system account's request).
	m := pc.MetaLeader()
	if m < 0 {
		t.Fatal("no meta leader")
	}
	x, y := (m+1)%3, m
	if meta {
		x, y = m, (m+1)%3
	}
	if bucketToo {
		y = x
	}
	z := (x + 1) % 3
	if z == y {
		z = (z + 1) % 3
	}
	mctx, mcancel := context.WithTimeout(ctx, time.Minute)
	for _, mv := range []struct {
		stream string
		to     int
	}{{cfg.Name, x}, {"KV_" + bucket, y}} {
		if err := pc.MoveLeader(mctx, js, mv.stream, mv.to); err != nil {
			t.Fatal(err)
		}
	}
	mcancel()
	leaderOf := func(stream string) int {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return pc.Leader(lctx, js, stream)
	}
	if s, b := leaderOf(cfg.Name), leaderOf("KV_"+bucket); s != x || b != y {
		t.Fatalf("placement: the stream's leader is %d, the bucket's %d; want %d and %d", s, b, x, y)
	}
	t.Logf("%s leads the stream, %s the node lease bucket, %s the meta group", pc.Name(x), pc.Name(y), pc.Name(pc.MetaLeader()))

	// connect dials as the roles do (store.ConnectConfig): every
	// server's URL, reconnecting forever with their pacing, server
	// prefer first.
	connect := func(name string, prefer int) (*nats.Conn, jetstream.JetStream) {
		urls := strings.Split(pc.URLs(), ",")
		urls[0], urls[prefer] = urls[prefer], urls[0]
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
	// The reconciler's connection is to the third server: it never
	// drops (no reconnect starts its grace), as on the user's cluster.
	rnc, _ := connect("reconciler", z)
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- engine.Serve(sctx, rnc, engine.Config{Stream: cfg, Logger: testLogger(t).With("serve", "r"),
			Ready: func(context.Context, *engine.Reconciler) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the reconciler did not start: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the reconciler not ready after a minute")
	}
	t.Cleanup(func() { scancel(); <-done })

	// The agents' connections are spread over the three servers: those
	// on the killed one reconnect.
	live := []string{"ace", "bob", "cat", "dot", "elk", "fin"}
	for i, n := range live {
		_, ajs := connect("agent-"+n, i%3)
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
	// The test reads on its own connection to z, and a read that fails
	// (during the election) is read again.
	_, tjs := connect("test", z)
	agentsOf := func(node string) []string {
		for {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			got, err := readAgentEvents(rctx, tjs, cfg, node)
			cancel()
			if err == nil {
				return got
			}
			t.Logf("reading %s's agent events again: %v", node, err)
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
		}
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
	if s, b := leaderOf(cfg.Name), leaderOf("KV_"+bucket); s != x || b != y {
		t.Fatalf("placement before the kill: the stream's leader is %d, the bucket's %d; want %d and %d", s, b, x, y)
	}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		t.Logf("before the kill, %s is led by %d", name, leaderOf(name))
	}
	if err := names.Err(); err != nil {
		t.Logf("the stream names listed: %v", err)
	}
	stopFox()
	pc.Kill(x)
	killed := time.Now()
	t.Logf("killed %s, the stream's leader", pc.Name(x))
	waitfor.Until(t, time.Minute, "new leaders of the stream and the bucket", func() bool {
		s, b := leaderOf(cfg.Name), leaderOf("KV_"+bucket)
		return s >= 0 && s != x && b >= 0 && b != x
	})
	t.Logf("new leaders after %s", time.Since(killed).Round(time.Millisecond))
	waitfor.Until(t, 2*time.Minute, "fox's down", func() bool {
		return slices.Equal(agentsOf("fox"), []string{"up f1", "down f1 expired"})
	})
	t.Logf("fox's down recorded %s after the kill", time.Since(killed).Round(time.Millisecond))
	// gus: an agent claimed after the election that dies: its down says
	// the watch has judged the expiries since (the live agents' too).
	stopGus := hold(t, kv, "gus", "g1", 500*time.Millisecond)
	waitfor.Until(t, time.Minute, "gus's up", func() bool { return len(agentsOf("gus")) == 1 })
	stopGus()
	waitfor.Until(t, 2*time.Minute, "gus's down", func() bool {
		return slices.Equal(agentsOf("gus"), []string{"up g1", "down g1 expired"})
	})
	t.Logf("gus's down recorded %s after the kill", time.Since(killed).Round(time.Millisecond))
	for _, n := range live {
		if got := agentsOf(n); !slices.Equal(got, ups[n]) {
			t.Errorf("%s's agent lived and renewed its lease throughout; its agent events: %q, want %q", n, got, ups[n])
		}
	}
}

// readAgentEvents is agentEvents that returns a failed read's error.
func readAgentEvents(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, node string) ([]string, error) {
	var out []string
	err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
		if a, ok := m.Event.Payload.(*events.Agent); ok {
			s := string(a.State) + " " + a.Claim
			if a.Why != "" {
				s += " " + string(a.Why)
			}
			out = append(out, s)
		}
		return nil
	})
	return out, err
}
