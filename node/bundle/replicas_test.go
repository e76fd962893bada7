package bundle_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// On a cluster the builds bucket the first push creates has as many
// replicas as its stream: at one replica, a server's loss stopped every
// want (their builds are checked) and every fetch of a build not cached,
// though the stream kept its quorum (a fresh user's finding G5).
func TestBucketHasItsStreamsReplicas(t *testing.T) {
	_, _, js, _, cfg := storetest.StartClusterStream(t, 3, store.StreamConfig{Replicas: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := bundle.NewStore(js, cfg.Name)
	if err := st.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, st.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	status, err := obs.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := status.Replicas(); got != 3 {
		t.Errorf("bucket %s has %d replicas; its stream %s has 3", st.Bucket(), got, cfg.Name)
	}
}
