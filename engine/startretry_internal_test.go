package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// A start's open of a replicated bucket answered "no suitable peers for
// placement" (10005), as a cluster whose meta leader is back before its
// other servers answers it, is asked again until it succeeds, and said
// once as what the start waits for; an error neither unanswered nor
// that ends it at once. Before, the 10005 of the effect key's bucket
// ended a reconciler started on a fresh cluster 3.6 s after a quorum
// was back (TestServeWaitsForAFreshClustersLeaders under load).
func TestRetryTransientAsksAgainWhileNoPeers(t *testing.T) {
	t.Parallel()
	noPeers := fmt.Errorf("effect key: bucket MESH_KEYS: %w",
		&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"})
	var noted []error
	ctx, cancel := context.WithTimeout(store.WithWaitNote(context.Background(), func(err error) { noted = append(noted, err) }), time.Minute)
	defer cancel()
	calls := 0
	err := retryTransient(ctx, func(context.Context) error {
		if calls++; calls <= 2 {
			return noPeers
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("retryTransient: %v after %d calls, want nil after 3", err, calls)
	}
	if len(noted) != 2 || !store.NoPeersYet(noted[0]) {
		t.Errorf("noted %v, want the two 10005s", noted)
	}

	final := errors.New("stream config mismatch")
	calls = 0
	if err := retryTransient(ctx, func(context.Context) error { calls++; return final }); err != final || calls != 1 {
		t.Errorf("retryTransient: %v after %d calls, want %v after 1", err, calls, final)
	}
}
