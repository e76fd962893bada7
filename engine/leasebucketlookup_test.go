package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// unansweredLookup is a JetStream context whose lookups of one stream
// are never answered, as every server of a cluster leaves a stream's
// info unanswered while the group of that stream, just created, elects
// its first leader.
type unansweredLookup struct {
	jetstream.JetStream
	stream string
}

func (u unansweredLookup) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if name == u.stream {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return u.JetStream.Stream(ctx, name)
}

// The lease bucket's open is not held by its configuration's lookup,
// sent beside it, when that goes unanswered: the status is asked for
// instead. The lookup was waited for under the open's whole bound, and a
// second reconciler started beside the one creating the bucket ended its
// start 30 s later, its status ask left 1 ms ("stream KV_MESH_LEASES did
// not answer within 1ms", CI, TestAgentLivenessAcrossAQuorumLoss; the
// lookup unanswered for 30 s while the open took 249 ms was seen on a
// 3-server cluster). Created, then opened as it is.
func TestLeaseBucketOpenNotHeldByAnUnansweredLookup(t *testing.T) {
	t.Parallel()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	u := unansweredLookup{js, "KV_" + cfg.Name + LeaseBucketSuffix}
	for _, what := range []string{"created", "opened"} {
		// The bound is the test's, far above what either takes: the
		// lookup waited for, the open failed once it ended.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, ttl, err := openLeaseBucket(ctx, u, cfg, 15*time.Second, slog.New(slog.DiscardHandler))
		cancel()
		if err != nil || ttl != 15*time.Second {
			t.Fatalf("%s, its lookup unanswered: TTL %s, %v; want 15s and no error", what, ttl, err)
		}
	}
}

// A status ask that ended unanswered, after asks that took the start's
// time before it, says the start's whole wait, not its own remnant.
func TestWaitedSinceSaysTheWholeWait(t *testing.T) {
	t.Parallel()
	last := &store.NoLeaderError{Stream: "KV_MESH_LEASES", Err: context.DeadlineExceeded, Waited: time.Millisecond}
	err := waitedSince(last, time.Now().Add(-30*time.Second))
	if !strings.Contains(err.Error(), "within 30s") || !errors.Is(err, store.ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v: want it to say within 30s, matching ErrNoLeader and the last error", err)
	}
	if other := errors.New("denied"); waitedSince(other, time.Now()) != other {
		t.Fatal("another error changed")
	}
}
