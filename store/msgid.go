package store

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Effect message ids: the reconciler signs each effect's id so that no
// other publisher can take it first (docs/architecture.md, "Exactly-once
// effects"). The key lives in a bucket of its own, <stream>_KEYS, apart
// from the snapshots: deleting the snapshot bucket to force a refold must
// not lose it, or the refold would recognise none of the stored effects
// and publish them all again (issue 17). Only reconcilers may read it.

// EffectKeyBucketSuffix is appended to the stream name to name the bucket
// of the reconcilers' keys: MESH → MESH_KEYS.
const EffectKeyBucketSuffix = "_KEYS"

// effectKeyName is the key, in the keys bucket and (before issue 17) in
// the snapshot bucket, holding the reconciler's effect-id key.
const effectKeyName = "effect-key"

// ErrKeysDenied: this user may not read the keys bucket (credentials
// issued before it existed); [EffectKey] returned the key of the snapshot
// bucket with it, and exactly-once across a refold depends on that bucket
// again until the reconciler's credentials are issued anew.
var ErrKeysDenied = errors.New("store: the keys bucket is denied to this user: the effect key was read from the snapshot bucket")

// apiPrefix is the JetStream API subject prefix of js, dot-terminated:
// its domain's, its API prefix, or the default.
func apiPrefix(js jetstream.JetStream) string {
	opts := js.Options()
	if opts.Domain != "" {
		return "$JS." + opts.Domain + ".API."
	}
	if p := opts.APIPrefix; p != "" {
		return strings.TrimSuffix(p, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// EffectKey returns the key that signs the reconciler's effect message
// ids (see [EffectMsgID]), 32 bytes, from the bucket <stream>_KEYS
// (created with the stream's replica count when missing). When that
// bucket has no key yet, the key a deployment from before the bucket
// kept in its snapshot bucket (snaps; nil: none) is moved there, so its
// stored effects keep their ids; only when neither has one is a new key
// made (32 random bytes). Every reconciler of the stream shares it;
// roles without read access to the keys bucket (every role but the
// reconciler) cannot learn it.
//
// Errors: the buckets' errors; a stored key of the wrong size. When this
// user is denied the keys bucket and the snapshot bucket holds a key, that
// key is returned together with an error wrapping [ErrKeysDenied]: use it,
// and warn.
func EffectKey(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig, snaps *Snapshots) ([]byte, error) {
	cfg := streamCfg.WithDefaults()
	bucket := cfg.Name + EffectKeyBucketSuffix
	// A reconciler whose credentials were issued before the keys bucket
	// existed is denied it: detected at once (not as a timeout), and the
	// snapshot bucket's key is used as before, with ErrKeysDenied.
	gctx, release := watchDenials(js.Conn()).guard(ctx, subjectIs(apiPrefix(js)+"STREAM.INFO.KV_"+bucket))
	kv, err := js.KeyValue(gctx, bucket)
	cause := context.Cause(gctx)
	release()
	if errors.Is(cause, nats.ErrPermissionViolation) {
		if snaps != nil {
			if old, err := snaps.kv.Get(ctx, effectKeyName); err == nil && len(old.Value()) == 32 {
				return old.Value(), fmt.Errorf("bucket %s: %w: %v", bucket, ErrKeysDenied, cause)
			}
		}
		return nil, fmt.Errorf("effect key: bucket %s: %w", bucket, cause)
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = CreateKV(ctx, js, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "meshfold reconcilers' keys of stream " + cfg.Name + ": effect-key signs effect message ids",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("effect key: bucket %s: %w", bucket, err)
	}
	e, err := kv.Get(ctx, effectKeyName)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		var key []byte
		if snaps != nil {
			old, err := snaps.kv.Get(ctx, effectKeyName)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				return nil, fmt.Errorf("effect key: the snapshot bucket's: %w", err)
			default:
				key = old.Value()
			}
		}
		if key == nil {
			key = make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return nil, fmt.Errorf("effect key: %w", err)
			}
		}
		// Create, not put: of two reconcilers starting at once, the first
		// key stored wins and both read it back.
		if _, err := kv.Create(ctx, effectKeyName, key); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("effect key: %w", err)
		}
		e, err = kv.Get(ctx, effectKeyName)
	}
	if err != nil {
		return nil, fmt.Errorf("effect key: %w", err)
	}
	if len(e.Value()) != 32 {
		return nil, fmt.Errorf("effect key: %d bytes stored, want 32", len(e.Value()))
	}
	return e.Value(), nil
}

// EffectMsgID returns the Nats-Msg-Id an effect is published with: its id
// (<node>.<kind>.<cause>.<n>, DESIGN.md §3) and the first 16 hex digits of
// HMAC-SHA256(key, id). JetStream's duplicate window is stream-wide, so an
// id anyone could compute would let any publisher (a node) store a message
// under another node's next knock id first and have the real knock dropped
// as a duplicate. Replays and restarts make the same ids.
func EffectMsgID(key []byte, id string) string {
	var sum [16]byte
	effectMAC(key, id, &sum)
	return id + "." + string(sum[:])
}

// EffectIDOf checks a message id made by [EffectMsgID] and returns the
// effect id it carries; ok is false for any other id, a forged one
// included.
func EffectIDOf(key []byte, msgID string) (id string, ok bool) {
	i := strings.LastIndexByte(msgID, '.')
	if i < 0 || len(msgID)-i-1 != 16 {
		return "", false
	}
	id = msgID[:i]
	var sum [16]byte
	effectMAC(key, id, &sum)
	return id, hmac.Equal(sum[:], []byte(msgID[i+1:]))
}

// macs pools, per effect key, HMAC-SHA256 hashers keyed with it: making
// one costs two SHA-256 blocks and a few allocations, and the reconciler
// makes an id for every effect it publishes and checks one for every
// effect it reads back while recovering.
var macs sync.Map // string(key) → *sync.Pool of hash.Hash

// effectMAC writes the first 16 hex digits of HMAC-SHA256(key, id) to
// sum.
func effectMAC(key []byte, id string, sum *[16]byte) {
	pool, ok := macs.Load(string(key))
	if !ok {
		k := bytes.Clone(key)
		pool, _ = macs.LoadOrStore(string(k), &sync.Pool{New: func() any { return hmac.New(sha256.New, k) }})
	}
	p := pool.(*sync.Pool)
	h := p.Get().(hash.Hash)
	h.Reset()
	io.WriteString(h, id)
	var buf [sha256.Size]byte
	hex.Encode(sum[:], h.Sum(buf[:0])[:8])
	p.Put(h)
}
