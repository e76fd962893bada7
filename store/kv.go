package store

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// jsClusterNoPeers is the JetStream API's error code for "no suitable
// peers for placement" (the server's JSClusterNoPeersErrF): a replicated
// bucket's creation while one of its servers is offline, as for a moment
// after a server's loss or restart. nats.go has no sentinel for it.
const jsClusterNoPeers = 10005

// errBucketRaced: a bucket's creation was answered "already in use" and
// its lookup right after "not found" (a creation asked again after one
// answered late, the cluster not yet showing it): asked again.
var errBucketRaced = errors.New("store: bucket in use, then not found")

// openKV looks the bucket of cfg up, creating it when missing and
// create is true, through [askAgain]: the lookup of a bucket whose
// leader's server was killed, and a creation (answered by the meta
// leader only) asked while there was none, are never answered, and a
// start that asked once ended on it ("lease bucket MESH_NODES: context
// deadline exceeded" after its whole 30 s). Asked again also while the
// creation finds no placement (10005, a server offline for a moment) or
// the bucket it was told exists is not found yet. A creation asked again
// after one answered late is answered "already in use" (10058) and
// adopted (CreateKV): success, not an error.
func openKV(ctx context.Context, js jetstream.JetStream, create bool, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return askAgain(ctx, js, "KV_"+cfg.Bucket, bucketAgain, func(ctx context.Context) (jetstream.KeyValue, error) {
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) && create {
			kv, err = CreateKV(ctx, js, cfg)
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				err = errBucketRaced
			}
		}
		return kv, err
	})
}

// OpenKV opens the bucket of cfg, creating it when missing, as the
// store's own buckets are opened ([OpenNodeLeases], [OpenSnapshots]):
// a lookup or creation unanswered (an election), a creation that finds
// no placement yet (10005), and a creation answered "already in use"
// whose lookup right after says "not found" (the cluster not yet showing
// the bucket) are asked again within ctx. An existing bucket is opened
// as it is.
//
// Errors: as [AskAgain]'s (a [*NoLeaderError] when ctx ends unanswered);
// the lookup's or creation's other errors.
func OpenKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return openKV(ctx, js, true, cfg)
}

// KVStatus returns kv's status (its stream's info), asked again within
// ctx while unanswered or answered "not found" (10059): right after a
// bucket's creation on a cluster, the server answering its stream's info
// may not know the stream yet, and a start that asked once ended on it
// ("lease bucket MESH_LEASES: … 10059 stream not found", load ~50). For a
// bucket just opened or created: one deleted meanwhile is asked for until
// ctx ends.
func KVStatus(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) (jetstream.KeyValueStatus, error) {
	return askAgain(ctx, js, "KV_"+kv.Bucket(), func(err error) bool {
		return Unanswered(err) || errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
	}, kv.Status)
}

// bucketAgain reports whether [openKV] asks again after err.
func bucketAgain(err error) bool {
	return Unanswered(err) || errors.Is(err, errBucketRaced) || NoPeersYet(err)
}

// NoPeersYet reports whether err is the JetStream API's "no suitable
// peers for placement" (10005) to a replicated stream's or bucket's
// creation: on a cluster just formed, before its peers are current, or
// with a server offline or restarting, it passes; a start asks again
// within its bound (on a cluster too small for the replicas asked, the
// bound's end says it).
func NoPeersYet(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsClusterNoPeers
}

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
