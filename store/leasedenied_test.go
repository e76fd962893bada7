package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// A claim whose credentials may open the lease bucket but not write its
// key ends with the denial named: NATS answers a denied publish with no
// reply, and the claim, taking the silence for an election, asked again
// until its ride-out (30 s) and then said only "context deadline
// exceeded". Another key of the same bucket, on the same connection, is
// still claimed.
func TestLeaseClaimDeniedEndsWithTheDenial(t *testing.T) {
	const denied = "$KV.MESH_NODES.ace"
	srv, err := server.NewServer(&server.Options{ServerName: "leasedenied", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "node", Password: "pw", Permissions: &server.Permissions{Publish: &server.SubjectPermission{
				Allow: []string{"$JS.API.>", "$KV.MESH_NODES.>"},
				Deny:  []string{denied},
			}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	connect := func(user string) jetstream.JetStream {
		t.Helper()
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, "pw"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.OpenNodeLeases(ctx, connect("admin"), store.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenNodeLeases(ctx, connect("node"), store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// The claim's own bound, less than ctx's: without the guard it ends
	// there, with no denial said.
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	start := time.Now()
	l, err := store.AcquireLease(cctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	took := time.Since(start)
	ccancel()
	t.Logf("denied claim ended after %v: %v", took, err)
	var de *store.DeniedError
	if !errors.As(err, &de) || de.Subject != denied || !errors.Is(err, store.ErrPermissionDenied) || !errors.Is(err, nats.ErrPermissionViolation) {
		if l != nil {
			l.Abandon()
		}
		t.Fatalf("denied claim: %v after %v; want a *DeniedError of %s", err, took, denied)
	}
	// An allowed key, on the same connection, is claimed.
	b, err := store.AcquireLease(ctx, kv, "bob", store.NewHolder("node", "bob"), nil)
	if err != nil {
		t.Fatalf("allowed claim: %v", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Error(err)
	}
}
