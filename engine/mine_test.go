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

func planMsg(id, sig, data string) *nats.Msg {
	m := nats.NewMsg(events.Subjects{}.Event("ace", events.KindPlan))
	m.Data = []byte(data)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(store.HeaderSigner, "NSIGNER")
	m.Header.Set(store.HeaderSignature, sig)
	return m
}

// TestOwnReadTrustsOnlyTheSameBytes: a plan read back skips the signature
// check only when it is, byte for byte, one this session published (the
// subject, payload, message id, signer and signature), and only once.
func TestOwnReadTrustsOnlyTheSameBytes(t *testing.T) {
	r := &Reconciler{subj: events.Subjects{}}
	s := &session{p: &partition{r: r}, mine: map[string]*nats.Msg{}}
	s.remember(planMsg("id1", "sig1", `{"cause":1}`))
	s.remember(planMsg("id2", "sig2", `{"cause":2}`))
	s.remember(planMsg("id3", "sig3", `{"cause":3}`))
	knock := nats.NewMsg(events.Subjects{}.Event("ace", events.KindKnock))
	knock.Header.Set(jetstream.MsgIDHeader, "k1")
	s.remember(knock)
	for _, c := range []struct {
		name string
		m    *nats.Msg
		want bool
	}{
		{"the same bytes", planMsg("id1", "sig1", `{"cause":1}`), true},
		{"read again", planMsg("id1", "sig1", `{"cause":1}`), false},
		{"another signature", planMsg("id2", "forged", `{"cause":2}`), false},
		{"other bytes", planMsg("id3", "sig3", `{"cause":4}`), false},
		{"not published here", planMsg("id9", "sig9", `{"cause":9}`), false},
		{"a knock is not remembered", knock, false},
	} {
		if got := s.ownRead(readMsg{m: c.m}); got != c.want {
			t.Errorf("%s: ownRead = %v, want %v", c.name, got, c.want)
		}
	}
	if len(s.mine) != 0 {
		t.Errorf("%d plans still remembered after each was read", len(s.mine))
	}
}
