package store_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A claim whose credentials may open the lease bucket but not write its
// key ends with the denial named: NATS answers a denied publish with no
// reply, and the claim, taking the silence for an election, asked again
// until its ride-out (30 s) and then said only "context deadline
// exceeded". Another key of the same bucket, on the same connection, is
// still claimed.
func TestLeaseClaimDeniedEndsWithTheDenial(t *testing.T) {
	t.Parallel()
	const denied = "$KV.MESH_NODES.ace"
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{
		"admin": {},
		"node":  {Allow: []string{"$JS.API.>", "$KV.MESH_NODES.>"}, Deny: []string{denied}},
	})
	_, admin := ps.Connect(t, "admin")
	_, node := ps.Connect(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.OpenNodeLeases(ctx, admin, store.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenNodeLeases(ctx, node, store.StreamConfig{})
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

// A lease held whose renewal the server comes to deny (the holder's
// permissions changed under it: the server's config reloaded without
// the key) is lost at the next renewal, with the denial named, and the
// denial is not said as an outage: the renewal was not under the denial
// watch, so it timed out, was logged "NATS unreachable since …", and was
// asked again for ever, a timeout each time, while the key expired under
// its holder (never Lost: no revision mismatch was ever answered).
func TestLeaseRenewalDeniedEndsTheLease(t *testing.T) {
	t.Parallel()
	const denied = "$KV.MESH_NODES.ace"
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"node": {}})
	_, js := ps.Connect(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := store.OpenNodeLeases(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var logs storetest.SyncBuffer
	l, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Abandon()
	at := ps.Deny(t, "node", denied)
	select {
	case <-l.Lost():
	case <-time.After(4 * l.TTL()):
		t.Fatalf("the lease is still held %s after its renewals were denied; log:\n%s", 4*l.TTL(), logs.String())
	}
	t.Logf("lost %v after the reload (TTL %s): %v", time.Since(at).Round(time.Millisecond), l.TTL(), l.Err())
	var de *store.DeniedError
	if err := l.Err(); !errors.As(err, &de) || de.Subject != denied || !errors.Is(err, store.ErrPermissionDenied) || errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("lease lost with %v, want the denial of %s", err, denied)
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("the denial was said as an outage:\n%s", logs.String())
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release after the loss: %v, want nil (nothing to delete)", err)
	}
}
