package engine_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestRefoldOfStoredHistoryPublishesNothing: a stream whose effects were
// all stored by its reconciler (enginetest.History.Seal: the ids keyed
// with the stream's effect key), with no snapshot, as after a crash before
// the first checkpoint. A cold refold recognises every effect and stores
// nothing. It is the premise of the "stored" catch-up benchmarks, whose
// history once carried bare ids: their refold republished plans and
// journaled them as another writer's, and the figure measured that.
func TestRefoldOfStoredHistoryPublishesNothing(t *testing.T) {
	h := enginetest.Simulate(6_000, 60)
	_, _, js, st, cfg := storetest.StartStream(t, store.StreamConfig{})
	last := sealed(t, js, cfg, h).Load(t, js)
	foldAll(t, js, cfg)
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != last {
		t.Fatalf("the refold stored %d messages; want none", info.State.LastSeq-last)
	}
}

// TestColdRefoldPublishesAsItReads: a first refold of a stream of inputs
// only (no effect stored, no snapshot) publishes each effect as it folds
// it, not after the whole read (issue 17), and crashes in the middle of
// that keep DESIGN.md §5.3: after kills at random points of the refold,
// each effect the fold of the stream makes is stored exactly once and
// the states equal that fold.
func TestColdRefoldPublishesAsItReads(t *testing.T) {
	g := newRig(t, store.StreamConfig{})
	h := enginetest.Simulate(24_000, 60).Inputs()
	last := h.Load(t, g.js)
	targets := enginetest.InputTargets(t, g.js, g.cfg)
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	kills := 0
	for kills < 6 {
		var mu sync.Mutex
		countdown := 20 + rng.IntN(600)
		crash := func(int, uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if countdown--; countdown == 0 {
				return errCrash
			}
			return nil
		}
		rn := g.start(engine.Faults{AfterFold: crash})
		if !crashedOrDone(t, rn, targets) {
			break // the refold ended before the kill
		}
		if kills++; kills == 1 {
			info, err := g.stream.Info(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if info.State.LastSeq == last {
				t.Fatal("a refold killed in the middle of its read stored none of the effects it had folded")
			}
		}
	}
	if kills < 2 {
		t.Fatalf("only %d kills: the test did not exercise the refold's restarts", kills)
	}
	rn := g.start(engine.Faults{})
	g.verify(rn.r)
}

// crashedOrDone waits until rn crashes (true) or has folded every
// partition to its target (false: it is then stopped).
func crashedOrDone(t *testing.T, rn *running, targets map[int]uint64) bool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-rn.done:
			rn.done <- err
			if !errors.Is(err, errCrash) {
				t.Fatalf("the reconciler ended with %v, want the crash", err)
			}
			return true
		case <-time.After(5 * time.Millisecond):
		}
		done := true
		for p, want := range targets {
			if rn.r.Progress()[p] < want {
				done = false
			}
		}
		if done {
			rn.stop(t)
			return false
		}
	}
	t.Fatal("the reconciler neither crashed nor caught up")
	return false
}
