package engine_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// TestRestartAsksNoPartitionLast: a restart whose tail ends in a partition
// before the stream's last message asks the stream's leader whether
// anything of the partition is left past the tail with a get of the
// partition's next message past it (next_by_subj), never of the
// partition's last (last_by_subj on the partition's wildcard), which the
// server answers by matching every subject of the partition: a cost that
// grows with the nodes, not the tail (issue 27, the restart's ratio: 15
// such walks a restart at 16 partitions). Farther than leftScanMax
// messages behind the stream's end it asks for the last, as before (the
// next's look would read every block written since). Either way the
// states and effects are the pure fold's.
func TestRestartAsksNoPartitionLast(t *testing.T) {
	t.Parallel()
	t.Run("near", func(t *testing.T) {
		last, next := restartGets(t, func(*engine.ReconcilerConfig) {})
		for _, f := range last {
			if slices.Contains(partitionFilters(2), f) {
				t.Errorf("the restart asked for a partition's last message (%s): the server matches every subject of the partition for it", f)
			}
		}
		if !slices.Contains(next, partitionFilters(2)[1]) {
			t.Errorf("the restart did not ask whether partition 1 holds a message past its tail (gets of a next message: %v)", next)
		}
	})
	t.Run("far", func(t *testing.T) {
		last, next := restartGets(t, func(cfg *engine.ReconcilerConfig) { engine.SetLeftScanMax(cfg, 0) })
		if !slices.Contains(last, partitionFilters(2)[1]) {
			t.Errorf("the restart did not ask for partition 1's last message (gets of a last message: %v)", last)
		}
		for _, f := range next {
			if slices.Contains(partitionFilters(2), f) {
				t.Errorf("the restart asked for a partition's next message (%s) farther than leftScanMax behind the stream's end", f)
			}
		}
	})
}

// partitionFilters is each of n partitions' stored-subject filter, in
// order, on the default prefix.
func partitionFilters(n int) []string {
	subj := store.StreamConfig{Partitions: n}.WithDefaults().Subjects()
	out := make([]string, n)
	for p := range out {
		out[p] = subj.StoredPartitionAll(p)
	}
	return out
}

// restartGets folds nodes of both partitions of a 2-partition stream,
// stops, appends a tail whose partition-1 event comes before the stream's
// last message (partition 0's), restarts, checks the tail's plans and the
// states against the pure fold, and returns the subjects of the
// restart's message gets from the stream's leader: of a last message
// (last_by_subj) and of a next one (next_by_subj). tune changes the
// restarted reconciler's configuration.
func restartGets(t *testing.T, tune func(*engine.ReconcilerConfig)) (last, next []string) {
	var gotLast, gotNext []string
	g := newRig(t, store.StreamConfig{Partitions: 2})
	var names [2][]string
	for i := 0; len(names[0]) < 4 || len(names[1]) < 4; i++ {
		name := fmt.Sprintf("n%02d", i)
		p := events.Partition(name, 2)
		names[p] = append(names[p], name)
	}
	rn := g.start(engine.Faults{})
	for _, ns := range names {
		for _, name := range ns {
			g.planFor(name, g.append(name, want("b1")))
		}
	}
	rn.stop(t)

	a, b := names[1][2], names[0][1]
	tail := map[string]uint64{a: g.append(a, want("b2"))}
	tail[b] = g.append(b, want("b2"))

	var mu sync.Mutex
	nc := g.js.Conn()
	sub, err := nc.Subscribe("$JS.API.STREAM.MSG.GET."+g.cfg.Name, func(m *nats.Msg) {
		var req struct {
			Last string `json:"last_by_subj"`
			Next string `json:"next_by_subj"`
		}
		if json.Unmarshal(m.Data, &req) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if req.Last != "" {
			gotLast = append(gotLast, req.Last)
		}
		if req.Next != "" {
			gotNext = append(gotNext, req.Next)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := engine.ReconcilerConfig{SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t)}
	tune(&cfg)
	rn = g.startCfg(cfg)
	for name, seq := range tail {
		g.planFor(name, seq)
	}
	g.verify(rn.r)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(gotLast), slices.Clone(gotNext)
}
