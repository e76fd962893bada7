package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The agent liveness watch records a node's provisioner lease (the key
// <node>.provisioner of the node lease bucket) as prov events, by the
// agent's rules, apart from the node agent's: a claim is up, a release is
// down released, an expiry (a provisioner killed with kill -9, which
// stops renewing) is down expired, each once, and the agent's events of
// the same node are its own (a fresh user's finding: a kill -9'd
// provisioner went unnoticed).
func TestProvisionerLeaseRecorded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out a grace after the watch's start: not in -short")
	}
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 2})
	ctx, cancelCtx := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCtx()
	const ttl = time.Second
	kv, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	w := &agentWatch{kv: kv, stream: stream, subj: cfg.Subjects(), pub: pub, log: slog.New(slog.NewTextHandler(sweepTestLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		leases: map[string]*nodeLease{}, last: map[string]*agentRecord{}, dirty: map[string]bool{}, now: time.Now,
		held: map[string]bool{}, sweepTimeout: sweepTimeout}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	provsOf := func(node string) []string {
		var out []string
		if err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
			if p, ok := m.Event.Payload.(*events.Prov); ok {
				out = append(out, strings.TrimSpace(string(p.State)+" "+p.Claim+" "+string(p.Why)))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	put := func(key string, h store.Holder) {
		t.Helper()
		v, _ := json.Marshal(h)
		if _, err := kv.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	p1 := store.Holder{Role: "provisioner", Name: "ace", Host: "h1", PID: 7, Token: "p1"}
	put(store.ProvisionerLeaseKey("ace"), p1)
	put("ace", store.Holder{Role: "node", Name: "ace", Host: "h1", PID: 8, Token: "a1"})
	// The agent renews every ttl/4 on its own goroutine, as a live one
	// does, for the whole test: renewed only from the last wait's polls,
	// it expired on a loaded machine (CI, load ~40: a poll's stream reads
	// outlasted the TTL) and was recorded down.
	renewing := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(ttl / 4)
		defer tick.Stop()
		v, _ := json.Marshal(store.Holder{Role: "node", Name: "ace", Host: "h1", PID: 8, Token: "a1"})
		for {
			select {
			case <-renewing:
				return
			case <-ctx.Done(): // the test ended early
				return
			case <-tick.C:
				_, _ = kv.Put(ctx, "ace", v)
			}
		}
	}()

	waitfor.Until(t, 20*time.Second, "ace's provisioner and agent up", func() bool {
		put(store.ProvisionerLeaseKey("ace"), p1) // renewed: a put lives one TTL
		return slices.Equal(provsOf("ace"), []string{"up p1"}) && slices.Equal(agentEventsOf(ctx, t, js, cfg, "ace"), []string{"up a1"})
	})
	if err := kv.Delete(ctx, store.ProvisionerLeaseKey("ace")); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 20*time.Second, "ace's provisioner down (released)", func() bool {
		return slices.Equal(provsOf("ace"), []string{"up p1", "down p1 released"})
	})

	// A provisioner that stops renewing (kill -9): down expired once the
	// watch's grace after its start is over; the agent, renewed, stays up.
	put(store.ProvisionerLeaseKey("ace"), store.Holder{Role: "provisioner", Name: "ace", Host: "h1", PID: 9, Token: "p2"})
	waitfor.Until(t, AgentGrace(ttl)+20*time.Second, "ace's provisioner up, then down (expired)", func() bool {
		return slices.Equal(provsOf("ace"), []string{"up p1", "down p1 released", "up p2", "down p2 expired"})
	})
	close(renewing)
	<-renewed
	if got := agentEventsOf(ctx, t, js, cfg, "ace"); !slices.Equal(got, []string{"up a1"}) {
		t.Errorf("ace's agent events: %q, want only its up", got)
	}
}
