package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestStopAfterLeasesLostToServerRestarts: a grouped member loses every
// lease while servers of its cluster are away longer than the lease TTL
// (as the third server's lame-duck restart cost both reconcilers of
// fresh11 M5), owns its partitions again once they are back, and is then
// stopped gracefully: it writes every final snapshot and releases every
// lease, and says so (Unsaved empty). Before, Unsaved still named the
// partitions lost during the outage, with "partition lease lost".
func TestStopAfterLeasesLostToServerRestarts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills two servers of three: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.ConnectVia(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	via0 := func(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
		return pc.ConnectVia(t, 0, opts...)
	}
	m := startMember(t, via0, cfg, "a", 3*time.Second, engine.Faults{})
	owns := func(n int) func() bool {
		return func() bool { return len(m.r.Owned()) == n && len(m.g.Owned()) == n }
	}
	waitfor.Until(t, time.Minute, "a to own every partition", owns(4))

	// Quorum gone for longer than the TTL: every lease is lost.
	pc.Kill(1)
	pc.Kill(2)
	waitfor.Until(t, time.Minute, "a to lose every lease", owns(0))
	pc.Restart(1)
	pc.Restart(2)
	waitfor.Until(t, 2*time.Minute, "a to own every partition again", owns(4))

	m.stop(t)
	if u := m.r.Unsaved(); len(u) != 0 {
		t.Fatalf("the stop held every partition and Unsaved is %v", u)
	}
	if !m.g.Released() {
		t.Fatal("a stop on a healthy cluster left leases to expire")
	}
}
