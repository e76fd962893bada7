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

// A rotation's overlap (issue 24): the agent trusts the current key and
// the retired one. It applies the retired key's plans until it has
// applied one of the current key; from then on a retired key's plan is
// never newer, whatever its cause. Once the overlap has ended the retired
// key is refused outright, even before any current plan.
func TestRetiredKeyNeverNewer(t *testing.T) {
	e := newEnv(t)
	newSigner := func() *store.Signer {
		kp, err := store.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		s, _ := store.NewSigner(kp)
		return s
	}
	cur, old, gone := newSigner(), newSigner(), newSigner()
	trust, _ := store.NewTrust(cur.PublicKey())
	if _, err := trust.Retire(old.PublicKey(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.Retire(gone.PublicKey(), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	a := e.startAgent(t, "vic", nil, func(c *Config) { c.Trust = trust })
	var causes []uint64
	for range 4 {
		ack, err := e.pub.Append(ctxT(t), "vic", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		causes = append(causes, ack.Seq)
	}
	n := 0
	plan := func(s *store.Signer, cause uint64, build string) uint64 {
		t.Helper()
		n++
		p := events.Stamp(&events.Plan{Cause: cause, Want: causes[0], ProvisionerAccount: "prov",
			Modules: []events.PlanModule{{Name: mbg, Build: build, RunsAs: "mbg", Files: []events.File{}}}}, time.Now())
		ack, err := e.pub.Append(ctxT(t), "vic", p, store.WithMsgID(fmt.Sprintf("vic.plan.%d.%d", cause, n)), store.WithSigner(s))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	settle := func(seq uint64) *events.Settle {
		t.Helper()
		return e.waitEvent(t, "vic", events.KindSettle, settleOf(seq)).Event.Payload.(*events.Settle)
	}

	expired := plan(gone, causes[0], "gone:1")
	if s := settle(expired); s.Op != events.OpFailed || !strings.Contains(s.Error, store.ErrRetired.Error()) {
		t.Errorf("plan of a key whose overlap ended: settle %+v, want failed saying %q", s, store.ErrRetired)
	}
	p1 := plan(old, causes[0], "old:1")
	if s := settle(p1); s.Op == events.OpFailed {
		t.Fatalf("the retired key's plan during the overlap, before any current one: %+v", s)
	}
	p2 := plan(cur, causes[1], "cur:1")
	if s := settle(p2); s.Op == events.OpFailed {
		t.Fatalf("the current key's plan: %+v", s)
	}
	// The wedge of the issue with the retired key: a higher cause, still
	// below its own sequence, published after the current key's plan.
	late := plan(old, causes[3], "evil:1")
	if s := settle(late); s.Op != events.OpFailed || !strings.Contains(s.Error, "a retired key's plan is never newer") {
		t.Errorf("the retired key's plan after a current one: settle %+v, want refused", s)
	}
	p3 := plan(cur, causes[2], "cur:2")
	if s := settle(p3); s.Op == events.OpFailed {
		t.Fatalf("the current key's next plan after the refused one: %+v", s)
	}
	if got := a.Settled(); got != p3 {
		t.Errorf("settled %d, want %d", got, p3)
	}
	if logs := a.logs.String(); strings.Contains(logs, "evil") || strings.Contains(logs, "gone:1") {
		t.Errorf("a refused plan was applied:\n%s", logs)
	}
}

// A refusal for a plan's signer names the file the agent read its keys
// from, once, at its start, and that a restart reads it again (a fresh
// user's finding U12: after serve's key changed, an agent started with
// --trust-from kept the old key and nothing said a restart would do).
// Other refusals say nothing of it.
func TestUntrustedRefusalNamesTrustFile(t *testing.T) {
	e := newEnv(t)
	key := func() *store.Signer {
		kp, err := store.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		s, _ := store.NewSigner(kp)
		return s
	}
	trusted, other := key(), key()
	trust, _ := store.NewTrust(trusted.PublicKey())
	const from = "/srv/mesh/data/reconcilers.pub"
	e.startAgent(t, "ace", nil, func(c *Config) { c.Trust, c.TrustFrom = trust, from })
	ack, err := e.pub.Append(ctxT(t), "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	plan := func(n int, s *store.Signer) uint64 {
		t.Helper()
		p := events.Stamp(&events.Plan{Cause: ack.Seq, Want: ack.Seq, Modules: []events.PlanModule{}}, time.Now())
		opts := []store.AppendOpt{store.WithMsgID(fmt.Sprintf("ace.plan.%d.%d", ack.Seq, n))}
		if s != nil {
			opts = append(opts, store.WithSigner(s))
		}
		m, err := e.pub.Append(ctxT(t), "ace", p, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return m.Seq
	}
	const says = "this agent read its keys from " + from + " when it started, and only then: restart it to read them again"
	seq := plan(1, other)
	s := e.waitEvent(t, "ace", events.KindSettle, settleOf(seq)).Event.Payload.(*events.Settle)
	if s.Op != events.OpFailed || !s.Untrusted || !strings.Contains(s.Error, other.PublicKey()) || !strings.Contains(s.Error, says) {
		t.Errorf("settle of a plan of an untrusted key = %+v, want failed, untrusted, naming the key and saying %q", s, says)
	}
	seq = plan(2, nil)
	s = e.waitEvent(t, "ace", events.KindSettle, settleOf(seq)).Event.Payload.(*events.Settle)
	if s.Op != events.OpFailed || s.Untrusted || strings.Contains(s.Error, from) {
		t.Errorf("settle of an unsigned plan = %+v, want failed, not untrusted, naming no trust file", s)
	}
}
