package store

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Effect message ids: the reconciler signs each effect's id so that no
// other publisher can take it first (docs/architecture.md, "Exactly-once
// effects"). The key lives in the snapshot bucket, which nodes and
// provisioners cannot read.

// effectKeyName is the snapshot bucket's key holding the reconciler's
// effect-id key.
const effectKeyName = "effect-key"

// EffectKey returns the key that signs the reconciler's effect message
// ids (see [EffectMsgID]), creating it (32 random bytes) on first use.
// Every reconciler of the stream shares it; roles without read access to
// the snapshot bucket (nodes, provisioners) cannot learn it.
//
// Errors: the bucket's errors; a stored key of the wrong size.
func (s *Snapshots) EffectKey(ctx context.Context) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("effect key: %w", err)
	}
	if _, err := s.kv.Create(ctx, effectKeyName, key); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("effect key: %w", err)
	}
	e, err := s.kv.Get(ctx, effectKeyName)
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
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	return id + "." + hex.EncodeToString(h.Sum(nil))[:16]
}

// EffectIDOf checks a message id made by [EffectMsgID] and returns the
// effect id it carries; ok is false for any other id, a forged one
// included.
func EffectIDOf(key []byte, msgID string) (id string, ok bool) {
	i := strings.LastIndexByte(msgID, '.')
	if i < 0 {
		return "", false
	}
	id = msgID[:i]
	return id, hmac.Equal([]byte(EffectMsgID(key, id)), []byte(msgID))
}
