package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A rollout in progress on a 3-server cluster (R3 stream and buckets),
// its targets healthy for part of min_healthy, when the server leading
// the node lease bucket is killed with SIGKILL (a fresh user's finding,
// G1): no agent could renew its lease during the election, and every
// agent of the mesh was recorded down, then up when it claimed its lease
// again; no have followed (nothing changed on the nodes), so no target
// became healthy again, each failed at its healthy_deadline and
// auto_revert reverted a healthy build. Now no live agent is recorded
// down and the rollout completes.
func TestRolloutRidesOutALeaseLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election and min_healthy: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	nc, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenNodeLeases(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	bucket := "KV_" + kv.Bucket()
	leaderOf := func() int {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return pc.Leader(lctx, js, bucket)
	}
	// A bucket just made elects its first leader within a second here,
	// several under load (one read right after found none at -parallel 4).
	leader := pc.AwaitLeader(t, ctx, js, bucket, 30*time.Second)
	// Every component prefers a server other than the bucket's leader:
	// the reconciler's connection never drops (no reconnect starts its
	// grace), as on the user's cluster.
	urls := strings.Split(pc.URLs(), ",")
	other := (leader + 1) % len(urls)
	urls[0], urls[other] = urls[other], urls[0]
	m := &mesh{t: t, nc: nc, js: js, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects()), logs: &storetest.SyncBuffer{}}
	m.dial = func(name string) (*nats.Conn, error) {
		opts, err := store.ConnectConfig{URLs: urls, Name: name, Logger: m.logger("conn").With("conn", name)}.Options()
		if err != nil {
			return nil, err
		}
		return nats.Connect("", append(opts, nats.DontRandomize())...)
	}
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	m.signer = must(store.NewSigner(kp))(t)
	m.trust = must(store.NewTrust(m.signer.PublicKey()))(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", m.logs.String())
		}
	})
	m.startReconciler()
	agentsOf := func(node string) []string {
		var out []string
		err := store.ReadNode(m.ctx(), js, cfg.Name, cfg.Subjects(), node, 0, 0, func(msg store.Msg) error {
			if a, ok := msg.Event.Payload.(*events.Agent); ok {
				out = append(out, string(a.State)+" "+string(a.Why))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// eve: a lease claimed and left to expire, a dead agent: its down
	// says the grace after the reconciler's start is over (the kill
	// below must not fall in it).
	eve, _ := jsonHolder("eve")
	if _, err := kv.Put(ctx, "eve", eve); err != nil {
		t.Fatal(err)
	}
	nodes := fleetNodes(t, m, 4)
	waitfor.Until(t, time.Minute+engine.AgentGrace(store.DefaultNodeLeaseTTL), "eve's down", func() bool {
		return slices.Equal(agentsOf("eve"), []string{"up ", "down expired"})
	})
	ups := map[string][]string{}
	for _, n := range nodes {
		ups[n.name] = agentsOf(n.name)
	}

	f := fleetFile(t, nodes, "web:2", "{batch: 4, max_unavailable: 4, min_healthy: 20s, healthy_deadline: 60s, auto_revert: true}")
	id := m.apply(t, f)
	for _, n := range nodes {
		if _, err := m.waitEvent(ctx, n.name, events.KindHave, func(ev events.Event) bool {
			h := ev.Payload.(*events.Have)
			return len(h.Modules) == 1 && h.Modules[0].Build == "web:2" && h.Modules[0].State == events.Running
		}); err != nil {
			t.Fatalf("%s never ran web:2: %v", n.name, err)
		}
	}
	if i := leaderOf(); i >= 0 {
		leader = i
	}
	pc.Kill(leader)
	killed := time.Now()
	t.Logf("killed %s, the node lease bucket's leader, with every target running web:2", pc.Name(leader))

	// The replay's reads may go unanswered during the election: retried.
	s := waitfor.Value(t, 3*time.Minute, "the rollout's end", func() (replayed, bool) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := feed.Replay(rctx, js, cfg, nil, "web")
		if err != nil || s.Rollout == nil || s.Rollout.ID != id {
			return replayed{}, false
		}
		return replayed{s}, s.Rollout.Phase.Final()
	}).s
	v := s.View()
	var downs int
	for _, n := range nodes {
		if got := agentsOf(n.name); !slices.Equal(got, ups[n.name]) {
			downs++
			t.Logf("%s's agent events: %q", n.name, got)
		}
	}
	t.Logf("after the kill: %d of %d live agents recorded down; rollout %s (%v) %s after the kill",
		downs, len(nodes), s.Rollout.Phase, v.Counts, time.Since(killed).Round(time.Millisecond))
	if downs > 0 {
		t.Errorf("%d live agents recorded down", downs)
	}
	if s.Rollout.Phase != rollout.Completed || v.Counts[rollout.Done] != len(nodes) {
		t.Errorf("rollout %s, counts %v: want completed, %d done", s.Rollout.Phase, v.Counts, len(nodes))
	}
}

// jsonHolder is a node lease's value for node, held by no process.
func jsonHolder(node string) ([]byte, error) {
	return json.Marshal(store.Holder{Role: "node", Name: node, Host: "gone", PID: 1, Token: node + "-gone"})
}
