package store_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/store"
)

// A secret opens only with the key it was sealed to, only as the file it
// was sealed for, and not once a byte of it changed; a record claiming
// another recipient does not open with that recipient's key either.
func TestSealedSecretOpen(t *testing.T) {
	t.Parallel()
	ace, _ := nkeys.CreateCurveKeys()
	shanks, _ := nkeys.CreateCurveKeys()
	acePub, _ := ace.PublicKey()
	shanksPub, _ := shanks.PublicKey()
	const path = "/run/app/token"
	rec, err := store.SealSecret("ace", "app", path, []byte("s3cr3t"), acePub, []byte("k"), "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rec.Open(ace, "ace", "app", path); err != nil || string(got) != "s3cr3t" {
		t.Fatalf("open: %q, %v", got, err)
	}
	if _, err := rec.Open(shanks, "ace", "app", path); !errors.Is(err, store.ErrSealedToOther) {
		t.Errorf("another node's key: %v, want %v", err, store.ErrSealedToOther)
	}
	forged := rec
	forged.To = shanksPub
	if _, err := forged.Open(shanks, "ace", "app", path); !errors.Is(err, store.ErrCannotOpen) {
		t.Errorf("another node's key, the record relabelled: %v, want %v", err, store.ErrCannotOpen)
	}
	if _, err := rec.Open(ace, "ace", "app", "/run/app/other"); !errors.Is(err, store.ErrCannotOpen) {
		t.Errorf("another file: %v, want %v", err, store.ErrCannotOpen)
	}
	tampered := rec
	tampered.Sealed = append([]byte(nil), rec.Sealed...)
	tampered.Sealed[len(tampered.Sealed)/2] ^= 0x40
	if _, err := tampered.Open(ace, "ace", "app", path); !errors.Is(err, store.ErrCannotOpen) {
		t.Errorf("tampered: %v, want %v", err, store.ErrCannotOpen)
	}
	if rec.Digest == "" || rec.Digest == store.SecretDigest(nil, []byte("s3cr3t")) {
		t.Errorf("digest %q: want an HMAC under the digest key", rec.Digest)
	}
	for _, p := range []string{path, "/a b/ç", "/x/.hidden"} {
		if n, m, got, ok := store.ParseSecretKey(store.SecretKey("ace", "app", p)); !ok || n != "ace" || m != "app" || got != p {
			t.Errorf("key of %q does not parse back: %v %q %q %q", p, ok, n, m, got)
		}
	}
	if _, _, _, ok := store.ParseSecretKey(store.CurveKeyName("ace")); ok {
		t.Errorf("a curve key registration parses as a secret")
	}
}

// MaxContentIn is the real ceiling of a put: a record sealing that many
// bytes takes at most max bytes, one sealing a byte more takes more.
func TestSealedMaxContentIn(t *testing.T) {
	t.Parallel()
	ace, _ := nkeys.CreateCurveKeys()
	pub, _ := ace.PublicKey()
	at := time.Date(2026, 12, 4, 15, 40, 1, 0, time.UTC)
	seal := func(n int) store.SealedSecret {
		rec, err := store.SealSecret("ace", "app", "/run/app/token", make([]byte, n), pub, []byte("k"), "alice", at)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	size := func(rec store.SealedSecret) int64 {
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(data))
	}
	const max = 1 << 20
	n := seal(900000).MaxContentIn(900000, max)
	if n < 700000 || n > 800000 {
		t.Fatalf("ceiling %d of a 1 MiB server, want about three quarters", n)
	}
	if s := size(seal(n)); s > max {
		t.Errorf("a record of %d bytes of content takes %d bytes, over %d", n, s, max)
	}
	// base64 takes 3 bytes at a time: 3 bytes more cross the limit.
	if s := size(seal(n + 3)); s <= max {
		t.Errorf("a record of %d bytes of content takes %d bytes, within %d: the ceiling is low", n+3, s, max)
	}
	if got := seal(10).MaxContentIn(10, max); got != n {
		t.Errorf("the ceiling from a small content is %d, from a large one %d", got, n)
	}
	if got := seal(10).MaxContentIn(10, 100); got != 0 {
		t.Errorf("ceiling %d of a 100-byte server", got)
	}
}
