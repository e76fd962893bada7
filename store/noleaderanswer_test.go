package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// A read's raw "no leader" answer (503, error code 10008) is said as the
// verbs' ride-outs say it; any other error is left as it is.
func TestNoLeaderAnswer(t *testing.T) {
	t.Parallel()
	raw := fmt.Errorf("read summaries of MESH_SNAPSHOTS: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"})
	err := store.NoLeaderAnswer("KV_MESH_SNAPSHOTS", raw)
	if !errors.Is(err, store.ErrNoLeader) || !strings.Contains(err.Error(), "stream KV_MESH_SNAPSHOTS has no leader") || !strings.Contains(err.Error(), "try again in a few seconds") {
		t.Errorf("NoLeaderAnswer(503 10008) = %v", err)
	}
	other := errors.New("bucket not found")
	if got := store.NoLeaderAnswer("KV_MESH_SNAPSHOTS", other); got != other {
		t.Errorf("NoLeaderAnswer(another error) = %v, want it unchanged", got)
	}
	if store.NoLeaderAnswer("X", nil) != nil {
		t.Error("NoLeaderAnswer(nil) is not nil")
	}
}
