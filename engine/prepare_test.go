package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestPrepareAheadRunsAtMostItsWindowAhead: a recovery's prepare-ahead
// goroutine, whose sends wait on acknowledgements (here: the test takes
// the effects one at a time, in the sends' order), never holds more
// than recoveryWindow effects prepared and not taken (it held every
// effect of the recovery: all 3,000 here, a plan or more for each node
// of a 100,000-node first refold), keeps that many ready as the takes
// go, and prepares each effect once, by itself or by the take.
func TestPrepareAheadRunsAtMostItsWindowAhead(t *testing.T) {
	t.Parallel()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	key := make([]byte, 32)
	r := &Reconciler{subj: cfg.Subjects(), key: key, pub: store.NewPublisher(js, cfg.Subjects())}
	const window = recoveryWindow
	// One node's chain of plans, longer than the window, and two
	// subjects of a few.
	queues := map[effectKey][]toPublish{}
	var order []effectKey
	add := func(node string, kind events.Kind, n int) {
		k := effectKey{node, kind}
		order = append(order, k)
		for i := range n {
			var p events.Payload = events.Stamp(&events.Plan{Cause: uint64(i + 1), Want: 1, Modules: []events.PlanModule{}}, time.Now())
			if kind == events.KindKnock {
				p = events.Stamp(&events.Knock{Cause: uint64(i + 1)}, time.Now())
			}
			e := reconcile.Effect{Node: node, Kind: kind, Cause: uint64(i + 1), Payload: p}
			queues[k] = append(queues[k], toPublish{e: e, id: e.ID()})
		}
	}
	add("ace", events.KindPlan, 3*window-10)
	add("bob", events.KindPlan, 5)
	add("ace", events.KindKnock, 5)
	total := 0
	for _, q := range queues {
		total += len(q)
	}
	// The test's own context, not a minute's: at load 34 with the race
	// detector the 3,000 takes outlasted a minute, the preparer stopped
	// with its context one short of the window, and the next wait failed
	// ("last saw 1023"), on main as on any branch. Each wait below is
	// bounded by its own deadline.
	ctx := t.Context()
	p := prepareAhead(ctx, r, order, queues)
	defer p.stop()
	taken := map[*preparedEffect]bool{}
	// ahead counts the effects prepared and not taken.
	ahead := func() int {
		n := 0
		for _, ps := range p.of {
			for _, pe := range ps {
				if pe.state.Load() == 2 && !taken[pe] {
					n++
				}
			}
		}
		return n
	}
	// The sends' order: every subject's first, then every subject's
	// second, … (prepareAhead's own).
	type next struct {
		e  reconcile.Effect
		pe *preparedEffect
	}
	var sends []next
	for i := 0; len(sends) < total; i++ {
		for _, k := range order {
			if i < len(queues[k]) {
				sends = append(sends, next{queues[k][i].e, p.of[k][i]})
			}
		}
	}
	ids := map[string]bool{}
	for i, s := range sends {
		want := min(window, total-i)
		got := waitfor.Value(t, 30*time.Second, fmt.Sprintf("%d effects prepared ahead before take %d", want, i), func() (int, bool) {
			n := ahead()
			return n, n >= want
		})
		if got > window {
			t.Fatalf("before take %d of %d: %d effects prepared and not taken; at most %d", i, total, got, window)
		}
		pe := p.take(ctx, r, s.e, s.pe)
		taken[pe] = true
		if pe.err != nil || pe.msg == nil || ids[pe.id] || pe.id != store.EffectMsgID(key, s.e.ID()) {
			t.Fatalf("take %d: id %s (seen: %v), %v", i, pe.id, ids[pe.id], pe.err)
		}
		ids[pe.id] = true
	}
	waitfor.Until(t, 30*time.Second, "prepareAhead's goroutine ends once every effect is taken", func() bool {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	})
	if len(ids) != total {
		t.Fatalf("%d effects taken; %d queued", len(ids), total)
	}
}
