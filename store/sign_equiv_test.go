package store_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// The Signer signs with curve25519-voi while every verifier (Trust,
// agents, provisioners, nkeys) uses crypto/ed25519 (docs/architecture.md,
// "Signing with curve25519-voi"). These tests hold it to the reference:
// for any seed and any effect, the signature it writes is byte for byte
// the one crypto/ed25519 and nkeys make from the same seed, and it
// verifies on the path nodes take.

// fataler is what checkSignerMatches needs of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// checkSignerMatches signs an effect of node, kind, msgID and data with
// a Signer of the nkey whose raw seed is seed, and fails unless its
// public key and signature are crypto/ed25519's and nkeys', and the
// effect verifies against a Trust of that key (and nowhere else).
func checkSignerMatches(t fataler, seed []byte, node string, kind events.Kind, msgID string, data []byte) {
	t.Helper()
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteServer, seed)
	if err != nil {
		t.Fatalf("nkey of seed %x: %v", seed, err)
	}
	s, err := store.NewSigner(kp)
	if err != nil {
		t.Fatalf("NewSigner of seed %x: %v", seed, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	if s.PublicKey() != pub {
		t.Fatalf("signer's public key %s, the nkey's %s", s.PublicKey(), pub)
	}
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, msgID)
	if err := s.Sign(h, node, kind, msgID, data); err != nil {
		t.Fatal(err)
	}
	if got := h.Get(store.HeaderSigner); got != pub {
		t.Fatalf("%s header %q, want %s", store.HeaderSigner, got, pub)
	}
	got, err := base64.RawURLEncoding.DecodeString(h.Get(store.HeaderSignature))
	if err != nil {
		t.Fatalf("%s header %q: %v", store.HeaderSignature, h.Get(store.HeaderSignature), err)
	}
	msg := store.SignedBytes(node, kind, msgID, data)
	if want := ed25519.Sign(ed25519.NewKeyFromSeed(seed), msg); !bytes.Equal(got, want) {
		t.Fatalf("seed %x, %d-byte message: signature\n%x\nwant crypto/ed25519's\n%x", seed, len(msg), got, want)
	}
	if want, err := kp.Sign(msg); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("seed %x, %d-byte message: signature\n%x\nwant nkeys'\n%x (%v)", seed, len(msg), got, want, err)
	}
	trust, err := store.NewTrust(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := trust.Verify(node, kind, h, data); err != nil {
		t.Fatalf("seed %x: the signed effect does not verify: %v", seed, err)
	}
	if err := kp.Verify(msg, got); err != nil {
		t.Fatalf("seed %x: nkeys does not verify the signature: %v", seed, err)
	}
	// The same signature over another payload must not verify: the
	// verifier really checked it.
	if err := trust.Verify(node, kind, h, append(bytes.Clone(data), 0)); err == nil {
		t.Fatalf("seed %x: the signature verifies over another payload", seed)
	}
}

// For random seeds (100 a run) and effects (one to eight a seed, each
// with up to 8 KiB of payload, more than any plan the benchmarks
// publish), the Signer's signatures are crypto/ed25519's and nkeys', byte
// for byte, and verify on the nodes' path.
func TestSignerMatchesCryptoEd25519(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.SliceOfN(rapid.Byte(), ed25519.SeedSize, ed25519.SeedSize).Draw(t, "seed")
		node := rapid.StringMatching(`[a-z0-9][a-z0-9_-]{0,40}`).Draw(t, "node")
		kind := rapid.SampledFrom([]events.Kind{events.KindPlan, events.KindKnock}).Draw(t, "kind")
		for range rapid.IntRange(1, 8).Draw(t, "effects") {
			msgID := rapid.StringMatching(`[a-z0-9.]{1,80}`).Draw(t, "msgid")
			data := rapid.SliceOfN(rapid.Byte(), 0, 8192).Draw(t, "data")
			checkSignerMatches(t, seed, node, kind, msgID, data)
		}
	})
}

// A key loaded from its seed file, as `reconcile --signing-key` and
// `serve` load it, signs as crypto/ed25519 does with the file's seed.
func TestSignerOfSeedFileMatchesCryptoEd25519(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/reconciler-signing.nk"
	if _, created, err := store.LoadOrCreateSigningKey(path); err != nil || !created {
		t.Fatalf("created %v: %v", created, err)
	}
	kp, created, err := store.LoadOrCreateSigningKey(path)
	if err != nil || created {
		t.Fatalf("read back: created %v: %v", created, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{0, 1, 63, 64, 400, 1024, 65536} {
		data := bytes.Repeat([]byte{byte(i)}, n)
		checkSignerMatches(t, raw, "ace", events.KindPlan, "ace.plan.1234.0.0123456789abcdef", data)
		checkSignerMatches(t, raw, "ace", events.KindKnock, "ace.knock.1234.0", data)
	}
}

// FuzzSignerMatchesCryptoEd25519 is TestSignerMatchesCryptoEd25519 with
// the fuzzer's seeds and effects (a seed of any length is padded with
// zeros or cut to 32 bytes, so that every seed byte is the fuzzer's).
//
//	go test ./store -run '^$' -fuzz FuzzSignerMatchesCryptoEd25519 -fuzztime 60s
func FuzzSignerMatchesCryptoEd25519(f *testing.F) {
	f.Add(make([]byte, 32), "ace", true, "ace.plan.3.0.abcdef", []byte(`{"v":1,"cause":3}`))
	f.Add(bytes.Repeat([]byte{0xff}, 32), "shanks", false, "shanks.knock.9.0", []byte{})
	f.Add([]byte("meshfold"), "n-1", true, "n-1.plan.1.0.0", bytes.Repeat([]byte("x"), 400))
	f.Fuzz(func(t *testing.T, seed []byte, node string, plan bool, msgID string, data []byte) {
		s := make([]byte, ed25519.SeedSize)
		copy(s, seed)
		kind := events.KindKnock
		if plan {
			kind = events.KindPlan
		}
		if msgID == "" {
			msgID = "x" // an effect without a message id is unsigned by rule
		}
		checkSignerMatches(t, s, node, kind, msgID, data)
	})
}

// BenchmarkSignEffectStd is BenchmarkSignEffect's signature made by
// crypto/ed25519, as the Signer made it before it signed with
// curve25519-voi: the two side by side in one run.
func BenchmarkSignEffectStd(b *testing.B) {
	kp, err := store.NewSigningKey()
	if err != nil {
		b.Fatal(err)
	}
	seed, _ := kp.Seed()
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		b.Fatal(err)
	}
	key := ed25519.NewKeyFromSeed(raw)
	data := make([]byte, 1024)
	h := nats.Header{}
	for b.Loop() {
		sig := ed25519.Sign(key, store.SignedBytes("ace", events.KindPlan, "ace.plan.1234.0.0123456789abcdef", data))
		h.Set(store.HeaderSignature, base64.RawURLEncoding.EncodeToString(sig))
	}
}
