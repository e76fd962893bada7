package engine

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// readMsg is a message as a partition's tail hands it on.
type readMsg struct {
	jetstream.Msg
	m *nats.Msg
}

func (r readMsg) Subject() string      { return r.m.Subject }
func (r readMsg) Data() []byte         { return r.m.Data }
func (r readMsg) Headers() nats.Header { return r.m.Header }

// planMsg is a plan of node ace as published (subject mesh.ace.plan).
func planMsg(id, sig, data string) *nats.Msg { return planOf("ace", id, sig, data) }

func planOf(node, id, sig, data string) *nats.Msg {
	m := nats.NewMsg(events.Subjects{}.Event(node, events.KindPlan))
	m.Data = []byte(data)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(store.HeaderSigner, "NSIGNER")
	m.Header.Set(store.HeaderSignature, sig)
	return m
}

// stored is m as the stream stores it: under its partition's subject.
func stored(m *nats.Msg) *nats.Msg {
	c := *m
	c.Subject = "3." + m.Subject
	return &c
}

// TestOwnReadTrustsOnlyTheSameBytes: a plan read back skips the signature
// check only when it is, byte for byte, one this session published (the
// node, payload, message id, signer and signature), and only once. The
// read-back copy carries the stored subject, with its partition token.
func TestOwnReadTrustsOnlyTheSameBytes(t *testing.T) {
	t.Parallel()
	r := &Reconciler{subj: events.Subjects{}}
	s := &session{p: &partition{r: r}, mine: map[string]minePlan{}}
	s.remember(planMsg("id1", "sig1", `{"cause":1}`))
	s.remember(planMsg("id2", "sig2", `{"cause":2}`))
	s.remember(planMsg("id3", "sig3", `{"cause":3}`))
	s.remember(planMsg("id4", "sig4", `{"cause":4}`))
	knock := nats.NewMsg(events.Subjects{}.Event("ace", events.KindKnock))
	knock.Header.Set(jetstream.MsgIDHeader, "k1")
	s.remember(knock)
	for _, c := range []struct {
		name string
		m    *nats.Msg
		want bool
	}{
		{"the same bytes", stored(planMsg("id1", "sig1", `{"cause":1}`)), true},
		{"read again", stored(planMsg("id1", "sig1", `{"cause":1}`)), false},
		{"another node", stored(planOf("bee", "id4", "sig4", `{"cause":4}`)), false},
		{"another signature", planMsg("id2", "forged", `{"cause":2}`), false},
		{"other bytes", planMsg("id3", "sig3", `{"cause":4}`), false},
		{"not published here", planMsg("id9", "sig9", `{"cause":9}`), false},
		{"a knock is not remembered", knock, false},
	} {
		node, _, err := r.subj.Parse(c.m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.ownRead(node, readMsg{m: c.m}); got != c.want {
			t.Errorf("%s: ownRead = %v, want %v", c.name, got, c.want)
		}
	}
	if len(s.mine) != 0 {
		t.Errorf("%d plans still remembered after each was read", len(s.mine))
	}
}

// TestOwnStoredTrustsOnlyItsOwnDeferredPlan: while recovering, a plan
// read skips the signature check only when its keyed id names a plan the
// session's own fold deferred and has not seen stored, its bytes are that
// plan's encoding, and its signer header names the reconciler's current
// key (docs/architecture.md, "Own plans recognised by their keyed id").
// Anything else is left to the signature check, as before.
func TestOwnStoredTrustsOnlyItsOwnDeferredPlan(t *testing.T) {
	t.Parallel()
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := store.NewSigner(kp)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	own, err := store.NewTrust(signer.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{subj: events.Subjects{}, key: key, cfg: ReconcilerConfig{Signer: signer, Own: own}}
	plan := func(cause uint64, build string) reconcile.Effect {
		p := events.Stamp(&events.Plan{Cause: cause, Want: cause, Modules: []events.PlanModule{{Name: "m", Build: build, RunsAs: "m", Files: []events.File{}}}},
			time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
		return reconcile.Effect{Node: "ace", Kind: events.KindPlan, Cause: cause, Payload: p}
	}
	mine, newer := plan(5, "b:1"), plan(9, "b:2")
	msgOf := func(node string, e reconcile.Effect, signerKey string, data []byte) *nats.Msg {
		if data == nil {
			data, err = events.Encode(e.Payload)
			if err != nil {
				t.Fatal(err)
			}
		}
		m := stored(planOf(node, store.EffectMsgID(key, e.ID()), "not checked here", string(data)))
		m.Header.Set(store.HeaderSigner, signerKey)
		return m
	}
	other, err := events.Encode(newer.Payload)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		m     *nats.Msg
		after func(*recovery)
		want  bool
	}{
		{"its own plan, the same bytes", msgOf("ace", mine, signer.PublicKey(), nil), nil, true},
		{"other bytes under its id", msgOf("ace", mine, signer.PublicKey(), other), nil, false},
		{"signed (by its header) with another key", msgOf("ace", mine, "NOLDKEY", nil), nil, false},
		{"on another node's subject", msgOf("bee", mine, signer.PublicKey(), nil), nil, false},
		{"already seen stored (a copy)", msgOf("ace", mine, signer.PublicKey(), nil),
			func(rec *recovery) { rec.seen("ace", events.KindPlan, 6, mine.ID(), true) }, false},
		{"superseded by a newer plan seen", msgOf("ace", mine, signer.PublicKey(), nil),
			func(rec *recovery) { rec.seen("ace", events.KindPlan, 10, newer.ID(), true) }, false},
		{"its own key not among those it trusts", msgOf("ace", mine, signer.PublicKey(), nil),
			func(*recovery) { r.cfg.Own = nil }, false},
	} {
		r.cfg.Own = own
		s := &session{p: &partition{r: r}, rec: newRecovery(), recovering: true}
		s.rec.deferEffect(mine)
		s.rec.deferEffect(newer)
		if c.after != nil {
			c.after(s.rec)
		}
		node, _, err := r.subj.Parse(c.m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		id, valid := store.EffectIDOf(key, c.m.Header.Get(jetstream.MsgIDHeader))
		if !valid {
			t.Fatalf("%s: the test's id is not keyed", c.name)
		}
		if got := s.ownStored(node, id, readMsg{m: c.m}); got != c.want {
			t.Errorf("%s: ownStored = %v, want %v", c.name, got, c.want)
		}
	}
}
