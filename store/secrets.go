package store

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/events"
)

// Sealed secrets (DESIGN.md §12): content sealed to one node's
// provisioner curve key and stored, as ciphertext only, in the KV bucket
// <stream>_SECRETS, one key per (node, module, path); and the status of
// each file a provisioner could not fill, in <stream>_FILLS.
const (
	// SecretsBucketSuffix names the sealed-secrets bucket beside the
	// stream (MESH → MESH_SECRETS).
	SecretsBucketSuffix = "_SECRETS"
	// FillStatusBucketSuffix names the bucket of unfilled files beside the
	// stream (MESH → MESH_FILLS).
	FillStatusBucketSuffix = "_FILLS"
	// SecretsHistory is how many revisions of each secret the bucket keeps.
	SecretsHistory = 10
	// DigestKeyName is the secrets bucket's key holding the HMAC key of
	// the digests `secret ls` shows (read by operators only).
	DigestKeyName = "digest-key"
	// curveKeySuffix is the last token of a node's registered public key:
	// <node>.curve-key (a module name has no dot, a secret key has three
	// tokens).
	curveKeySuffix = "curve-key"
)

// The sealed-secret errors.
var (
	// ErrSealedToOther: the secret was sealed to another curve key than
	// the provisioner's (a key rotated since, or a put before it
	// registered): re-seal it with `meshfold secret put`.
	ErrSealedToOther = errors.New("store: secret sealed to another key")
	// ErrCannotOpen: the ciphertext does not open with the provisioner's
	// key (tampered, truncated, or not for this node, module and path).
	ErrCannotOpen = errors.New("store: secret cannot be opened")
	// ErrNoCurveKey: the node's provisioner has not registered its curve
	// key yet (it does on its first start).
	ErrNoCurveKey = errors.New("store: node has no registered provisioner key")
)

// SecretKey is the secrets bucket's key of (node, module, path):
// <node>.<module>.<path as unpadded base64url>, so that any valid path
// (DESIGN.md §3) is one key token. The same key names the file in the
// fill status bucket.
func SecretKey(node, module, path string) string {
	return node + "." + module + "." + base64.RawURLEncoding.EncodeToString([]byte(path))
}

// ParseSecretKey undoes [SecretKey]; ok is false for any other key (a
// curve key registration, the digest key).
func ParseSecretKey(key string) (node, module, path string, ok bool) {
	f := strings.Split(key, ".")
	if len(f) != 3 || !events.ValidName(f[0]) || !events.ValidName(f[1]) {
		return "", "", "", false
	}
	p, err := base64.RawURLEncoding.DecodeString(f[2])
	if err != nil || !events.ValidPath(string(p)) {
		return "", "", "", false
	}
	return f[0], f[1], string(p), true
}

// CurveKeyName is the secrets bucket's key where node's provisioner
// registers its public curve key.
func CurveKeyName(node string) string { return node + "." + curveKeySuffix }

// SealedSecret is one stored secret: the ciphertext and what `secret ls`
// shows. It never holds the content, nor a plain hash of it.
type SealedSecret struct {
	V int `json:"v"`
	// To is the recipient's public curve key (the node's provisioner).
	To string `json:"to"`
	// From is the one-time sender curve key the content was sealed with.
	From string `json:"from"`
	// Sealed is the ciphertext (nkeys xkeys: X25519, XSalsa20-Poly1305)
	// of the content bound to its node, module and path.
	Sealed []byte `json:"sealed"`
	// Digest is the hex HMAC-SHA256 of the content under the bucket's
	// digest key; empty when it was sealed without one.
	Digest string `json:"digest,omitempty"`
	// By is who put it; At when (the putter's clock). Of a removal: who
	// removed it, and when.
	By string    `json:"by"`
	At time.Time `json:"at"`
	// Removed marks a removal (`meshfold secret rm`), with no content: the
	// provisioner consults no later source for the file until a new put
	// (DESIGN.md §12; docs/architecture.md, "secret rm"). A record from
	// before it has none, and decodes as before.
	Removed bool `json:"removed,omitempty"`
}

// RemovedSecret is the record `meshfold secret rm` stores in place of a
// secret: no content, who removed it and when.
func RemovedSecret(by string, at time.Time) SealedSecret {
	return SealedSecret{V: 1, By: by, At: at.UTC(), Removed: true}
}

// bound is the plaintext actually sealed: a header naming where the
// content belongs, so a ciphertext copied under another key does not open.
func bound(node, module, path string, content []byte) []byte {
	var b bytes.Buffer
	b.WriteString("meshfold-secret/1\x00" + node + "\x00" + module + "\x00" + path + "\x00")
	b.Write(content)
	return b.Bytes()
}

// SealSecret seals content for node's provisioner, whose public curve key
// is to, as the file path of module: a fresh sender key per call.
// digestKey, when not nil, keys the record's Digest.
//
// Errors: to is not a curve public key; sealing fails.
func SealSecret(node, module, path string, content []byte, to string, digestKey []byte, by string, at time.Time) (SealedSecret, error) {
	if !nkeys.IsValidPublicCurveKey(to) {
		return SealedSecret{}, fmt.Errorf("store: %q is not a curve public key", to)
	}
	sender, err := nkeys.CreateCurveKeys()
	if err != nil {
		return SealedSecret{}, err
	}
	defer sender.Wipe()
	from, err := sender.PublicKey()
	if err != nil {
		return SealedSecret{}, err
	}
	sealed, err := sender.Seal(bound(node, module, path, content), to)
	if err != nil {
		return SealedSecret{}, fmt.Errorf("store: seal: %w", err)
	}
	s := SealedSecret{V: 1, To: to, From: from, Sealed: sealed, By: by, At: at.UTC()}
	if digestKey != nil {
		s.Digest = SecretDigest(digestKey, content)
	}
	return s, nil
}

// MaxContentIn returns the most bytes of content a secret sealed as s
// (from content of n bytes) can hold while its stored record, the JSON a
// put publishes, takes at most max bytes (a server's max_payload): the
// same node, module, path, key, author and time, any content. Sealing
// adds a fixed overhead (the bound header, the nonce and the box's
// tag), and the record carries the ciphertext in base64, 4 bytes for 3:
// on a 1 MiB server a secret holds about three quarters of it. 0 when
// none fits.
func (s SealedSecret) MaxContentIn(n int, max int64) int {
	data, err := json.Marshal(s)
	if err != nil {
		return 0
	}
	fixed := len(data) - base64.StdEncoding.EncodedLen(len(s.Sealed))
	over := len(s.Sealed) - n
	room := max - int64(fixed)
	if room <= 0 {
		return 0
	}
	c := room/4*3 - int64(over)
	if c < 0 {
		return 0
	}
	return int(min(c, int64(^uint(0)>>1)))
}

// SecretDigest is the hex HMAC-SHA256 of content under key.
func SecretDigest(key, content []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(content)
	return hex.EncodeToString(m.Sum(nil))
}

// Open returns the content of s, sealed for (node, module, path), with
// the recipient's curve key pair kp.
//
// Errors: [ErrSealedToOther] when s was sealed to another key;
// [ErrCannotOpen] when it does not open or names another file.
func (s SealedSecret) Open(kp nkeys.KeyPair, node, module, path string) ([]byte, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	if s.To != pub {
		return nil, fmt.Errorf("%w: sealed to %s, this provisioner's key is %s", ErrSealedToOther, s.To, pub)
	}
	plain, err := kp.Open(s.Sealed, s.From)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCannotOpen, err)
	}
	head := bound(node, module, path, nil)
	if !bytes.HasPrefix(plain, head) {
		return nil, fmt.Errorf("%w: sealed for another file", ErrCannotOpen)
	}
	return plain[len(head):], nil
}

// DecodeSealedSecret reads a stored record: a secret, or a removal
// (Removed, no ciphertext).
//
// Errors: [ErrCannotOpen] for a record that is not one.
func DecodeSealedSecret(data []byte) (SealedSecret, error) {
	var s SealedSecret
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("%w: not a sealed secret record: %v", ErrCannotOpen, err)
	}
	if s.Removed && len(s.Sealed) == 0 && s.V == 1 {
		return s, nil
	}
	if s.V != 1 || len(s.Sealed) == 0 || s.Removed {
		return s, fmt.Errorf("%w: not a sealed secret record (v %d)", ErrCannotOpen, s.V)
	}
	return s, nil
}

// OpenSecrets opens the sealed-secrets bucket of streamCfg's stream
// (<stream>_SECRETS), creating it when missing (file storage, history
// [SecretsHistory], the stream's replicas) when create is true.
//
// Errors: the bucket's lookup (jetstream.ErrBucketNotFound when missing
// and create is false) or creation failing.
func OpenSecrets(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig, create bool) (jetstream.KeyValue, error) {
	cfg := streamCfg.WithDefaults()
	return openBucket(ctx, js, create, jetstream.KeyValueConfig{Bucket: cfg.Name + SecretsBucketSuffix,
		Description: "meshfold sealed secrets of stream " + cfg.Name + ": ciphertext only, keyed by node, module and path",
		History:     SecretsHistory, Storage: jetstream.FileStorage, Replicas: cfg.Replicas})
}

// OpenFillStatus opens the fill status bucket of streamCfg's stream
// (<stream>_FILLS), creating it when missing and create is true. Each
// provisioner keeps there, under [SecretKey], the [FillStatus] of every
// file of its node it could not fill, and deletes it once filled.
//
// Errors: as [OpenSecrets].
func OpenFillStatus(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig, create bool) (jetstream.KeyValue, error) {
	cfg := streamCfg.WithDefaults()
	return openBucket(ctx, js, create, jetstream.KeyValueConfig{Bucket: cfg.Name + FillStatusBucketSuffix,
		Description: "meshfold provisioners: why each unfilled file of a node is not filled (never content)",
		History:     1, Storage: jetstream.FileStorage, Replicas: cfg.Replicas})
}

func openBucket(ctx context.Context, js jetstream.JetStream, create bool, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := openKV(ctx, js, create, cfg)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// FillStatus is why a provisioner could not fill one file (DESIGN.md
// §12): kept in the fill status bucket until the file is filled; or, in
// state [FillShadowed], why a filled file is not what its sealed secret
// holds, kept until it is. It never holds content.
type FillStatus struct {
	V      int    `json:"v"`
	Node   string `json:"node"`
	Module string `json:"module"`
	Path   string `json:"path"`
	// State is one of the FillState values.
	State FillState `json:"state"`
	// Why says, source by source, why no content was found or sent; the
	// reason that names State comes first.
	Why string `json:"why"`
	// Since is when this state began (the provisioner's clock).
	Since time.Time `json:"since"`
	// Source is, in state [FillShadowed], the source that gave the
	// content the node holds, as the provisioner names it ("dir
	// /srv/x", "exec CMD"), so that 'secret put' and 'secret ls' say
	// which one shadows the put; empty otherwise (and from a provisioner
	// older than this field).
	Source string `json:"source,omitempty"`
	// Signer is, in state [FillUntrusted], the key that signed the plan
	// or knock the provisioner refused (its public nkey; empty when it
	// was unsigned); empty otherwise.
	Signer string `json:"signer,omitempty"`
	// Revision is the secrets bucket's revision of the sealed secret
	// (or removal) the provisioner read for the file when it wrote this
	// status; 0 when it read none (no --from sealed, none stored, or a
	// provisioner older than this field). 'secret put' waits for a
	// status or a [FillRecord] at its own revision.
	Revision uint64 `json:"revision,omitempty"`
	// LastFilled is, of a file not filled now, when a provisioner last
	// had the node write it ([FillRecord.At]): the node keeps that
	// content (a removed secret's, one sealed to a key rotated since).
	// Zero when none ever filled it, as the bucket remembers.
	LastFilled time.Time `json:"last_filled,omitzero"`
}

// FillRecord is the last fill of one file a node's provisioner made
// (the node wrote it, or held that content already), kept in the fill
// status bucket under [FilledKey] while the node's plan declares the
// file: what 'secret put' waits for, and how 'state' and 'fleet' tell
// a file the node keeps from one it never got ([FillStatus.LastFilled]).
// It never holds content. A provisioner of a build before this one
// writes none.
type FillRecord struct {
	V      int    `json:"v"`
	Node   string `json:"node"`
	Module string `json:"module"`
	Path   string `json:"path"`
	// Source is the source that gave the content ("sealed", "dir
	// /srv/x", "exec CMD").
	Source string `json:"source"`
	// Revision is the secrets bucket's revision of the sealed secret
	// the content is (Source "sealed") or was compared with (a
	// shadowing source); 0 when none was read.
	Revision uint64 `json:"revision,omitempty"`
	// Digest is, of content from the sealed secret, the put's digest
	// ([SealedSecret.Digest]); "" otherwise.
	Digest string `json:"digest,omitempty"`
	// At is when the node last wrote the content (the provisioner's
	// clock); Unchanged says the node held it already then.
	At        time.Time `json:"at"`
	Unchanged bool      `json:"unchanged,omitempty"`
}

// filledSuffix is the last token of a file's [FillRecord] key: four
// tokens, so that [ReadFillStatus] of every node (three) never reads it,
// and one node's read ([ReadFillStatus] of node) decodes no state from it.
const filledSuffix = "filled"

// FilledKey is the fill status bucket's key of node's [FillRecord] of
// module's file path: [SecretKey] and ".filled".
func FilledKey(node, module, path string) string {
	return SecretKey(node, module, path) + "." + filledSuffix
}

// ReadFillRecords returns node's [FillRecord]s, keyed by [SecretKey]; a
// value that does not decode is left out.
//
// Errors: the bucket's read.
func ReadFillRecords(ctx context.Context, kv jetstream.KeyValue, node string) (map[string]FillRecord, error) {
	entries, err := ReadKV(ctx, kv, node+".*.*."+filledSuffix)
	out := make(map[string]FillRecord, len(entries))
	for _, e := range entries {
		var r FillRecord
		if json.Unmarshal(e.Value(), &r) == nil && r.V > 0 {
			out[SecretKey(r.Node, r.Module, r.Path)] = r
		}
	}
	return out, err
}

// DecodeFillRecord decodes a [FillRecord] value; ok is false when it is
// none.
func DecodeFillRecord(data []byte) (r FillRecord, ok bool) {
	if json.Unmarshal(data, &r) != nil || r.V == 0 {
		return FillRecord{}, false
	}
	return r, true
}

// DecodeFillStatus decodes a file's [FillStatus] value; ok is false when
// it is none.
func DecodeFillStatus(data []byte) (st FillStatus, ok bool) {
	if json.Unmarshal(data, &st) != nil || st.State == "" {
		return FillStatus{}, false
	}
	return st, true
}

// FillState is the kind of a [FillStatus].
type FillState string

// The fill states.
const (
	// FillMissing: no source had content for the file.
	FillMissing FillState = "missing"
	// FillSourceFailed: a source failed (a helper that could not run or
	// timed out, an unreadable file, a bucket that cannot be read) and
	// no later one had content.
	FillSourceFailed FillState = "source-failed"
	// FillSealedToOther: the sealed secret is sealed to another key.
	FillSealedToOther FillState = "sealed-to-other-key"
	// FillCannotOpen: the sealed secret does not open (tampered).
	FillCannotOpen FillState = "cannot-open"
	// FillNotSent: the request could not be sent or was rejected.
	FillNotSent FillState = "not-sent"
	// FillShadowed: the file is filled, but from a source tried before
	// the sealed one, while a sealed secret put for it holds other
	// content: the put is not what the node holds (the --from order).
	FillShadowed FillState = "shadowed"
	// FillRefused: the node refuses this provisioner's writes for a
	// reason the provisioner itself can see and fix: wrong-account (its
	// account is not the one the node's plan names). Kept until a write
	// is accepted, also when the fold owes nothing (an earlier fill at
	// the same plan paid the refusal).
	FillRefused FillState = "refused"
	// FillUntrusted: the provisioner refuses the node's plans or knocks
	// for their signature (store.ErrUntrusted, ErrRetired, ErrUnsigned:
	// a key its --trust does not name, one retired past its overlap, or
	// none), so it fills no file of the node and takes no knock. Not a
	// file's: Module and Path are empty and the status is kept under
	// [TrustStatusKey], one per node, written when the refusal's cause
	// (the key, and why it is refused) changes and deleted once the
	// provisioner accepts a plan or knock again.
	FillUntrusted FillState = "untrusted"
)

// trustStatusSuffix is the last two tokens of a node's [FillUntrusted]
// status: <node>.provisioner.trust, three tokens as a file's status, so
// that [ReadFillStatus] of every node reads it in the same pass, and
// never a file's key ("trust" is no unpadded base64 of any path).
const trustStatusSuffix = knockAnswerSuffix + ".trust"

// TrustStatusKey is the fill status bucket's key where node's
// provisioner keeps its [FillUntrusted] status.
func TrustStatusKey(node string) string { return node + "." + trustStatusSuffix }

// ReadFillStatus lists the fill statuses of node ("" for every node),
// in key order: its files', and its provisioner's [FillUntrusted] one
// (Module and Path empty) when it refuses the node's plans or knocks.
//
// Errors: the bucket's read.
func ReadFillStatus(ctx context.Context, kv jetstream.KeyValue, node string) ([]FillStatus, error) {
	// Every node's: the keys of three tokens ([SecretKey]), so that the
	// provisioners' knock answers (two, [KnockAnswerKey]) are not read.
	filter := "*.*.*"
	if node != "" {
		filter = node + ".>"
	}
	entries, err := ReadKV(ctx, kv, filter)
	var out []FillStatus
	for _, e := range entries {
		var st FillStatus
		if json.Unmarshal(e.Value(), &st) == nil && st.State != "" {
			out = append(out, st)
		}
	}
	return out, err
}

// ReadKV returns the newest entry of every key of kv matching filter (a
// KV key pattern), deleted keys left out: one ordered consumer over the
// bucket, read up to its end.
//
// Errors: the watch's; ctx's.
func ReadKV(ctx context.Context, kv jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return out, errors.New("store: bucket watch closed")
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
}

// knockAnswerSuffix is the last token of a node's [KnockAnswer] in the
// fill status bucket: <node>.provisioner (a file's status has three
// tokens, [SecretKey]).
const knockAnswerSuffix = "provisioner"

// KnockAnswerKey is the fill status bucket's key where node's
// provisioner keeps its [KnockAnswer].
func KnockAnswerKey(node string) string { return node + "." + knockAnswerSuffix }

// KnockAnswer is what a node's provisioner last answered: the newest
// knock it took (on start, the node's newest knock then, which its fill
// on start covers), kept in the fill status bucket under
// [KnockAnswerKey] so that an operator can tell a knock nobody answered
// (no provisioner runs for the node) from one being filled. It never
// holds content. A provisioner of a build before this one writes none.
type KnockAnswer struct {
	V    int    `json:"v"`
	Node string `json:"node"`
	// Account is the provisioner's writer account (its --account).
	Account string `json:"account,omitempty"`
	// Knock is the stream sequence of the newest knock taken, 0 for none
	// yet; Cause is that knock's cause (the poke, refusal… it answers).
	Knock uint64 `json:"knock"`
	Cause uint64 `json:"cause"`
	// At is when it took it (the provisioner's clock); Started, when
	// the provisioner started.
	At      time.Time `json:"at"`
	Started time.Time `json:"started"`
}

// PutKnockAnswer stores a under [KnockAnswerKey].
//
// Errors: the put's.
func PutKnockAnswer(ctx context.Context, kv jetstream.KeyValue, a KnockAnswer) error {
	a.V = 1
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, KnockAnswerKey(a.Node), data)
	return err
}

// ReadKnockAnswers returns the [KnockAnswer] of node ("" for every
// node's), by node; a value that does not decode is left out.
//
// Errors: the bucket's read.
func ReadKnockAnswers(ctx context.Context, kv jetstream.KeyValue, node string) (map[string]KnockAnswer, error) {
	filter := "*." + knockAnswerSuffix
	if node != "" {
		filter = KnockAnswerKey(node)
	}
	entries, err := ReadKV(ctx, kv, filter)
	out := make(map[string]KnockAnswer, len(entries))
	for _, e := range entries {
		var a KnockAnswer
		if json.Unmarshal(e.Value(), &a) == nil && a.V > 0 && a.Node != "" {
			out[a.Node] = a
		}
	}
	return out, err
}

// GetKnockAnswer returns node's [KnockAnswer]; ok is false when none is
// stored (or it does not decode).
//
// Errors: the get's, other than for no key.
func GetKnockAnswer(ctx context.Context, kv jetstream.KeyValue, node string) (a KnockAnswer, ok bool, err error) {
	e, err := kv.Get(ctx, KnockAnswerKey(node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return a, false, nil
	}
	if err != nil {
		return a, false, err
	}
	if json.Unmarshal(e.Value(), &a) != nil || a.V == 0 {
		return KnockAnswer{}, false, nil
	}
	return a, true, nil
}

// GetTrustStatus returns node's [FillUntrusted] status (under
// [TrustStatusKey]); ok is false when none is stored (its provisioner
// accepts the node's plans and knocks, or never refused one) or it does
// not decode.
//
// Errors: the get's, other than for no key.
func GetTrustStatus(ctx context.Context, kv jetstream.KeyValue, node string) (st FillStatus, ok bool, err error) {
	e, err := kv.Get(ctx, TrustStatusKey(node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	if json.Unmarshal(e.Value(), &st) != nil || st.State != FillUntrusted {
		return FillStatus{}, false, nil
	}
	return st, true, nil
}
