package engine

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
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
