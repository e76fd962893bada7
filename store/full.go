package store

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrStorageFull: the server refused to store a message or create an
// asset because its data directory is full or its storage limit is
// reached. An error from [StorageFullError] matches it and still
// matches the server's own error (a *jetstream.APIError, a 503 that
// [Unanswered] counts: the reconciler rides it out until space is back).
var ErrStorageFull = errors.New("the server cannot store: its data directory is full (or its storage limit reached)")

// The server's error codes that say it has no room (nats-server's
// jetstream_errors_generated.go; nats.go has no sentinel for them):
// 10023 "insufficient resources" (503: the server's max_file_store,
// which an embedded server sets at start to 75 % of the free disk, is
// used up), 10047 "insufficient storage resources available" (creating
// a stream or bucket), 10002 "resource limits exceeded for account".
const (
	errCodeInsufficientResources = 10023
	errCodeStorageResources      = 10047
	errCodeAccountResources      = 10002
)

type storageFullError struct {
	err  error
	what string
}

func (e *storageFullError) Error() string {
	return fmt.Sprintf("%v: %s (the server's answer); free space under the server's data directory "+
		"(meshfold serve takes writes again by itself once there is room; see docs/operations.md, \"Disk full\")",
		ErrStorageFull, e.what)
}

func (e *storageFullError) Unwrap() []error { return []error{ErrStorageFull, e.err} }

// StorageFullError returns err, wrapped so that it says in words that
// the server cannot store (and matches [ErrStorageFull]), when err is the
// server's refusal for lack of room: the one place that reads those
// refusals. Any other err is returned as is.
func StorageFullError(err error) error {
	if err == nil || errors.Is(err, ErrStorageFull) {
		return err
	}
	var code, status int
	var desc string
	var apiErr *jetstream.APIError
	var legacy *nats.APIError
	switch {
	case errors.As(err, &apiErr):
		code, status, desc = int(apiErr.ErrorCode), apiErr.Code, apiErr.Description
	case errors.As(err, &legacy):
		code, status, desc = int(legacy.ErrorCode), legacy.Code, legacy.Description
	default:
		return err
	}
	switch code {
	case errCodeInsufficientResources, errCodeStorageResources, errCodeAccountResources:
		return &storageFullError{err: err, what: fmt.Sprintf("%s, code %d, err_code %d", desc, status, code)}
	}
	return err
}
