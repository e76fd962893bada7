package enginetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// foldCount loads h on a fresh stream (sealed with the stream's effect key
// and a new signer when seal), runs a signing reconciler until every
// partition's checkpoint covers its last input and returns how many
// messages it added to the stream.
func foldCount(t *testing.T, h *enginetest.History, seal bool) uint64 {
	// No timeout of its own: under load the fold can take longer than any
	// fixed minute, and a reconciler stopped by one left WaitCheckpoints
	// polling a checkpoint that could no longer move. The wait fails before
	// the test binary's deadline instead, and a Run that ends early says why.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := store.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	if seal {
		key, err := store.EffectKey(ctx, js, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		h = h.Seal(key, signer)
	}
	last := h.Load(t, js)
	if last != uint64(len(h.Msgs)) {
		t.Fatalf("loaded up to #%d, want #%d", last, len(h.Msgs))
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := engine.NewReconciler(ctx, js, engine.ReconcilerConfig{Stream: cfg, Signer: signer, SnapshotInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		err := r.Run(rctx)
		if rctx.Err() == nil {
			t.Errorf("the reconciler stopped before its checkpoints: %v", err)
		}
		done <- err
	}()
	enginetest.WaitCheckpoints(t, snaps, enginetest.InputTargets(t, js, cfg), time.Now())
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq - last
}

// TestSealedHistoryIsStored: a reconciler with the history's key and
// signer recognises every simulated effect as stored and publishes
// nothing; the same history unsealed has effects it publishes again.
func TestSealedHistoryIsStored(t *testing.T) {
	h := enginetest.Simulate(5_000, 100)
	if got := foldCount(t, h, true); got != 0 {
		t.Errorf("sealed history: %d effects published again, want 0", got)
	}
	if got := foldCount(t, h, false); got == 0 {
		t.Errorf("unsealed history: nothing published again; the test cannot tell a sealed one apart")
	}
}

// TestSimulateDownLeavesPlansUnsettled: every want after the first of a
// down node gives a plan, and none of them is settled.
func TestSimulateDownLeavesPlansUnsettled(t *testing.T) {
	h := enginetest.SimulateDown(3, 5)
	plans, settles := 0, 0
	for _, m := range h.Msgs {
		switch _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind {
		case events.KindPlan:
			plans++
		case events.KindSettle:
			settles++
		}
	}
	if plans != 3*6 || settles != 3 {
		t.Errorf("%d plans and %d settles, want %d and %d", plans, settles, 3*6, 3)
	}
}

// TestSimulateInputs: the inputs-only history is the wants and haves of
// the whole history, in order, message for message.
func TestSimulateInputs(t *testing.T) {
	in := enginetest.SimulateInputs(2_000, 30)
	all := enginetest.Simulate(8_000, 30).Inputs()
	if len(in.Msgs) < 2_000 || len(in.Msgs) > len(all.Msgs) {
		t.Fatalf("%d inputs, want about 2,000 (of %d)", len(in.Msgs), len(all.Msgs))
	}
	for i, m := range in.Msgs {
		if m.Subject != all.Msgs[i].Subject || string(m.Data) != string(all.Msgs[i].Data) {
			t.Fatalf("input %d: %s %s, the whole history's is %s %s", i, m.Subject, m.Data, all.Msgs[i].Subject, all.Msgs[i].Data)
		}
	}
}

// TestSimulateDense: the effect-dense mix is a want every ten inputs of a
// node, its effects plans and journal entries, about a quarter of the
// events; its inputs-only history is the whole one's wants and haves;
// sealed, a reconciler finds every effect stored (its plans its own).
func TestSimulateDense(t *testing.T) {
	h := enginetest.SimulateDense(5_000, 100)
	count := map[events.Kind]int{}
	for _, m := range h.Msgs {
		_, kind, _ := (events.Subjects{}).Parse(m.Subject)
		count[kind]++
	}
	inputs := count[events.KindWant] + count[events.KindHave]
	effects := count[events.KindPlan] + count[events.KindJournal]
	if inputs+effects != len(h.Msgs) || count[events.KindWant]*10 != inputs {
		t.Fatalf("kinds %v: want wants and haves, one want in ten, plans and journal entries", count)
	}
	if count[events.KindPlan] != count[events.KindWant] || effects*5 < len(h.Msgs) || effects*3 > len(h.Msgs) {
		t.Errorf("kinds %v: want a plan a want and effects a fifth to a third of the events", count)
	}
	in := enginetest.SimulateDenseInputs(len(h.Inputs().Msgs), 100)
	for i, m := range h.Inputs().Msgs {
		if m.Subject != in.Msgs[i].Subject || string(m.Data) != string(in.Msgs[i].Data) {
			t.Fatalf("input %d differs from the whole history's", i)
		}
	}
	if got := foldCount(t, h, true); got != 0 {
		t.Errorf("sealed dense history: %d effects published again, want 0", got)
	}
}
