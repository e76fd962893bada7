package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// dial connects to url as meshfold's roles do (store.Connect: the
// product's connect timeout, reconnecting), for a test's own reads and
// publishes; the test's end closes it. A bare nats.Connect's 2 s
// handshake timeout, which the product gave up for the same reason, ran
// out on the loaded machine ("read tcp …: i/o timeout":
// TestTwoServesTrustOnlyTheirOwn, 4 of 40 runs at load ~30).
func dial(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{url}, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// mesh is an embedded server with meshfold's stream, for CLI tests.
type mesh struct {
	e   *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg store.StreamConfig
}

func startMesh(t testing.TB) *mesh {
	e, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	return &mesh{e: e, nc: nc, js: js, cfg: cfg}
}

// serveReconciler runs the reconciler on m as serve does (engine.Serve,
// with its state service, on a connection of its own) and returns it
// once it is up; the test's end stops it.
func (m *mesh) serveReconciler(t testing.TB) *engine.Reconciler {
	t.Helper()
	nc, err := m.e.Connect(nats.Name("reconciler"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *engine.Reconciler, 1)
	done := make(chan error, 1)
	go func() {
		done <- engine.Serve(ctx, nc, engine.Config{Stream: m.cfg,
			Ready: func(_ context.Context, r *engine.Reconciler) { ready <- r }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reconciler: %v", err)
		}
		nc.Close()
	})
	select {
	case r := <-ready:
		return r
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("reconciler did not start: %v", err)
	case <-testCtx(t).Done():
		t.Fatal("reconciler not up in time")
	}
	return nil
}

// cli runs meshfold with args against m's server and returns its stdout,
// stderr and exit code.
func (m *mesh) cli(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	var out bytes.Buffer
	var errb storetest.SyncBuffer // the connection logs "closed" asynchronously
	all := append(append([]string{}, args...), "--server", m.e.ClientURL())
	code := run(testCtx(t), all, nil, &out, &errb)
	return out.String(), errb.String(), code
}

// publish appends every event of s to the stream, in order, on its plain
// subject, and checks that each lands at the sequence s gave it (the
// stream must be empty before).
func (m *mesh) publish(t testing.TB, s *reconciletest.Stream) {
	t.Helper()
	subj := m.cfg.Subjects()
	publishEvents(t, m.js, len(s.Events), func(i int) (string, []byte, uint64) {
		ev := s.Events[i]
		data, err := s.Data(ev)
		if err != nil {
			t.Fatal(err)
		}
		return subj.Event(ev.Node, ev.Kind), data, ev.Seq
	})
}

// publishEvents publishes n messages with async publishes, at most 4000
// in flight, and checks each ack's sequence.
func publishEvents(t testing.TB, js jetstream.JetStream, n int, msg func(i int) (subject string, data []byte, seq uint64)) {
	t.Helper()
	type pending struct {
		f   jetstream.PubAckFuture
		seq uint64
	}
	var inflight []pending
	check := func(p pending) {
		select {
		case ack := <-p.f.Ok():
			if ack.Sequence != p.seq {
				t.Fatalf("event landed at #%d, want #%d", ack.Sequence, p.seq)
			}
		case err := <-p.f.Err():
			t.Fatalf("publish #%d: %v", p.seq, err)
		}
	}
	for i := range n {
		subject, data, seq := msg(i)
		if len(inflight) == 4000 {
			check(inflight[0])
			inflight = inflight[1:]
		}
		f, err := js.PublishAsync(subject, data)
		if err != nil {
			t.Fatalf("publish #%d: %v", seq, err)
		}
		inflight = append(inflight, pending{f, seq})
	}
	for _, p := range inflight {
		check(p)
	}
}

func seqArg(seq uint64) string { return fmt.Sprint(seq) }
