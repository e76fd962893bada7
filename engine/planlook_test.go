package engine

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// planLook, which a provisioner's up carries (events.Prov): no plan of the
// node in the stream is no_plan; a newest plan signed by another key than
// the reconciler's current one (a rotation's retired key) is old_key; one
// of the current key is neither; looked_before is past the stream's last
// sequence at the look.
func TestPlanLook(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	signer := func() *store.Signer {
		kp, err := store.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.NewSigner(kp)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	old, cur := signer(), signer()
	pub := store.NewPublisher(js, cfg.Subjects())
	w := &agentWatch{stream: stream, subj: cfg.Subjects(), pub: pub, signer: cur.PublicKey(), log: slog.New(slog.DiscardHandler)}
	plan := func(s *store.Signer, cause uint64) uint64 {
		p := events.Stamp(&events.Plan{Cause: cause, Want: 1, Modules: []events.PlanModule{{Name: "app", Build: "a:1", Files: []events.File{}}}}, time.Now())
		ack, err := pub.Append(ctx, "ace", p, store.WithSigner(s), store.WithMsgID(fmt.Sprintf("ace.plan.%d.0", cause)))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}

	if noPlan, oldKey, looked := w.planLook(ctx, "ace"); !noPlan || oldKey || looked != 1 {
		t.Errorf("no plan in an empty stream: no_plan %v old_key %v looked %d, want true false 1", noPlan, oldKey, looked)
	}
	seq := plan(old, 1)
	if noPlan, oldKey, looked := w.planLook(ctx, "ace"); noPlan || !oldKey || looked != seq+1 {
		t.Errorf("a plan of the retired key: no_plan %v old_key %v looked %d, want false true %d", noPlan, oldKey, looked, seq+1)
	}
	plan(cur, 2)
	if noPlan, oldKey, _ := w.planLook(ctx, "ace"); noPlan || oldKey {
		t.Errorf("a plan of the current key: no_plan %v old_key %v, want neither", noPlan, oldKey)
	}
}
