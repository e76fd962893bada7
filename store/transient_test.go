package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// What passes by itself, and what does not: every asynchronous publish
// pending at a reconnect fails with nats.ErrDisconnected, which passes
// (the rollout controller's drain skipped such an event); a closed
// connection never reopens.
func TestTransient(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("append x: %w", err) }
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nats.ErrDisconnected, true},
		{wrap(nats.ErrDisconnected), true},
		{nats.ErrConnectionReconnecting, true},
		{jetstream.ErrAsyncPublishTimeout, true},
		{jetstream.ErrNoStreamResponse, true},
		{nats.ErrNoResponders, true},
		{nats.ErrTimeout, true},
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, true},
		{nil, false},
		{nats.ErrConnectionClosed, false},
		{jetstream.ErrConnectionClosed, false},
		{nats.ErrPermissionViolation, false},
		{nats.ErrMaxPayload, false},
		{wrap(events.ErrInvalid), false},
		{store.ServerError(&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}), false},
		{context.Canceled, false},
	} {
		if got := store.Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
