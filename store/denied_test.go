package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
	srv, err := server.NewServer(&server.Options{ServerName: "perm", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "ctl", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"$JS.API.>", "mesh.*.approve"}},
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("ctl", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
