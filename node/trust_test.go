package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// The agent's trust rule (verifyPlan): it applies a plan signed by a
// trusted key whose cause is below its own stream sequence and newer than
// the settled plan's. Every other plan is refused with a failed settle
// naming it, and is never applied; a plan after it is judged as usual.
// A trusted key's plan with an inflated cause (issue 24's wedge: applied,
// it made every later plan look replayed) is refused, so the node goes
// on to the genuine plans after it.
func TestPlanTrustRule(t *testing.T) {
	e := newEnv(t)
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := store.NewSigner(kp)
	trust, _ := store.NewTrust(signer.PublicKey())
	a := e.startAgent(t, "ace", nil, func(c *Config) { c.Trust = trust })
	// Inputs before the plans, so that causes can be below their plans.
	var causes []uint64
	for range 3 {
		ack, err := e.pub.Append(ctxT(t), "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		causes = append(causes, ack.Seq)
	}
	n := 0
	plan := func(cause uint64, build string, signed bool) uint64 {
		t.Helper()
		n++
		p := events.Stamp(&events.Plan{Cause: cause, Want: causes[0], ProvisionerAccount: "prov",
			Modules: []events.PlanModule{{Name: mbg, Build: build, RunsAs: "mbg", Files: []events.File{}}}}, time.Now())
		opts := []store.AppendOpt{store.WithMsgID(fmt.Sprintf("ace.plan.%d.%d", cause, n))}
		if signed {
			opts = append(opts, store.WithSigner(signer))
		}
		ack, err := e.pub.Append(ctxT(t), "ace", p, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	refused := func(seq uint64, why string) {
		t.Helper()
		m := e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
		s := m.Event.Payload.(*events.Settle)
		if s.Op != events.OpFailed || !strings.Contains(s.Error, "plan refused: not from a trusted reconciler") || !strings.Contains(s.Error, why) {
			t.Errorf("settle of plan %d = %+v, want failed saying %q", seq, s, why)
		}
	}

	p1 := plan(causes[1], "g:1", true)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))

	ahead := plan(100000, "evil:1", true)
	refused(ahead, "its cause 100000 is not below its own sequence")
	replayed := plan(causes[0], "old:1", true)
	refused(replayed, "replayed")
	unsigned := plan(causes[2]+10, "evil:2", false)
	refused(unsigned, store.ErrUnsigned.Error())
	if got := a.Settled(); got != p1 {
		t.Fatalf("settled %d after the refused plans, want %d", got, p1)
	}

	p2 := plan(causes[2], "g:2", true)
	if s := e.waitEvent(t, "ace", events.KindSettle, settleOf(p2)).Event.Payload.(*events.Settle); s.Op == events.OpFailed {
		t.Fatalf("the genuine plan after the refused ones failed: %+v", s)
	}
	if got := a.Settled(); got != p2 {
		t.Errorf("settled %d, want %d", got, p2)
	}
	if logs := a.logs.String(); strings.Contains(logs, "evil") || strings.Contains(logs, "old:1") {
		t.Errorf("a refused plan was applied:\n%s", logs)
	}
}
