package engine_test

import (
	"testing"

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
