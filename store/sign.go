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
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

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
type Signer struct {
	key ed25519.PrivateKey // decoded once from the nkey seed
	pub string
}

// NewSigner returns a Signer for kp, which must hold a seed.
//
// Errors: kp has no private key.
func NewSigner(kp nkeys.KeyPair) (*Signer, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	return &Signer{key: ed25519.NewKeyFromSeed(raw), pub: pub}, nil
}

// NewSigningKey creates a new signing key pair (an nkey with the server
// prefix "N", ed25519).
func NewSigningKey() (nkeys.KeyPair, error) { return nkeys.CreatePair(nkeys.PrefixByteServer) }

// PublicKey returns the signer's public key.
func (s *Signer) PublicKey() string { return s.pub }

// Sign sets the signature headers of an effect message of node and kind
// whose Nats-Msg-Id is msgID.
func (s *Signer) Sign(h nats.Header, node string, kind events.Kind, msgID string, data []byte) error {
	sig := ed25519.Sign(s.key, SignedBytes(node, kind, msgID, data))
	h.Set(HeaderSigner, s.pub)
	h.Set(HeaderSignature, base64.RawURLEncoding.EncodeToString(sig))
	return nil
}

// Trust is a set of trusted reconciler public keys. Its zero value and
// nil trust nothing.
type Trust struct {
	keys map[string]ed25519.PublicKey // by nkey, decoded once
}

// NewTrust returns the trust of the given public keys.
//
// Errors: a key that is not a public nkey.
func NewTrust(pubs ...string) (*Trust, error) {
	t := &Trust{keys: map[string]ed25519.PublicKey{}}
	for _, p := range pubs {
		if _, err := nkeys.FromPublicKey(p); err != nil {
			return nil, fmt.Errorf("trusted key %q: %w", p, err)
		}
		raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(p))
		if err != nil {
			return nil, fmt.Errorf("trusted key %q: not a signing key (%w)", p, err)
		}
		t.keys[p] = ed25519.PublicKey(raw)
	}
	return t, nil
}

// Keys returns the trusted public keys, sorted.
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

// Trusts reports whether pub is one of t's keys.
func (t *Trust) Trusts(pub string) bool { return t != nil && t.keys[pub] != nil }

// Verify checks the signature of an effect message of node and kind with
// headers h and payload data.
//
// Errors: [ErrUnsigned], [ErrUntrusted] (naming the key), [ErrBadSignature].
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

// ReadTrustFile reads a trust file: one public key a line; blank lines
// and lines starting with # are ignored.
//
// Errors: the file's; a line that is not a public key; no key at all.
func ReadTrustFile(path string) (*Trust, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trusted reconciler keys: %w", err)
	}
	keys := trustLines(data)
	if len(keys) == 0 {
		return nil, fmt.Errorf("trusted reconciler keys: %s lists none", path)
	}
	t, err := NewTrust(keys...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// trustLines returns the key lines of a trust file, in order.
func trustLines(data []byte) []string {
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys = append(keys, line)
	}
	return keys
}

// WriteTrustFile writes the public keys to path (mode 0644, atomically),
// creating its directory (0755) when needed.
func WriteTrustFile(path string, pubs ...string) error {
	var b strings.Builder
	b.WriteString("# meshfold: the reconciler public keys this node agent or provisioner trusts, one a line\n")
	for _, p := range pubs {
		b.WriteString(p + "\n")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, []byte(b.String()), 0o644)
}

// AddTrustFile adds the public keys to the trust file at path, creating
// it (and its directory) when missing: the keys it lists stay, in their
// order, the new ones follow, each key once. It never removes a key. The
// read and the atomic rewrite happen under an exclusive lock on
// path+".lock" (the trust file itself is replaced by a rename, so it
// cannot carry the lock), so that two processes adding at once lose
// neither key. It returns the keys the file lists afterwards.
//
// Errors: the file's or the lock's; a line of the file, or a key given,
// that is not a public key (the file is then left as it is).
func AddTrustFile(path string, pubs ...string) ([]string, error) {
	if _, err := NewTrust(pubs...); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("trusted reconciler keys: %w", err)
	}
	defer lock.Close() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("trusted reconciler keys: lock %s: %w", lock.Name(), err)
	}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("trusted reconciler keys: %w", err)
	}
	had := trustLines(data)
	if _, err := NewTrust(had...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	keys := make([]string, 0, len(had)+len(pubs))
	for _, k := range append(slices.Clone(had), pubs...) {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	if data != nil && slices.Equal(keys, had) {
		return keys, nil
	}
	return keys, WriteTrustFile(path, keys...)
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
