package e2e

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
)

// brokenRuntime fails to read what runs while broken: every apply then
// fails before it changes anything, and the agent keeps judging by the
// plan it settled before.
type brokenRuntime struct {
	node.Runtime
	broken atomic.Bool
}

var errBroken = errors.New("runtime broken (test)")

func (b *brokenRuntime) Running(ctx context.Context) ([]events.HaveModule, error) {
	if b.broken.Load() {
		return nil, errBroken
	}
	return b.Runtime.Running(ctx)
}

// The sequence of issue 14, item 3: a refused write whose repeat is
// dropped as a duplicate must still be written once a plan that declares
// the file settles.
//
//  1. The node settles P1 (no credential declared); then its applies keep
//     failing.
//  2. P2 declares the credential; its apply fails. The provisioner's fill
//     is judged by P1: refused undeclared, stored.
//  3. P3 removes mesh-build-go (paying the item), P4 adds it back; both
//     applies fail.
//  4. The provisioner restarts: its fill, judged by P1 again, makes the
//     same refusal with the same id, dropped as a duplicate.
//  5. The node recovers and settles P4. Nothing is owed, so no knock; the
//     provisioner's last pass read P4 and every write of it was refused.
//
// The credential must be written at P4's settle, not at the 10-minute
// resync.
func TestRefusedWriteIsNeverLost(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	n.source(mbg, creds, secret)
	rt := &brokenRuntime{Runtime: n.dirRuntime()}
	n.startAgent(rt)

	w1 := must(m.want(ctx, "ace", provisionerMod))(t)
	p1, _ := must2(m.planOf(ctx, "ace", w1))(t)
	must(m.settled(ctx, "ace", p1))(t)

	rt.broken.Store(true)
	failed := func(plan uint64) {
		t.Helper()
		must(m.waitEvent(ctx, "ace", events.KindSettle, func(ev events.Event) bool {
			s := ev.Payload.(*events.Settle)
			return s.Plan == plan && s.Op == events.OpFailed
		}))(t)
	}
	w2 := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
	p2, _ := must2(m.planOf(ctx, "ace", w2))(t)
	failed(p2)

	n.startProvisioner("prov")
	pass := n.nextFill(t, ctx)
	if pass.r.Plan != p2 || len(pass.r.Refused) != 1 || pass.r.Refused[0].Reason != events.ReasonUndeclared {
		t.Fatalf("fill on start: %+v, want the credential refused as undeclared while P2 is newest", pass.r)
	}
	must(m.waitEvent(ctx, "ace", events.KindRefusal, func(ev events.Event) bool {
		r := ev.Payload.(*events.Refusal)
		return r.Path == creds && r.Plan == p1
	}))(t)

	w3 := must(m.want(ctx, "ace", provisionerMod))(t)
	p3, _ := must2(m.planOf(ctx, "ace", w3))(t)
	failed(p3)
	if owed := must(m.quiesce(ctx, "ace"))(t); owed != 0 {
		t.Fatalf("%d items owed after the removal, want 0 (the removal pays them)", owed)
	}
	w4 := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
	p4, _ := must2(m.planOf(ctx, "ace", w4))(t)
	failed(p4)

	n.provisioner.stop(t)
	n.startProvisioner("prov")
	pass = n.nextFill(t, ctx)
	if pass.r.Plan != p4 || len(pass.r.Refused) != 1 {
		t.Fatalf("fill on restart: %+v, want the credential refused while P4 is newest", pass.r)
	}
	refusals := must(m.events(ctx, "ace", events.KindRefusal))(t)
	if len(refusals) != 1 {
		t.Fatalf("%d refusals stored, want 1 (the repeat is dropped as a duplicate): %s", len(refusals), dump(refusals))
	}

	// The node recovers: a new agent applies the newest plan on start.
	n.agent.stop(t)
	rt.broken.Store(false)
	n.startAgent(rt)
	must(m.settled(ctx, "ace", p4))(t)
	must(m.filled(ctx, "ace", creds, p4))(t)
	content, mode, err := n.file(creds)
	if err != nil || content != secret || mode != 0o600 {
		t.Fatalf("credential: %q mode %v, %v; want the content with mode 0600", content, mode, err)
	}
	if knocks := must(m.events(ctx, "ace", events.KindKnock))(t); len(knocks) != 0 {
		t.Errorf("%d knocks, want none (nothing was owed): %s", len(knocks), dump(knocks))
	}
	m.assertNoLeak()
}
