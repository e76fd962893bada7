package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// served is one engine.Serve running on its own connection.
type served struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	ready  chan *engine.Reconciler
	done   chan error
}

// startServe runs engine.Serve with cfg on a new connection to e; the
// test ends it.
func startServe(t *testing.T, e *embedded.Server, cfg engine.Config) *served {
	t.Helper()
	nc, err := e.Connect(nats.Name("serve"))
	if err != nil {
		t.Fatal(err)
	}
	// Not testCtx's 30 s: a Serve lives until the test or its cleanup
	// ends it, and a test longer than 30 s under load (TestAgentLiveness
	// waits out two graces) had its first reconcilers stop mid-test.
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{nc: nc, cancel: cancel, ready: make(chan *engine.Reconciler, 1), done: make(chan error, 1)}
	cfg.Ready = func(_ context.Context, r *engine.Reconciler) { s.ready <- r }
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	go func() { s.done <- engine.Serve(ctx, nc, cfg) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
		nc.Close()
	})
	return s
}

// waitReady returns the reconciler once Serve called Ready.
func (s *served) waitReady(t *testing.T) *engine.Reconciler {
	t.Helper()
	select {
	case r := <-s.ready:
		return r
	case err := <-s.done:
		s.done <- err
		t.Fatalf("Serve returned before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Serve not ready within 20 s")
	}
	return nil
}

// wait returns what Serve returned.
func (s *served) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return within 20 s")
		return nil
	}
}

// Serve on a server with nothing: it creates the stream and the buckets,
// holds the stream lease, folds, answers state requests, refuses a second
// ungrouped reconciler, and on cancel stops gracefully (nil) and releases
// the lease, so that the next one starts at once.
func TestServe(t *testing.T) {
	t.Parallel()
	e, nc, js := storetest.Start(t)
	ctx := testCtx(t)
	a := startServe(t, e, engine.Config{})
	r := a.waitReady(t)
	cfg := r.Stream()
	if cfg.Name != store.DefaultStreamName || cfg.Partitions != events.DefaultPartitions {
		t.Fatalf("stream %s with %d partitions, want the defaults", cfg.Name, cfg.Partitions)
	}
	for _, b := range []string{cfg.Name + engine.LeaseBucketSuffix, cfg.Name + store.NodeLeaseBucketSuffix} {
		if _, err := js.KeyValue(ctx, b); err != nil {
			t.Errorf("bucket %s: %v", b, err)
		}
	}
	if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, "ace", want("pg:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ace to be folded", func() bool { _, ok := r.Node("ace"); return ok })
	msg, err := nc.RequestWithContext(ctx, events.StateSubject(cfg.Prefix, events.EndpointState, "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var v reconcile.View
	if err := json.Unmarshal(msg.Data, &v); err != nil || v.Node != "ace" {
		t.Fatalf("the state service answered %q (%v), want ace's view", msg.Data, err)
	}

	b := startServe(t, e, engine.Config{Stream: cfg})
	if err := b.wait(t); !errors.Is(err, engine.ErrBesideUngrouped) {
		t.Fatalf("a second ungrouped Serve: %v, want ErrBesideUngrouped", err)
	}

	a.cancel()
	if err := a.wait(t); err != nil {
		t.Fatalf("Serve after cancel: %v, want nil", err)
	}
	startServe(t, e, engine.Config{Stream: cfg}).waitReady(t)
}

// A member of a group folds the partitions the group grants it; an
// ungrouped Serve beside it is refused, naming the group.
func TestServeGroup(t *testing.T) {
	t.Parallel()
	e, _, _, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 4})
	a := startServe(t, e, engine.Config{Stream: cfg, Group: "g", Instance: "a", LeaseTTL: 2 * time.Second})
	r := a.waitReady(t)
	eventually(t, "member a to own every partition", func() bool { return len(r.Owned()) == cfg.Partitions })
	b := startServe(t, e, engine.Config{Stream: cfg})
	if err := b.wait(t); !errors.Is(err, engine.ErrBesideGroup) {
		t.Fatalf("an ungrouped Serve beside a group: %v, want ErrBesideGroup", err)
	}
	a.cancel()
	if err := a.wait(t); err != nil {
		t.Fatalf("a member's Serve after cancel: %v, want nil", err)
	}
}

// A connection closed under Serve ends it with store.ErrConnClosed; a
// configuration that cannot be served is refused before anything starts.
func TestServeErrors(t *testing.T) {
	t.Parallel()
	e, _, _ := storetest.Start(t)
	s := startServe(t, e, engine.Config{})
	s.waitReady(t)
	s.nc.Close()
	if err := s.wait(t); !errors.Is(err, store.ErrConnClosed) {
		t.Fatalf("Serve on a closed connection: %v, want store.ErrConnClosed", err)
	}

	if err := startServe(t, e, engine.Config{Pprof: true}).wait(t); err == nil {
		t.Error("Pprof without MetricsAddr: no error")
	}
	if err := startServe(t, e, engine.Config{MetricsAddr: "127.0.0.1:-1"}).wait(t); !errors.Is(err, engine.ErrMetricsListen) {
		t.Errorf("a metrics address that cannot be listened on: %v, want ErrMetricsListen", err)
	}
}
