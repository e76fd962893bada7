package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
	t.Parallel()
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

// A trust file names current keys and retired ones, each until its
// overlap ends: a retired key verifies until then and fails with
// ErrRetired after; the file reads back as written; a line that is
// neither form is an error.
func TestTrustFileRetiredKeys(t *testing.T) {
	t.Parallel()
	cur, old, gone := newSigner(t), newSigner(t), newSigner(t)
	trust, err := store.NewTrust(cur.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if _, err := trust.Retire(old.PublicKey(), until); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.Retire(gone.PublicKey(), time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "reconcilers.pub")
	if err := store.WriteTrust(path, trust); err != nil {
		t.Fatal(err)
	}
	back, err := store.ReadTrustFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Current(); !slices.Equal(got, []string{cur.PublicKey()}) {
		t.Errorf("current keys read back: %v", got)
	}
	if !back.Retired(old.PublicKey()) || !back.Retired(gone.PublicKey()) || back.Retired(cur.PublicKey()) {
		t.Errorf("retired keys read back wrong: %s", back)
	}
	if !strings.Contains(back.String(), "retired, until "+until.Format(time.RFC3339)) {
		t.Errorf("String() = %s, want the overlap's end", back)
	}
	data := []byte(`{"v":1,"cause":3}`)
	for _, c := range []struct {
		s    *store.Signer
		want error
	}{{cur, nil}, {old, nil}, {gone, store.ErrRetired}} {
		h := nats.Header{}
		h.Set(jetstream.MsgIDHeader, "ace.plan.3.0.x")
		_ = c.s.Sign(h, "ace", events.KindPlan, "ace.plan.3.0.x", data)
		if err := back.Verify("ace", events.KindPlan, h, data); !errors.Is(err, c.want) {
			t.Errorf("key %s: %v, want %v", c.s.PublicKey(), err, c.want)
		}
	}
	if err := os.WriteFile(path, []byte(cur.PublicKey()+" retired since yesterday\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ReadTrustFile(path); err == nil {
		t.Error("read a line that is neither a key nor a retired key")
	}
}
