package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A publish the server's permissions deny fails with the permission
// error as soon as the server reports it, not when the publish times out
// (the context here would allow 30 s; the JetStream default is 5 s).
func TestAppendDeniedFailsAtOnce(t *testing.T) {
	t.Parallel()
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"ctl": {Allow: []string{"$JS.API.>", "mesh.*.approve"}}})
	_, js := ps.Connect(t, "ctl")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	w := events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now())
	_, err = pub.Append(ctx, "ace", w)
	if !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("denied append: %v, want a permissions violation", err)
	}
	if store.Transient(err) {
		t.Error("a denied append is taken as transient")
	}
	if _, err := pub.AppendRetrying(ctx, "ace", w); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("denied retrying append: %v, want the permissions violation at once", err)
	}
	// An allowed subject on the same connection still publishes.
	a := events.Stamp(&events.Approve{Module: "nats", Build: "b", By: "ops"}, time.Now())
	if _, err := pub.Append(ctx, "ace", a); err != nil {
		t.Fatalf("allowed append: %v", err)
	}
}

// A verb's append on a cluster whose stream leader has just stopped
// retries while a new leader is elected, within its context, and is
// stored once.
func TestAppendRetryingThroughALeaderElection(t *testing.T) {
	t.Parallel()
	c, _, js, stream, cfg := storetest.StartClusterStream(t, 3, store.StreamConfig{Replicas: 3})
	pub := store.NewPublisher(js, cfg.Subjects())
	leader := c.StreamLeader(cfg.Name)
	if leader == nil {
		t.Fatal("no stream leader")
	}
	leader.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, err := pub.AppendRetrying(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
	if err != nil {
		t.Fatalf("append during the election: %v", err)
	}
	// The read is a direct get, which any replica may answer: one that
	// has not yet applied the acknowledged message says "no message"
	// (a fresh-clone CI run failed so). So wait for the stored want,
	// then check it is the one acknowledged.
	m := waitfor.Value(t, 10*time.Second, "the acknowledged want stored", func() (string, bool) {
		m, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindWant)
		return fmt.Sprintf("seq %d, %v", m.Event.Seq, err), err == nil
	})
	if want := fmt.Sprintf("seq %d, <nil>", ack.Seq); m != want {
		t.Fatalf("newest want %s; acknowledged at %d", m, ack.Seq)
	}
}

// The denials kept for a connection are freed when it closes: a
// long-running process that opens and closes connections (each with a
// Publisher) holds the open ones only, not every *nats.Conn it ever made
// (the map kept each one reachable). The closed handler set before is
// still called; one replaced after the install leaves the entry to the
// next install's sweep.
func TestDenialsFreedWhenTheConnectionCloses(t *testing.T) {
	// Not parallel: it counts the process's denial watches.
	e, _, _, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	connect := func(opts ...nats.Option) *nats.Conn {
		t.Helper()
		nc, err := e.Connect(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		store.NewPublisher(js, cfg.Subjects())
		if !store.DenialsWatched(nc) {
			t.Fatal("a Publisher's connection is not watched")
		}
		return nc
	}
	before := store.DenialsHeld()
	for i := range 100 {
		closed := make(chan struct{})
		nc := connect(nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
		nc.Close()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("connection %d: its own closed handler was not called", i)
		}
		if store.DenialsWatched(nc) {
			t.Fatalf("connection %d: its denials are still held after it closed", i)
		}
	}
	if held := store.DenialsHeld(); held > before {
		t.Errorf("after 100 connections opened and closed: %d held, %d before", held, before)
	}
	// A closed handler set after the install replaces the one that frees
	// the entry: the next install sweeps it.
	nc := connect()
	replaced := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(replaced) })
	nc.Close()
	select {
	case <-replaced:
	case <-time.After(10 * time.Second):
		t.Fatal("the replacing closed handler was not called")
	}
	if !store.DenialsWatched(nc) {
		t.Fatal("the entry is gone with its closed handler replaced: the sweep below is not tested")
	}
	connect()
	if store.DenialsWatched(nc) {
		t.Error("a closed connection's denials survive the next install")
	}
}
