package store

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// CreateKV creates the KV bucket of cfg, or opens it when another process
// created it meanwhile (two reconcilers, or a reconciler and a node agent,
// starting at once): the create that loses the race adopts the winner's
// bucket, whose configuration wins.
//
// Errors: the creation's or the lookup's, unwrapped.
func CreateKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, cfg.Bucket)
	}
	return kv, err
}
