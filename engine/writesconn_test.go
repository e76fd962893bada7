package engine_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// connsNamed returns the open client connections of e named name, as the
// server lists them (its connz).
func connsNamed(t *testing.T, e *embedded.Server, name string) []*server.ConnInfo {
	t.Helper()
	z, err := e.NATS().Connz(&server.ConnzOptions{Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var named []*server.ConnInfo
	for _, c := range z.Conns {
		if c.Name == name {
			named = append(named, c)
		}
	}
	return named
}

// Serve writes its effects and snapshots on a connection of its own,
// named after its reading one ("serve writes" beside "serve"), and closes
// it when it returns (docs/architecture.md, "The reconciler writes on a
// connection of its own"): a plan and its state's put arrive on it.
func TestServeWritesOnAConnectionOfItsOwn(t *testing.T) {
	t.Parallel()
	e, _, js := storetest.Start(t)
	ctx := testCtx(t)
	s := startServe(t, e, engine.Config{})
	r := s.waitReady(t)
	writes := connsNamed(t, e, "serve writes")
	if len(writes) != 1 {
		t.Fatalf("%d connections named %q, want 1", len(writes), "serve writes")
	}
	before := writes[0].InMsgs
	cfg := r.Stream()
	if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, "ace", want("pg:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ace's plan and state written on the writes' connection", func() bool {
		w := connsNamed(t, e, "serve writes")
		// The plan, and at least one snapshot put (its state or its
		// partition's checkpoint).
		return len(w) == 1 && w[0].InMsgs >= before+2
	})
	if _, err := store.LastMsg(ctx, store.Leader(js, cfg.Name), cfg.Subjects(), "ace", events.KindPlan); err != nil {
		t.Fatalf("ace's plan: %v", err)
	}
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatalf("Serve after cancel: %v, want nil", err)
	}
	eventually(t, "the writes' connection closed with Serve", func() bool { return len(connsNamed(t, e, "serve writes")) == 0 })
}

// Config.WritesConn set to the reading connection writes on that one:
// Serve opens no other, and folds and plans as before.
func TestServeWritesOnTheConnectionGiven(t *testing.T) {
	t.Parallel()
	e, _, js := storetest.Start(t)
	ctx := testCtx(t)
	nc, err := e.Connect(nats.Name("one"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *engine.Reconciler, 1)
	done := make(chan error, 1)
	go func() {
		done <- engine.Serve(sctx, nc, engine.Config{WritesConn: nc, Logger: testLogger(t),
			Ready: func(_ context.Context, r *engine.Reconciler) { ready <- r }})
	}()
	defer func() { cancel(); <-done }()
	var r *engine.Reconciler
	select {
	case r = <-ready:
	case err := <-done:
		t.Fatalf("Serve returned before it was ready: %v", err)
	case <-ctx.Done():
		t.Fatal("Serve not ready")
	}
	if n := len(connsNamed(t, e, "one writes")); n != 0 {
		t.Fatalf("%d connections named %q, want none", n, "one writes")
	}
	cfg := r.Stream()
	if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, "ace", want("pg:1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ace's plan", func() bool {
		_, err := store.LastMsg(ctx, store.Leader(js, cfg.Name), cfg.Subjects(), "ace", events.KindPlan)
		return err == nil
	})
}
