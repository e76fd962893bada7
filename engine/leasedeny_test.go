package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// startPermServer starts a server whose one user, "reconciler", is
// allowed everything until the test takes a permission away
// ([storetest.PermServer.Deny]), and connects to it as that user, named
// as `meshfold reconcile` names its connection.
func startPermServer(t *testing.T) (*storetest.PermServer, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"reconciler": {}})
	nc, js := ps.Connect(t, "reconciler", nats.Name("meshfold reconcile"))
	return ps, nc, js
}

// deniedAfter says, for the figures, when the first line saying a
// denied renewal was logged, after at.
func (h logRecords) deniedAfter(at time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range *h.recs {
		if strings.Contains(r.Message, "not renewed: the server denies") {
			return r.Time.Sub(at).Round(time.Millisecond).String()
		}
	}
	return "never"
}

// serveDenied runs engine.Serve with cfg (the default lease TTL, 15 s,
// unless cfg says otherwise) as the reconciler user until it is ready and
// ready(r) holds, takes the lease bucket's writes away from the user, and
// returns what Serve returned (logging how long after the reload). It
// fails the test when Serve still runs 40 s after the reload: before the
// renewals were under the denial watch, it ran on for ever.
func serveDenied(t *testing.T, cfg engine.Config, ready func(r *engine.Reconciler) bool) (logs logRecords, err error) {
	t.Helper()
	ps, nc, _ := startPermServer(t)
	logs = newLogRecords()
	cfg.Logger = slog.New(logs)
	readyc := make(chan *engine.Reconciler, 1)
	cfg.Ready = func(_ context.Context, r *engine.Reconciler) { readyc <- r }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Serve(ctx, nc, cfg) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	var r *engine.Reconciler
	select {
	case r = <-readyc:
	case err := <-done:
		done <- err
		t.Fatalf("Serve returned before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Serve not ready within 20 s")
	}
	eventually(t, "the reconciler to hold what it folds", func() bool { return ready(r) })
	at := ps.Deny(t, "reconciler", "$KV.MESH_LEASES.>")
	select {
	case err := <-done:
		took := time.Since(at)
		done <- err // for the cleanup
		t.Logf("the reload at %s; a denied renewal said %s after it; Serve returned %s after it: %v",
			at.Format("15:04:05.000"), logs.deniedAfter(at), took.Round(time.Millisecond), err)
		return logs, err
	case <-time.After(40 * time.Second):
		t.Fatalf("Serve still runs 40 s after its user lost the lease bucket; its log:\n%s", logs.messages())
	}
	return logs, nil
}

// An ungrouped reconciler whose user loses its lease bucket (the
// permission to write $KV.MESH_LEASES.> taken away, the server's config
// reloaded) stops at its next renewal with the denial named: the renewal
// was not under the denial watch, so it timed out, was logged as "NATS
// unreachable", and was asked again for ever while the key expired under
// a reconciler that folded on, unfenced.
func TestServeStopsWhenItsStreamLeaseRenewalIsDenied(t *testing.T) {
	t.Parallel()
	logs, err := serveDenied(t, engine.Config{}, func(*engine.Reconciler) bool { return true })
	var de *store.DeniedError
	if !errors.Is(err, engine.ErrStreamLeaseLost) || !errors.As(err, &de) || de.Subject != "$KV.MESH_LEASES.stream" ||
		!errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("Serve: %v; want ErrStreamLeaseLost wrapping the denial of $KV.MESH_LEASES.stream", err)
	}
	if logs.said("NATS unreachable") {
		t.Errorf("the denial was logged as an outage:\n%s", logs.messages())
	}
	if !logs.said("stream lease not renewed: the server denies these credentials its key") {
		t.Errorf("no line says the renewal was denied:\n%s", logs.messages())
	}
}

// A group member whose user loses the lease bucket leaves the group at
// once with the denial named (its member key's renewal denied), its
// partitions handed over: before, each partition was revoked only at its
// deadline (13.5 s), and the member then ran on for ever, holding
// nothing, while its creates were denied.
func TestServeGroupMemberLeavesWhenItsLeaseRenewalsAreDenied(t *testing.T) {
	t.Parallel()
	logs, err := serveDenied(t, engine.Config{Group: "g", Instance: "a", Stream: store.StreamConfig{Partitions: 4}},
		func(r *engine.Reconciler) bool { return len(r.Owned()) == 4 })
	var de *store.DeniedError
	if !errors.As(err, &de) || !strings.HasPrefix(de.Subject, "$KV.MESH_LEASES.") || !errors.Is(err, store.ErrPermissionDenied) {
		t.Fatalf("Serve: %v; want the denial of a key of MESH_LEASES", err)
	}
	if !logs.said("not renewed: the server denies these credentials") {
		t.Errorf("no line says a renewal was denied:\n%s", logs.messages())
	}
}

// A member whose user may still renew its member key but no longer its
// partitions' leases steps down from each partition at its next renewal,
// the denial as the cause, and stays in the group: before, each renewal
// was retried until the lease's local deadline (13.5 s at the default
// TTL) and revoked then as "not renewed within its TTL", the denial
// unsaid.
func TestGroupPartitionRenewalDeniedStepsDown(t *testing.T) {
	t.Parallel()
	ps, _, js := startPermServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecords()
	g, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "g", Instance: "a", Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	gctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(gctx) }()
	var grants []engine.Grant
	defer func() {
		for _, gr := range grants {
			gr.Stopped()
		}
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for len(grants) < cfg.Partitions {
		select {
		case gr := <-g.Grants():
			grants = append(grants, gr)
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d partitions granted in 20 s", len(grants), cfg.Partitions)
		}
	}
	at := ps.Deny(t, "reconciler", "$KV.MESH_LEASES.lease.>")
	for _, gr := range grants {
		select {
		case <-gr.Revoked.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("partition %d still granted 30 s after its lease was denied", gr.Partition)
		}
		cause := context.Cause(gr.Revoked)
		t.Logf("partition %d revoked %s after the reload: %v", gr.Partition, time.Since(at).Round(time.Millisecond), cause)
		var de *store.DeniedError
		if !errors.Is(cause, engine.ErrLeaseLost) || !errors.As(cause, &de) || de.Subject != fmt.Sprintf("$KV.MESH_LEASES.lease.%d", gr.Partition) {
			t.Errorf("partition %d revoked with %v; want ErrLeaseLost wrapping the denial of its key", gr.Partition, cause)
		}
	}
	select {
	case err := <-done:
		done <- err
		t.Fatalf("Run returned %v: the member, whose member key is still its own, left the group", err)
	default:
	}
}

// said reports whether a record's message contains s.
func (h logRecords) said(s string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range *h.recs {
		if strings.Contains(r.Message, s) {
			return true
		}
	}
	return false
}

// messages returns the records, one a line: level, message, attributes.
func (h logRecords) messages() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, r := range *h.recs {
		b.WriteString(r.Time.Format("15:04:05.000") + " " + r.Level.String() + " " + r.Message)
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}
