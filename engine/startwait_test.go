package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A reconciler started on a fresh cluster that has no JetStream meta
// leader (two of its three servers down: no quorum) says once what it
// waits for, and is up once a quorum is back (the servers restarted, as
// a service manager does), within its start's bounds: its requests, the
// stream's and the buckets' lookups and creations, go unanswered and are
// asked again. Also with a group (`reconcile --group`), whose lease
// bucket is opened beside. Before, it said nothing until it was up or a
// bound's end.
func TestServeWaitsForAFreshClustersLeaders(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts and kills servers and waits for elections: not in -short")
	}
	for _, tc := range []struct {
		name, group, said string
		down              []int
	}{
		{"no meta leader", "", "waiting for the NATS cluster's JetStream leaders", []int{1, 2}},
		{"no meta leader, group", "g", "waiting for the NATS cluster's JetStream leaders", []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := storetest.StartProcCluster(t, 3)
			nc, _ := pc.ConnectVia(t, 0)
			for _, i := range tc.down {
				pc.Kill(i)
			}
			var logs storetest.SyncBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			ctx, cancel := context.WithCancel(context.Background())
			ready := make(chan time.Time, 1)
			done := make(chan error, 1)
			cfg := engine.Config{Stream: store.StreamConfig{Replicas: 3, Partitions: 2}, Logger: log, NoRollouts: true,
				Ready: func(context.Context, *engine.Reconciler) { ready <- time.Now() }}
			if tc.group != "" {
				cfg.Group, cfg.Instance = tc.group, "a"
			}
			t0 := time.Now()
			go func() { done <- engine.Serve(ctx, nc, cfg) }()
			t.Cleanup(func() { cancel(); <-done; t.Log(logs.String()) })

			said := tc.said
			for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), said); {
				select {
				case err := <-done:
					done <- err // for the cleanup, which waits for it
					t.Fatalf("serve ended before saying it waits, %s after its start: %v", time.Since(t0).Round(time.Millisecond), err)
				case <-time.After(50 * time.Millisecond): // the pace of the log's reads
				}
				if time.Now().After(deadline) {
					t.Fatalf("serve did not say %q within 20 s", said)
				}
			}
			t.Logf("serve said it waits %s after its start", time.Since(t0).Round(time.Millisecond))
			pc.Restart(tc.down[0]) // a quorum again, or every peer
			back := time.Now()
			for _, i := range tc.down[1:] {
				pc.Restart(i)
			}
			select {
			case at := <-ready:
				t.Logf("serve ready %s after its start, %s after the first server was back", at.Sub(t0).Round(time.Millisecond), at.Sub(back).Round(time.Millisecond))
			case err := <-done:
				done <- err // for the cleanup, which waits for it
				t.Fatalf("serve ended %s after its start, %s after the first server was back: %v", time.Since(t0).Round(time.Millisecond), time.Since(back).Round(time.Millisecond), err)
			case <-time.After(60 * time.Second):
				t.Fatalf("serve not ready 60 s after the first server was back")
			}
			if n := strings.Count(logs.String(), "waiting for the NATS cluster's"); n != 1 {
				t.Errorf("serve said %q %d times, want once", said, n)
			}
		})
	}
}
