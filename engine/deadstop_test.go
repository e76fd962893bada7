package engine_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// deadStopWait bounds a stop against a server that is gone, on a stream
// and a snapshot bucket of one replica: half the election ride-out
// (20 s), which such a stop used to wait out, and an attempt more (30 s
// in all by a user's SIGTERM, 0.1 s with noRideOut).
const deadStopWait = 10 * time.Second

// A reconciler stopped while its standalone nats-server is gone (killed
// with SIGKILL) stops within deadStopWait, its final snapshot unwritten
// (Unsaved names the partition): no election can come for one replica,
// and the final snapshot's write rode one out for 20 s before it gave up.
func TestStopAgainstAKilledServer(t *testing.T) {
	t.Parallel()
	ps := storetest.StartProcServer(t)
	nc, js := ps.Connect(t)
	stream, cfg, err := store.EnsureStream(testCtx(t), js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g := &rig{t: t, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects())}
	// No checkpoint but the final one: ace's state is still unwritten
	// when the server dies.
	rn := g.startCfg(engine.ReconcilerConfig{SnapshotInterval: time.Hour, SnapshotEvery: 1 << 20, Logger: testLogger(t)})
	g.planFor("ace", g.append("ace", want("pg:1")))

	down := nc.StatusChanged(nats.RECONNECTING)
	defer nc.RemoveStatusListener(down)
	ps.Stop() // SIGKILL
	select {
	case <-down:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not notice its server's kill")
	}
	began := time.Now()
	rn.cancel()
	select {
	case err := <-rn.done:
		rn.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-time.After(deadStopWait):
		t.Fatalf("the reconciler did not stop within %v of its request, its server killed", deadStopWait)
	}
	t.Logf("stopped in %v", time.Since(began).Round(time.Millisecond))
	if _, ok := rn.r.Unsaved()[events.Partition("ace", cfg.Partitions)]; !ok {
		t.Fatalf("the server was killed before the final snapshot, and Unsaved is %v", rn.r.Unsaved())
	}
}

// groupDeadStopWait bounds a group member's stop against a server that
// is gone, on a stream and a lease bucket of one replica. Such a stop
// waited out its released leases' deletions (2 s, the bucket's operation
// timeout), its member key's (2 s) and its watch's stop (the client's 5 s):
// 9.2 s by a user's SIGTERM, 0.05 s without them.
const groupDeadStopWait = 5 * time.Second

// A group member stopped while its standalone nats-server is gone
// (killed with SIGKILL) stops within groupDeadStopWait: no other server
// can answer, so it deletes neither its released leases nor its member
// key (they expire after the TTL, and Released says so), and its watch is
// stopped aside.
func TestGroupStopAgainstAKilledServer(t *testing.T) {
	t.Parallel()
	ps := storetest.StartProcServer(t)
	_, js := ps.Connect(t)
	_, cfg, err := store.EnsureStream(testCtx(t), js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m := startMember(t, ps.Connect, cfg, "a", engine.DefaultLeaseTTL, engine.Faults{})
	eventually(t, "a to own every partition", func() bool { return len(m.r.Owned()) == 16 && len(m.g.Owned()) == 16 })
	down := m.nc.StatusChanged(nats.RECONNECTING)
	defer m.nc.RemoveStatusListener(down)
	ps.Stop() // SIGKILL
	select {
	case <-down:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not notice its server's kill")
	}
	began := time.Now()
	m.cancel()
	select {
	case <-m.done:
	case <-time.After(groupDeadStopWait):
		t.Fatalf("the member did not stop within %v of its request, its server killed", groupDeadStopWait)
	}
	t.Logf("stopped in %v", time.Since(began).Round(time.Millisecond))
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.errs) > 0 {
		t.Fatalf("stop: %v", m.errs)
	}
	if m.g.Released() {
		t.Fatal("Released says every lease was deleted, with the server gone")
	}
}
