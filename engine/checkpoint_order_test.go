package engine_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

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
	t.Parallel()
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
	// The bucket keeps one revision of each key: a watch that falls
	// behind (a loaded machine) never sees a revision overwritten before
	// it was delivered, and then reports a checkpoint whose states it
	// missed. Keep every revision of this bucket instead, and read them
	// back in the order stored (stream sequence): the observation is the
	// bucket's own, not a watcher's.
	ks, err := g.js.Stream(context.Background(), "KV_"+snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	info, err := ks.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	kcfg := info.Config
	kcfg.MaxMsgsPerSubject = 1 << 20 // a KV binding wants a positive limit
	if _, err := g.js.UpdateStream(context.Background(), kcfg); err != nil {
		t.Fatal(err)
	}

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
	// The graceful stop's checkpoint covers every event.
	if ck, err := snaps.Checkpoint(context.Background(), p); err != nil || ck < last {
		t.Fatalf("checkpoint after the stop: %d, %v; want at least %d", ck, err, last)
	}
	// Every update of the partition's keys, in the order stored.
	type update struct {
		key string
		seq uint64 // the state's, or the checkpoint's
		rev uint64 // the bucket's revision (stream sequence)
	}
	var updates []update
	nodePrefix := "$KV." + snaps.Bucket() + ".node." + strconv.Itoa(p) + "."
	ckSubject := "$KV." + snaps.Bucket() + ".checkpoint." + strconv.Itoa(p)
	si, err := ks.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if si.State.Msgs != si.State.LastSeq {
		t.Fatalf("bucket holds %d messages of %d stored: revisions were dropped", si.State.Msgs, si.State.LastSeq)
	}
	for rev := si.State.FirstSeq; rev <= si.State.LastSeq; rev++ {
		m, err := ks.GetMsg(context.Background(), rev)
		if err != nil {
			t.Fatalf("revision %d: %v", rev, err)
		}
		if m.Header.Get("KV-Operation") != "" {
			continue // a delete or purge
		}
		u := update{key: strings.TrimPrefix(m.Subject, "$KV."+snaps.Bucket()+"."), rev: rev}
		switch {
		case m.Subject == ckSubject:
			u.seq, err = strconv.ParseUint(string(m.Data), 10, 64)
		case strings.HasPrefix(m.Subject, nodePrefix):
			var st *reconcile.State
			if st, err = reconcile.UnmarshalState(m.Data); err == nil {
				u.seq = st.Seq
			}
		default:
			continue
		}
		if err != nil {
			t.Fatalf("revision %d (%s): %v", rev, m.Subject, err)
		}
		updates = append(updates, u)
	}

	stored := map[string]uint64{} // each node's state as stored so far
	checkpoints := 0
	failed := false
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
				failed = true
				t.Errorf("checkpoint %d stored at revision %d while %s's stored state covered #%d of its event #%d", u.seq, u.rev, n, stored[n], covered)
			}
		}
	}
	if checkpoints < 10 {
		t.Errorf("%d checkpoints watched: the test did not exercise them", checkpoints)
	}
	if failed {
		for _, u := range updates {
			t.Logf("revision %d: %s seq %d", u.rev, u.key, u.seq)
		}
	}
	t.Logf("%d updates, %d checkpoints", len(updates), checkpoints)
}
