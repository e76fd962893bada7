package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// A transition another instance of the group is recording at the same
// moment (the server's "duplicate message id is in process") is logged
// at debug, not as a warning (a fresh user's finding V9); other failures
// still warn.
func TestAgentLivenessFailLevel(t *testing.T) {
	t.Parallel()
	dup := fmt.Errorf("append mesh.golf.agent: %w", store.ServerError(fmt.Errorf("nats: %w",
		&jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"})))
	if got := failLevel(dup); got != slog.LevelDebug {
		t.Errorf("failLevel(%v) = %v, want debug", dup, got)
	}
	if got := failLevel(errors.New("append mesh.golf.agent: context deadline exceeded")); got != slog.LevelWarn {
		t.Errorf("failLevel of a timeout = %v, want warn", got)
	}
}
