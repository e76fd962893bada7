package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

// retireFleetNotes says, per node that the newest rollout of a fleet
// names (feed.Owners), that a rollout never undoes the retire: one that
// has not finished the node skips it (its status says retired, skipped)
// and gives it no want, new or previous; applying the fleet again, or a
// want, brings it back (DESIGN.md §9). Nodes no rollout names get no
// note, nor any when the stream cannot be read.
func (a *app) retireFleetNotes(ctx context.Context, js jetstream.JetStream, nodes []string) map[string]string {
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return nil
	}
	owners, err := feed.Owners(ctx, stream, scfg.Subjects(), "", nodes)
	if err != nil {
		return nil
	}
	notes := map[string]string{}
	for n, fleet := range owners {
		notes[n] = fmt.Sprintf("%s is a node of fleet %s (its newest rollout names it): a rollout never undoes a retire, so if that rollout has not finished %s it skips it and gives it no want ('meshfold rollout status %s' shows it retired, skipped); applying fleet %s again, or 'meshfold want %s', brings %s back",
			n, fleet, n, fleet, fleet, n, n)
	}
	return notes
}

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
