package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// A publish's API error, which nats.go wraps in "nats: %w", reads
// "nats: API error …" once, not "nats: nats: API error …" (a fresh user's
// finding V9), and still is the reply (errors.As, errors.Is); a duplicate
// in process (10158) is told apart from a failure.
func TestServerErrorSaysNatsOnce(t *testing.T) {
	t.Parallel()
	reply := &jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}
	wrapped := fmt.Errorf("nats: %w", reply) // as jetstream's PublishMsg returns it
	err := fmt.Errorf("append mesh.golf.agent: %w", store.ServerError(wrapped))
	if strings.Contains(err.Error(), "nats: nats:") || !strings.Contains(err.Error(), "append mesh.golf.agent: nats: API error: code=409 err_code=10158 description=duplicate message id is in process") {
		t.Errorf("error %q", err)
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr != reply {
		t.Errorf("error %v is not the reply", err)
	}
	if !store.DuplicateInProcess(err) {
		t.Errorf("DuplicateInProcess(%v) = false", err)
	}
	other := fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"})
	if store.DuplicateInProcess(other) || strings.Contains(store.ServerError(other).Error(), "nats: nats:") {
		t.Errorf("%v: DuplicateInProcess %v, text %q", other, store.DuplicateInProcess(other), store.ServerError(other))
	}
	if !errors.Is(store.ServerError(fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence})), store.ErrConflict) {
		t.Error("a wrong last sequence is no conflict")
	}
}
