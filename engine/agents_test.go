package engine_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// agentEvents returns node's agent events as "up C", "down C why".
func agentEvents(t *testing.T, js jetstream.JetStream, cfg store.StreamConfig, node string) []string {
	t.Helper()
	var out []string
	err := store.ReadNode(testCtx(t), js, cfg.Name, cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
		if a, ok := m.Event.Payload.(*events.Agent); ok {
			s := string(a.State) + " " + a.Claim
			if a.Why != "" {
				s += " " + string(a.Why)
			}
			out = append(out, s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// claim writes a node lease by hand, as an agent's claim or renewal
// does, without renewing it.
func claim(t *testing.T, kv jetstream.KeyValue, node, token string) {
	t.Helper()
	v, _ := json.Marshal(store.Holder{Role: "node", Name: node, Host: "h1", PID: 4242, Token: token})
	if _, err := kv.Put(testCtx(t), node, v); err != nil {
		t.Fatal(err)
	}
}

// A group of two reconcilers watching the node lease bucket records each
// of an agent's transitions once, in order: up on a claim (renewals are
// none), down when the lease expires, is released, or is taken by a new
// agent; a reconciler started while a node is down records its down
// once, and an up it missed.
func TestAgentLiveness(t *testing.T) {
	e, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 4})
	ctx := testCtx(t)
	// A short TTL: the bucket is made before Serve, whose TTL then wins.
	kv, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: time.Second, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	a := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "a", LeaseTTL: 2 * time.Second})
	b := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "b", LeaseTTL: 2 * time.Second})
	ra, rb := a.waitReady(t), b.waitReady(t)
	want := func(what string, w ...string) {
		t.Helper()
		// A restarted reconciler records an expiry's down only after its
		// grace (engine.AgentGrace).
		waitfor.Until(t, 10*time.Second+engine.AgentGrace(time.Second), what, func() bool {
			return slices.Equal(agentEvents(t, js, cfg, "ace"), w)
		})
	}

	claim(t, kv, "ace", "c1")
	want("c1 up", "up c1")
	for range 3 { // renewals: no transition
		claim(t, kv, "ace", "c1")
	}
	began := time.Now()
	want("c1 down when its lease expires", "up c1", "down c1 expired")
	t.Logf("lease unrenewed → down recorded: %s (TTL 1s)", time.Since(began).Round(time.Millisecond))

	claim(t, kv, "ace", "c2")
	want("c2 up", "up c1", "down c1 expired", "up c2")
	claim(t, kv, "ace", "c3") // a new agent takes the lease at once
	want("c2 replaced by c3", "up c1", "down c1 expired", "up c2", "down c2 replaced", "up c3")
	if err := kv.Delete(ctx, "ace"); err != nil {
		t.Fatal(err)
	}
	h := []string{"up c1", "down c1 expired", "up c2", "down c2 replaced", "up c3", "down c3 released"}
	want("c3 released", h...)

	// The folded state says the agent is down; a have brings it up.
	eventually(t, "the state to say ace's agent is down", func() bool {
		for _, r := range []*engine.Reconciler{ra, rb} {
			if st, ok := r.Node("ace"); ok && st.Agent != nil && !st.Agent.Up {
				return true
			}
		}
		return false
	})

	// Both stop; c4 claims and expires while nobody watches, c5 claims:
	// a reconciler started then records c5's up, after its predecessor's
	// down (replaced: its end was not seen).
	claim(t, kv, "ace", "c4")
	h = append(h, "up c4")
	want("c4 up", h...)
	a.cancel()
	b.cancel()
	_, _ = a.wait(t), b.wait(t)
	claim(t, kv, "ace", "c5")
	c := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "c", LeaseTTL: 2 * time.Second})
	c.waitReady(t)
	h = append(h, "down c4 replaced", "up c5")
	want("c5 up after a restart", h...)
	// c5 expires while nobody watches: the next reconciler records its
	// down once, when the grace after its start ends.
	c.cancel()
	_ = c.wait(t)
	eventually(t, "c5's lease to expire", func() bool {
		_, err := kv.Get(ctx, "ace")
		return err != nil
	})
	d := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "d", LeaseTTL: 2 * time.Second})
	d2 := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "d2", LeaseTTL: 2 * time.Second})
	d.waitReady(t)
	d2.waitReady(t)
	h = append(h, "down c5 expired")
	want("c5 down after a restart", h...)
	// Nothing more comes: each transition was recorded once.
	claim(t, kv, "other", "o1")
	eventually(t, "another node's up", func() bool { return len(agentEvents(t, js, cfg, "other")) == 1 })
	if got := agentEvents(t, js, cfg, "ace"); !slices.Equal(got, h) {
		t.Fatalf("ace's agent events:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(h, "\n"))
	}
}
