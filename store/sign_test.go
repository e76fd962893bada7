package store_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

func newSigner(t testing.TB) *store.Signer {
	t.Helper()
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

// A signature verifies only for the node, kind, message id and payload it
// was made for, and only against a trusted key.
func TestSignatureBindsNodeKindIDAndPayload(t *testing.T) {
	s, other := newSigner(t), newSigner(t)
	trust, err := store.NewTrust(s.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"v":1,"cause":3}`)
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, "ace.plan.3.0.abcdef")
	if err := s.Sign(h, "ace", events.KindPlan, h.Get(jetstream.MsgIDHeader), data); err != nil {
		t.Fatal(err)
	}
	if err := trust.Verify("ace", events.KindPlan, h, data); err != nil {
		t.Fatalf("the signed effect does not verify: %v", err)
	}
	withID := func(id string) nats.Header {
		c := nats.Header{}
		for k, v := range h {
			c[k] = v
		}
		c.Set(jetstream.MsgIDHeader, id)
		return c
	}
	oh := nats.Header{}
	oh.Set(jetstream.MsgIDHeader, "ace.plan.3.0.abcdef")
	_ = other.Sign(oh, "ace", events.KindPlan, "ace.plan.3.0.abcdef", data)
	for _, c := range []struct {
		name string
		node string
		kind events.Kind
		h    nats.Header
		data []byte
		want error
	}{
		{"another node", "shanks", events.KindPlan, h, data, store.ErrBadSignature},
		{"another kind", "ace", events.KindKnock, h, data, store.ErrBadSignature},
		{"another message id", "ace", events.KindPlan, withID("ace.plan.4.0.abcdef"), data, store.ErrBadSignature},
		{"another payload", "ace", events.KindPlan, h, []byte(`{"v":1,"cause":4}`), store.ErrBadSignature},
		{"untrusted key", "ace", events.KindPlan, oh, data, store.ErrUntrusted},
		{"unsigned", "ace", events.KindPlan, withID("x"), data, store.ErrUnsigned},
	} {
		if c.name == "unsigned" {
			c.h.Del(store.HeaderSignature)
		}
		if err := trust.Verify(c.node, c.kind, c.h, c.data); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	var none *store.Trust
	if err := none.Verify("ace", events.KindPlan, h, data); !errors.Is(err, store.ErrUntrusted) {
		t.Errorf("nil trust: %v, want ErrUntrusted", err)
	}
}

// The cost of signing and of verifying one effect (a plan of a realistic
// node: 5 modules, about 1 KiB of JSON).
func BenchmarkSignEffect(b *testing.B) {
	s := newSigner(b)
	data := make([]byte, 1024)
	h := nats.Header{}
	for b.Loop() {
		if err := s.Sign(h, "ace", events.KindPlan, "ace.plan.1234.0.0123456789abcdef", data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyEffect(b *testing.B) {
	s := newSigner(b)
	trust, _ := store.NewTrust(s.PublicKey())
	data := make([]byte, 1024)
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, "ace.plan.1234.0.0123456789abcdef")
	_ = s.Sign(h, "ace", events.KindPlan, h.Get(jetstream.MsgIDHeader), data)
	for b.Loop() {
		if err := trust.Verify("ace", events.KindPlan, h, data); err != nil {
			b.Fatal(err)
		}
	}
}
