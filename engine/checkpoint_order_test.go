package engine_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// A live checkpoint's states are put while the fold goes on, and its
// sequence is stored only once every one of them is: read in the order
// the snapshot bucket stored them, every checkpoint sequence comes after
// the states that cover each node's events up to it. Several nodes of
// one partition change all the time, checkpoints every two events, so
// writes overlap the fold and each other's due points. A sequence stored
// before (or without waiting for) its states shows here as a checkpoint
// that the states stored before it do not cover.
func TestCheckpointSequenceAfterItsStates(t *testing.T) {
	g := newRig(t, store.StreamConfig{})
	var nodes []string
	for i := 0; len(nodes) < 12; i++ {
		n := fmt.Sprintf("n%d", i)
		if len(nodes) == 0 || events.Partition(n, g.cfg.Partitions) == events.Partition(nodes[0], g.cfg.Partitions) {
			nodes = append(nodes, n)
		}
	}
	p := events.Partition(nodes[0], g.cfg.Partitions)
	snaps, err := store.OpenSnapshots(context.Background(), g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := g.js.KeyValue(context.Background(), snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	// Every update of the partition's keys, in the bucket's order.
	type update struct {
		key string
		seq uint64 // the state's, or the checkpoint's
	}
	var (
		mu      sync.Mutex
		updates []update
	)
	w, err := kv.WatchFiltered(context.Background(), []string{"node." + strconv.Itoa(p) + ".>", "checkpoint." + strconv.Itoa(p)},
		jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			u := update{key: e.Key()}
			var err error
			if strings.HasPrefix(e.Key(), "checkpoint.") {
				u.seq, err = strconv.ParseUint(string(e.Value()), 10, 64)
			} else {
				var st *reconcile.State
				if st, err = reconcile.UnmarshalState(e.Value()); err == nil {
					u.seq = st.Seq
				}
			}
			if err != nil {
				t.Errorf("%s: %v", e.Key(), err)
				return
			}
			mu.Lock()
			updates = append(updates, u)
			mu.Unlock()
		}
	}()

	rn := g.startCfg(engine.ReconcilerConfig{SnapshotEvery: 2, SnapshotInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	appended := map[string][]uint64{}
	// The session live (past the recovery of what it found at its
	// start) before the events that count.
	first := g.append(nodes[0], provOnly())
	appended[nodes[0]] = []uint64{first}
	eventually(t, "the first event folded", func() bool {
		st, ok := rn.r.Node(nodes[0])
		return ok && st.Seq >= first
	})
	var last uint64
	for i := range 240 {
		n := nodes[i%len(nodes)]
		last = g.append(n, provOnly())
		appended[n] = append(appended[n], last)
	}
	eventually(t, "the last event folded", func() bool {
		st, ok := rn.r.Node(nodes[(240-1)%len(nodes)])
		return ok && st.Seq >= last
	})
	rn.stop(t)
	// The graceful stop's checkpoint covers every event: wait for its
	// sequence to be watched.
	eventually(t, "the final checkpoint watched", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := len(updates) - 1; i >= 0; i-- {
			if strings.HasPrefix(updates[i].key, "checkpoint.") {
				return updates[i].seq >= last
			}
		}
		return false
	})
	w.Stop()
	<-watched

	mu.Lock()
	defer mu.Unlock()
	stored := map[string]uint64{} // each node's state as stored so far
	checkpoints := 0
	for _, u := range updates {
		node, isNode := strings.CutPrefix(u.key, "node."+strconv.Itoa(p)+".")
		if isNode {
			stored[node] = u.seq
			continue
		}
		checkpoints++
		for _, n := range nodes {
			var covered uint64 // n's last event the checkpoint claims
			for _, s := range appended[n] {
				if s <= u.seq {
					covered = s
				}
			}
			if stored[n] < covered {
				t.Errorf("checkpoint %d stored while %s's stored state covered #%d of its event #%d", u.seq, n, stored[n], covered)
			}
		}
	}
	if checkpoints < 10 {
		t.Errorf("%d checkpoints watched: the test did not exercise them", checkpoints)
	}
	t.Logf("%d updates, %d checkpoints", len(updates), checkpoints)
}
