package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// retireNotes says, per node, when no agent of it runs (it holds no
// lease in the node lease bucket, store.OpenNodeLeases: an agent claims
// its node's key while it runs, and the key expires a TTL after the agent
// stops renewing it): a retirement without --force finishes only once the
// node's agent settles the empty plan, so without an agent it waits for
// ever, and the verb's exit 0 alone would say it was done. A node whose
// lease cannot be read gets no note.
func (a *app) retireNotes(ctx context.Context, js jetstream.JetStream, nodes []string) map[string]string {
	notes := map[string]string{}
	bucket := a.stream.config().WithDefaults().Name + store.NodeLeaseBucketSuffix
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return notes
	}
	for _, n := range nodes {
		if kv != nil {
			if _, err := kv.Get(ctx, n); !errors.Is(err, jetstream.ErrKeyNotFound) {
				continue // an agent holds it, or the read failed: nothing to say
			}
		}
		notes[n] = fmt.Sprintf("no agent of %s runs (no lease of it in bucket %s): the retirement finishes only once %s's agent settles the empty plan, stopping every module; until then 'meshfold fleet' lists %s as retiring ('meshfold state %s' says since when). Start its agent ('meshfold node %s'), or, if it is gone for good, forget it now: 'meshfold retire %s --force --by NAME'",
			n, bucket, n, n, n, n, n)
	}
	return notes
}
