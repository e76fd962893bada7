package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// hold claims node's lease for token and renews it (the same value, as
// an agent's renewal writes) every renewEvery, as a live agent does,
// until the stop it returns is called; stop returns once no renewal is
// in flight, so the lease then lives at most the bucket's TTL more. A
// claim written once and left to expire (claim) lived one TTL from its
// write, which a loaded machine (-race, load 20) outran: its lease expired
// and was recorded down before the test's next step (a takeover, a
// release, the reconcilers' stop) was taken.
func hold(t *testing.T, kv jetstream.KeyValue, node, token string, renewEvery time.Duration) (stop func()) {
	t.Helper()
	claim(t, kv, node, token)
	v, _ := json.Marshal(store.Holder{Role: "node", Name: node, Host: "h1", PID: 4242, Token: token})
	quit, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-quit:
				done <- nil
				return
			case <-time.After(renewEvery): // the renewal period, not a wait for an event
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := kv.Put(ctx, node, v)
			cancel()
			if err != nil {
				done <- fmt.Errorf("renewing %s's lease %s: %w", node, token, err)
				return
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(quit)
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// A group of two reconcilers watching the node lease bucket records each
// of an agent's transitions once, in order: up on a claim (renewals are
// none), down when the lease expires, is released, or is taken by a new
// agent; a reconciler started while a node is down records its down
// once, and an up it missed.
func TestAgentLiveness(t *testing.T) {
	t.Parallel()
	e, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 4})
	// Not testCtx's 30 s: the test waits out two graces, and took 46 s
	// under -race at load 26.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A short TTL: the bucket is made before Serve, whose TTL then wins.
	// Not 1 s: a lease lives while hold renews it every 100 ms, and under
	// -race on a loaded machine a put took over 0.5 s; 3 s leaves each
	// renewal 2.9 s.
	const ttl = 3 * time.Second
	const renewEvery = 100 * time.Millisecond
	kv, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	a := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "a", LeaseTTL: 2 * time.Second, Logger: testLogger(t).With("serve", "a")})
	b := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "b", LeaseTTL: 2 * time.Second, Logger: testLogger(t).With("serve", "b")})
	ra, rb := a.waitReady(t), b.waitReady(t)
	want := func(what string, w ...string) {
		t.Helper()
		// A restarted reconciler records an expiry's down only after its
		// grace (engine.AgentGrace). The limit only bounds a failing run:
		// under -race at load 26 a Serve's agent watch started 15 s
		// after its Ready.
		waitfor.Until(t, time.Minute+engine.AgentGrace(ttl), what, func() bool {
			return slices.Equal(agentEvents(t, js, cfg, "ace"), w)
		})
	}

	// Each agent below lives (renews its lease) until the step that ends
	// it: a lease left to expire by itself did so, on a loaded machine,
	// before the step meant to end it otherwise.
	stop := hold(t, kv, "ace", "c1", renewEvery)
	want("c1 up", "up c1") // its renewals are no transition
	stop()
	began := time.Now()
	want("c1 down when its lease expires", "up c1", "down c1 expired")
	t.Logf("lease unrenewed → down recorded: %s (TTL %s)", time.Since(began).Round(time.Millisecond), ttl)

	stop = hold(t, kv, "ace", "c2", renewEvery)
	want("c2 up", "up c1", "down c1 expired", "up c2")
	stop()
	stop = hold(t, kv, "ace", "c3", renewEvery) // a new agent takes the lease at once
	want("c2 replaced by c3", "up c1", "down c1 expired", "up c2", "down c2 replaced", "up c3")
	stop()
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

	// Both stop; c4, whose up they recorded, ends while nobody watches,
	// c5 claims: a reconciler started then records c5's up, after its
	// predecessor's down (replaced: its end was not seen).
	stop = hold(t, kv, "ace", "c4", renewEvery)
	h = append(h, "up c4")
	want("c4 up", h...)
	a.cancel()
	b.cancel()
	_, _ = a.wait(t), b.wait(t)
	stop()
	stop = hold(t, kv, "ace", "c5", renewEvery)
	c := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "c", LeaseTTL: 2 * time.Second, Logger: testLogger(t).With("serve", "c")})
	c.waitReady(t)
	h = append(h, "down c4 replaced", "up c5")
	want("c5 up after a restart", h...)
	// c5 expires while nobody watches: the next reconciler records its
	// down once, when the grace after its start ends.
	c.cancel()
	_ = c.wait(t)
	stop()
	eventually(t, "c5's lease to expire", func() bool {
		_, err := kv.Get(ctx, "ace")
		return err != nil
	})
	d := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "d", LeaseTTL: 2 * time.Second, Logger: testLogger(t).With("serve", "d")})
	d2 := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "d2", LeaseTTL: 2 * time.Second, Logger: testLogger(t).With("serve", "d2")})
	d.waitReady(t)
	d2.waitReady(t)
	h = append(h, "down c5 expired")
	want("c5 down after a restart", h...)
	// Nothing more comes: each transition was recorded once.
	hold(t, kv, "other", "o1", renewEvery)
	eventually(t, "another node's up", func() bool { return len(agentEvents(t, js, cfg, "other")) == 1 })
	if got := agentEvents(t, js, cfg, "ace"); !slices.Equal(got, h) {
		t.Fatalf("ace's agent events:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(h, "\n"))
	}
}
