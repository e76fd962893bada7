package engine

import (
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

func eff(node string, kind events.Kind, cause uint64, n int) reconcile.Effect {
	return reconcile.Effect{Node: node, Kind: kind, Cause: cause, N: n}
}

// read is one effect message a recovering session reads.
type read struct {
	node  string
	kind  events.Kind
	seq   uint64
	id    string
	valid bool
}

// TestRecoveryStored: which deferred effects count as stored after the
// messages read, and the fence of each subject.
func TestRecoveryStored(t *testing.T) {
	t.Parallel()
	plan5 := eff("ace", events.KindPlan, 5, 0)
	plan5b := eff("ace", events.KindPlan, 5, 1)
	plan9 := eff("ace", events.KindPlan, 9, 0)
	knock5 := eff("ace", events.KindKnock, 5, 0)
	journal5 := eff("ace", events.KindJournal, 5, 0)
	bobPlan5 := eff("bob", events.KindPlan, 5, 0)
	cases := []struct {
		name     string
		deferred []reconcile.Effect
		reads    []read
		stored   []bool // per deferred effect
	}{
		{"nothing read: nothing stored",
			[]reconcile.Effect{plan5, knock5}, nil, []bool{false, false}},
		{"its own id stores an effect",
			[]reconcile.Effect{plan5, knock5, journal5},
			[]read{{"ace", events.KindKnock, 20, knock5.ID(), true}},
			[]bool{false, true, false}},
		{"a later plan supersedes earlier plans of the node, not its knocks",
			[]reconcile.Effect{plan5, plan5b, knock5, plan9},
			[]read{{"ace", events.KindPlan, 30, eff("ace", events.KindPlan, 7, 0).ID(), true}},
			[]bool{true, true, false, false}},
		{"a later plan of the same cause supersedes a lower n",
			[]reconcile.Effect{plan5, plan5b},
			[]read{{"ace", events.KindPlan, 30, plan5b.ID(), true}},
			[]bool{true, true}},
		{"another node's plan supersedes nothing of this node",
			[]reconcile.Effect{plan5, bobPlan5},
			[]read{{"bob", events.KindPlan, 30, eff("bob", events.KindPlan, 9, 0).ID(), true}},
			[]bool{false, true}},
		{"a forged (unsigned) id stores nothing",
			[]reconcile.Effect{knock5},
			[]read{{"ace", events.KindKnock, 20, knock5.ID(), false}},
			[]bool{false}},
		{"an id naming another node than its subject stores nothing",
			[]reconcile.Effect{knock5},
			[]read{{"bob", events.KindKnock, 20, knock5.ID(), true}},
			[]bool{false}},
		{"an id that is no effect id stores nothing",
			[]reconcile.Effect{knock5},
			[]read{{"ace", events.KindKnock, 20, "ace.refusal.5.0", true}},
			[]bool{false}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRecovery()
			for _, e := range c.deferred {
				r.deferEffect(e)
			}
			for _, m := range c.reads {
				r.seen(m.node, m.kind, m.seq, m.id, m.valid)
			}
			for i, e := range c.deferred {
				if got := r.stored(e); got != c.stored[i] {
					t.Errorf("%s: stored = %v, want %v", e.ID(), got, c.stored[i])
				}
			}
		})
	}
}

// TestRecoveryFence: a subject's fence is its last message read, valid or
// forged, then the last effect published on it; unknown before either.
func TestRecoveryFence(t *testing.T) {
	t.Parallel()
	knock5, knock6 := eff("ace", events.KindKnock, 5, 0), eff("ace", events.KindKnock, 6, 0)
	plan5 := eff("ace", events.KindPlan, 5, 0)
	r := newRecovery()
	r.deferEffect(knock5)
	r.deferEffect(knock6)
	r.deferEffect(plan5)
	if _, known := r.fence(knock5); known {
		t.Fatal("fence known before any read")
	}
	r.seen("ace", events.KindKnock, 20, "forged", false)
	if seq, known := r.fence(knock5); !known || seq != 20 {
		t.Fatalf("fence after a forged read = %d, %v; want 20, true", seq, known)
	}
	r.published(knock5, 41)
	if seq, _ := r.fence(knock6); seq != 41 {
		t.Fatalf("fence of the next knock = %d, want 41 (the one just published)", seq)
	}
	if _, known := r.fence(plan5); known {
		t.Fatal("the plan subject's fence moved with the knock subject's")
	}
}

// TestRecoveryIndexedLate: a recovery indexes its deferred effects at
// the first effect message read with a valid id (a first refold reads
// none and never does); effects deferred before and after it count alike.
func TestRecoveryIndexedLate(t *testing.T) {
	t.Parallel()
	plan5, plan9, plan12 := eff("ace", events.KindPlan, 5, 0), eff("ace", events.KindPlan, 9, 0), eff("ace", events.KindPlan, 12, 0)
	knock5 := eff("ace", events.KindKnock, 5, 0)
	r := newRecovery()
	if !r.settled() {
		t.Fatal("nothing deferred, yet not settled")
	}
	r.deferEffect(plan5)
	r.deferEffect(knock5)
	r.seen("ace", events.KindKnock, 20, "forged", false)
	if r.stored(plan5) || r.stored(knock5) || r.settled() {
		t.Fatal("a forged read stored something")
	}
	if _, ok := r.unstoredPlan("ace", plan5.ID()); !ok {
		t.Fatal("plan 5 deferred and unstored, yet not found")
	}
	r.deferEffect(plan9)
	r.seen("ace", events.KindKnock, 21, knock5.ID(), true)
	r.deferEffect(plan12)
	r.seen("ace", events.KindPlan, 30, plan9.ID(), true)
	for _, c := range []struct {
		e    reconcile.Effect
		want bool
	}{{plan5, true}, {knock5, true}, {plan9, true}, {plan12, false}} {
		if got := r.stored(c.e); got != c.want {
			t.Errorf("%s: stored = %v, want %v", c.e.ID(), got, c.want)
		}
	}
	order, queues := r.unpublished()
	if len(order) != 1 || len(queues[order[0]]) != 1 || queues[order[0]][0].id != plan12.ID() {
		t.Fatalf("unpublished: %v %v, want plan 12 alone", order, queues)
	}
	r.seen("ace", events.KindPlan, 31, plan12.ID(), true)
	if !r.settled() {
		t.Fatal("every deferred effect seen stored, yet not settled")
	}
}

// TestRecoveryCompacts: once every deferred effect is seen stored (or
// superseded), a recovery drops them, payloads and all, and keeps
// counting them as skipped and stored; an effect deferred after that is
// found, published and superseded as before, and the fences stay.
func TestRecoveryCompacts(t *testing.T) {
	t.Parallel()
	plan5, knock5, plan9 := eff("ace", events.KindPlan, 5, 0), eff("ace", events.KindKnock, 5, 0), eff("ace", events.KindPlan, 9, 0)
	bobPlan6, plan12 := eff("bob", events.KindPlan, 6, 0), eff("ace", events.KindPlan, 12, 0)
	r := newRecovery()
	r.deferEffect(plan5)
	r.deferEffect(knock5)
	r.deferEffect(bobPlan6)
	r.seen("ace", events.KindPlan, 20, plan5.ID(), true)
	r.seen("ace", events.KindKnock, 21, knock5.ID(), true)
	if len(r.deferred) != 3 {
		t.Fatalf("bob's plan unstored, yet %d deferred effects kept, want 3", len(r.deferred))
	}
	r.seen("bob", events.KindPlan, 22, bobPlan6.ID(), true)
	if len(r.deferred) != 0 || len(r.plans) != 0 {
		t.Fatalf("every deferred effect seen stored, yet %d kept (%d nodes' plans)", len(r.deferred), len(r.plans))
	}
	if !r.settled() || !r.stored(plan5) || !r.stored(knock5) || !r.stored(bobPlan6) {
		t.Fatal("compacted effects no longer count as stored, or the recovery as settled")
	}
	r.deferEffect(plan9)
	r.deferEffect(plan12)
	if r.settled() {
		t.Fatal("plans 9 and 12 deferred and unstored, yet settled")
	}
	if _, ok := r.unstoredPlan("ace", plan12.ID()); !ok {
		t.Fatal("plan 12 deferred after a compaction, yet not found")
	}
	r.seen("ace", events.KindPlan, 30, plan9.ID(), true)
	order, queues := r.unpublished()
	if len(order) != 1 || len(queues[order[0]]) != 1 || queues[order[0]][0].id != plan12.ID() {
		t.Fatalf("unpublished: %v %v, want plan 12 alone", order, queues)
	}
	if got := r.skipped(1); got != 4 {
		t.Fatalf("skipped %d, want 4 (three compacted, plan 9 stored)", got)
	}
	if seq, known := r.fence(bobPlan6); !known || seq != 22 {
		t.Fatalf("bob's plan fence %d, %v after the compaction; want 22, true", seq, known)
	}
	r.seen("ace", events.KindPlan, 31, eff("ace", events.KindPlan, 13, 0).ID(), true)
	if len(r.deferred) != 0 || !r.settled() {
		t.Fatal("plan 12 superseded by a later plan, yet the recovery is not settled and compacted")
	}
}
