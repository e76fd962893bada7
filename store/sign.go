package store

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	voied25519 "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
)

// Effect signatures (issue 14; docs/architecture.md, "Signed effects"):
// the reconciler signs every plan and knock it publishes with an ed25519
// nkey; node agents apply only plans, and provisioners act only on
// knocks, whose signature verifies against the reconciler public keys
// they trust.
const (
	// HeaderSigner is the public key (an nkey, "N…") that signed an effect.
	HeaderSigner = "Meshfold-Signer"
	// HeaderSignature is the ed25519 signature, base64url without padding,
	// over [SignedBytes].
	HeaderSignature = "Meshfold-Signature"
)

// Why an effect's signature does not verify.
var (
	// ErrUnsigned: the message carries no signature or no message id.
	ErrUnsigned = errors.New("effect not signed")
	// ErrUntrusted: signed by a key that is not trusted.
	ErrUntrusted = errors.New("effect signed by an untrusted key")
	// ErrBadSignature: the signature does not verify over this node, kind,
	// message id and payload (altered, or copied from another effect).
	ErrBadSignature = errors.New("effect signature does not verify")
	// ErrRetired: signed by a retired key whose rotation overlap has ended.
	ErrRetired = errors.New("effect signed by a retired key whose overlap has ended")
)

// SignedBytes returns what an effect's signature covers: a domain tag, the
// node and kind (so a signature copied from another node's or another
// kind's effect fails), the Nats-Msg-Id (which names the effect's cause)
// and the payload bytes as stored.
func SignedBytes(node string, kind events.Kind, msgID string, data []byte) []byte {
	b := make([]byte, 0, 32+len(node)+len(kind)+len(msgID)+len(data))
	b = append(b, "meshfold-effect-v1\x00"...)
	b = append(b, node...)
	b = append(b, 0)
	b = append(b, kind...)
	b = append(b, 0)
	b = append(b, msgID...)
	b = append(b, 0)
	return append(b, data...)
}

// Signer signs effects with one nkey. It is safe for concurrent use.
//
// It signs with curve25519-voi's ed25519, not crypto/ed25519: the same
// RFC 8032 signature, byte for byte (ed25519 signing is deterministic),
// in about 60 % of the CPU (16.9-19.1 µs a 1 KiB effect against
// 27.5-29.3); signing was the largest single part of a first refold's
// excess over its raw pipeline (docs/architecture.md, "Signing with
// curve25519-voi"). Everything that verifies (Trust, agents,
// provisioners) keeps crypto/ed25519; nkeys still reads and writes the
// key and gives its public key.
type Signer struct {
	key voied25519.PrivateKey // derived once from the nkey seed
	pub string
}

// NewSigner returns a Signer for kp, which must hold a seed.
//
// Errors: kp has no private key; the key derived from its seed is not
// the one its public key names (never, unless the two ed25519
// implementations disagree).
func NewSigner(kp nkeys.KeyPair) (*Signer, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	rawPub, err := nkeys.Decode(prefix, []byte(pub))
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	key := voied25519.NewKeyFromSeed(raw)
	if !bytes.Equal(key[voied25519.SeedSize:], rawPub) {
		return nil, fmt.Errorf("signing key: the public key derived from the seed is not %s", pub)
	}
	return &Signer{key: key, pub: pub}, nil
}

// NewSigningKey creates a new signing key pair (an nkey with the server
// prefix "N", ed25519).
func NewSigningKey() (nkeys.KeyPair, error) { return nkeys.CreatePair(nkeys.PrefixByteServer) }

// PublicKey returns the signer's public key.
func (s *Signer) PublicKey() string { return s.pub }

// Sign sets the signature headers of an effect message of node and kind
// whose Nats-Msg-Id is msgID.
func (s *Signer) Sign(h nats.Header, node string, kind events.Kind, msgID string, data []byte) error {
	sig := voied25519.Sign(s.key, SignedBytes(node, kind, msgID, data))
	// Both names are in their canonical form (Header.Set's), set
	// without canonicalizing them again for every effect.
	h[HeaderSigner] = []string{s.pub}
	h[HeaderSignature] = []string{base64.RawURLEncoding.EncodeToString(sig)}
	return nil
}

// Trust is a set of trusted reconciler public keys: current keys, and
// retired ones (a key rotation's overlap, docs/architecture.md, "Trust
// per deployment"), each retired key trusted until its overlap ends. Its
// zero value and nil trust nothing.
type Trust struct {
	keys    map[string]ed25519.PublicKey // by nkey, decoded once
	retired map[string]time.Time         // retired keys: trusted until then (zero: no end)
	now     func() time.Time
}

// NewTrust returns the trust of the given public keys, all current.
//
// Errors: a key that is not a public nkey.
func NewTrust(pubs ...string) (*Trust, error) {
	t := &Trust{keys: map[string]ed25519.PublicKey{}, retired: map[string]time.Time{}, now: time.Now}
	for _, p := range pubs {
		if err := t.add(p); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *Trust) add(p string) error {
	if _, err := nkeys.FromPublicKey(p); err != nil {
		return fmt.Errorf("trusted key %q: %w", p, err)
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(p))
	if err != nil {
		return fmt.Errorf("trusted key %q: not a signing key (%w)", p, err)
	}
	t.keys[p] = ed25519.PublicKey(raw)
	return nil
}

// Retire adds pub as a retired key, trusted until the time until (the
// zero time: until it is removed from the trust), and returns t. A
// current key of t given here becomes retired.
//
// Errors: a key that is not a public nkey.
func (t *Trust) Retire(pub string, until time.Time) (*Trust, error) {
	if err := t.add(pub); err != nil {
		return nil, err
	}
	t.retired[pub] = until
	return t, nil
}

// Keys returns the trusted public keys, current and retired, sorted.
func (t *Trust) Keys() []string {
	if t == nil {
		return nil
	}
	out := make([]string, 0, len(t.keys))
	for k := range t.keys {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Current returns the current (not retired) keys, sorted.
func (t *Trust) Current() []string {
	return slices.DeleteFunc(t.Keys(), t.Retired)
}

// Trusts reports whether pub is one of t's keys, current or retired.
func (t *Trust) Trusts(pub string) bool { return t != nil && t.keys[pub] != nil }

// Retired reports whether pub is one of t's retired keys.
func (t *Trust) Retired(pub string) bool {
	if t == nil {
		return false
	}
	_, ok := t.retired[pub]
	return ok
}

// String describes the keys for a log line: each key, and for a retired
// one until when it is trusted.
func (t *Trust) String() string {
	var b strings.Builder
	for i, k := range t.Keys() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
		if until, ok := t.retired[k]; ok {
			if until.IsZero() {
				b.WriteString(" (retired)")
			} else {
				b.WriteString(" (retired, until " + until.UTC().Format(time.RFC3339) + ")")
			}
		}
	}
	return b.String()
}

// Verify checks the signature of an effect message of node and kind with
// headers h and payload data. A retired key verifies only until its
// overlap ends.
//
// Errors: [ErrUnsigned], [ErrUntrusted] (naming the key), [ErrRetired]
// (naming the key), [ErrBadSignature].
func (t *Trust) Verify(node string, kind events.Kind, h nats.Header, data []byte) error {
	signer, sig64, msgID := h.Get(HeaderSigner), h.Get(HeaderSignature), h.Get(jetstream.MsgIDHeader)
	if signer == "" || sig64 == "" || msgID == "" {
		return ErrUnsigned
	}
	var key ed25519.PublicKey
	if t != nil {
		key = t.keys[signer]
	}
	if key == nil {
		return fmt.Errorf("%w: %s", ErrUntrusted, signer)
	}
	if until, ok := t.retired[signer]; ok && !until.IsZero() && !t.now().Before(until) {
		return fmt.Errorf("%w: %s (since %s)", ErrRetired, signer, until.UTC().Format(time.RFC3339))
	}
	sig, err := base64.RawURLEncoding.DecodeString(sig64)
	if err != nil || !ed25519.Verify(key, SignedBytes(node, kind, msgID, data), sig) {
		return ErrBadSignature
	}
	return nil
}

// VerifyMsg is [Trust.Verify] of a stored message: the signature of
// m's node and kind (as its subject names them), message id and payload.
//
// Errors: those of [Trust.Verify].
func (t *Trust) VerifyMsg(m Msg) error {
	return t.Verify(m.Event.Node, m.Event.Kind, m.Header, m.Data)
}

// ReadTrustFile reads a trust file: one public key a line, a current
// key alone on its line, a retired one followed by "retired" and
// optionally "until" and an RFC 3339 time (its overlap's end, written by
// [WriteTrust]); blank lines and lines starting with # are ignored.
//
// Errors: the file's; a line that is neither; no key at all.
func ReadTrustFile(path string) (*Trust, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trusted reconciler keys: %w", err)
	}
	t, err := parseTrust(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(t.keys) == 0 {
		return nil, fmt.Errorf("trusted reconciler keys: %s lists none", path)
	}
	return t, nil
}

func parseTrust(data []byte) (*Trust, error) {
	t, _ := NewTrust()
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 1:
			if err := t.add(f[0]); err != nil {
				return nil, err
			}
		case len(f) == 2 && f[1] == "retired":
			if _, err := t.Retire(f[0], time.Time{}); err != nil {
				return nil, err
			}
		case len(f) == 4 && f[1] == "retired" && f[2] == "until":
			until, err := time.Parse(time.RFC3339, f[3])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			if _, err := t.Retire(f[0], until); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("line %d: want a public key, or KEY retired [until TIME]", n)
		}
	}
	return t, nil
}

// WriteTrustFile writes the public keys to path as current keys (mode
// 0644, atomically), creating its directory (0755) when needed.
func WriteTrustFile(path string, pubs ...string) error {
	t, err := NewTrust(pubs...)
	if err != nil {
		return err
	}
	return WriteTrust(path, t)
}

// WriteTrust writes t to path (mode 0644, atomically) in the form
// [ReadTrustFile] reads, creating its directory (0755) when needed.
func WriteTrust(path string, t *Trust) error {
	var b strings.Builder
	b.WriteString("# meshfold: the reconciler public keys this node agent or provisioner trusts, one a line\n")
	for _, k := range t.Current() {
		b.WriteString(k + "\n")
	}
	for _, k := range t.Keys() {
		until, ok := t.retired[k]
		switch {
		case !ok:
		case until.IsZero():
			b.WriteString(k + " retired\n")
		default:
			b.WriteString(k + " retired until " + until.UTC().Format(time.RFC3339) + "\n")
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, []byte(b.String()), 0o644)
}

// LoadOrCreateSigningKey reads the seed at path, or creates a new key
// there (mode 0600, its directory 0700) when the file does not exist.
//
// Errors: the file's; a file that holds no seed.
func LoadOrCreateSigningKey(path string) (kp nkeys.KeyPair, created bool, err error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := NewSigningKey()
		if err != nil {
			return nil, false, err
		}
		s, _ := kp.Seed()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, false, err
		}
		if err := atomicfile.Write(path, append(s, '\n'), 0o600); err != nil {
			return nil, false, err
		}
		return kp, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("signing key: %w", err)
	}
	kp, err = nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		return nil, false, fmt.Errorf("signing key %s: %w", path, err)
	}
	return kp, false, nil
}
