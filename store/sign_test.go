package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// AddTrustFile adds, never replaces: the keys already listed stay in
// their order, new ones follow, each key once, and a second add of the
// same key leaves the file as it is.
func TestAddTrustFileKeepsEveryKeyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "reconcilers.pub")
	a, b := newSigner(t).PublicKey(), newSigner(t).PublicKey()
	if keys, err := store.AddTrustFile(path, a); err != nil || !slices.Equal(keys, []string{a}) {
		t.Fatalf("first add: %v %v", keys, err)
	}
	if keys, err := store.AddTrustFile(path, b); err != nil || !slices.Equal(keys, []string{a, b}) {
		t.Fatalf("second key: %v %v, want both, the first first", keys, err)
	}
	before, _ := os.ReadFile(path)
	for _, k := range []string{a, b, a} {
		if keys, err := store.AddTrustFile(path, k); err != nil || !slices.Equal(keys, []string{a, b}) {
			t.Fatalf("add again %s: %v %v", k, keys, err)
		}
	}
	after, _ := os.ReadFile(path)
	if string(after) != string(before) || strings.Count(string(after), a) != 1 || strings.Count(string(after), b) != 1 {
		t.Fatalf("the file after adding its own keys again:\n%s\nbefore:\n%s", after, before)
	}
	trust, err := store.ReadTrustFile(path)
	if err != nil || !slices.Equal(trust.Keys(), slices.Sorted(slices.Values([]string{a, b}))) {
		t.Fatalf("read back: %v %v", trust.Keys(), err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode: %v %v, want 0644", fi, err)
	}
}

// A file with a line that is not a key is an error, and stays as it is:
// the add does not drop what it cannot read.
func TestAddTrustFileLeavesAnUnreadableFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reconcilers.pub")
	const bad = "# hand-edited\nnot-a-key\n"
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := store.AddTrustFile(path, newSigner(t).PublicKey()); err == nil {
		t.Fatal("added to a file with a line that is not a key")
	}
	if got, _ := os.ReadFile(path); string(got) != bad {
		t.Fatalf("the file became:\n%s", got)
	}
	if _, err := store.AddTrustFile(filepath.Join(t.TempDir(), "x.pub"), "not-a-key"); err == nil {
		t.Fatal("added a key that is not a public key")
	}
}

// Serves starting together each add their key under the lock: none is
// lost to another's read-modify-write.
func TestAddTrustFileConcurrentAddsLoseNone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reconcilers.pub")
	const n = 16
	want := make([]string, n)
	for i := range want {
		want[i] = newSigner(t).PublicKey()
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, k := range want {
		wg.Go(func() {
			_, err := store.AddTrustFile(path, k)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	trust, err := store.ReadTrustFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := trust.Keys(); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("the file lists %d keys, want the %d added", len(got), n)
	}
}
