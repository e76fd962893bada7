package store

import (
	"errors"
	"fmt"
	"strings"
	"time"

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
	err    error
	what   string
	source string // whose answer what is; "" is the server's refusal
}

func (e *storageFullError) Error() string {
	source := e.source
	if source == "" {
		source = "the server's answer"
	}
	return fmt.Sprintf("%v: %s (%s); free space under the server's data directory "+
		"(meshfold serve takes writes again by itself once there is room; see docs/operations.md, \"Disk full\")",
		ErrStorageFull, e.what, source)
}

func (e *storageFullError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrStorageFull}
	}
	return []error{ErrStorageFull, e.err}
}

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

// StoreStatus is what an embedded server's watch of its data directory
// knows of its store (meshfold serve; store/embedded), as the state
// service answers it on events.StateSubject(prefix, events.EndpointState,
// [StoreStatusName]): the only way a client learns why its write went
// unanswered, since a file store that failed a write ("no space left on
// device") keeps that error and answers no later write (nats-server
// 2.15: no refusal is sent, the client times out). JSON; no path, no
// secret.
type StoreStatus struct {
	// Watched: the server answering watches its store (serve's embedded
	// server). False: a reconciler on an external nats-server, which
	// knows nothing of its disk; the other fields are then zero.
	Watched bool `json:"watched"`
	// Stores: JetStream takes writes. False from Since on.
	Stores bool `json:"stores"`
	// Since is when the store stopped taking writes (zero while Stores).
	Since time.Time `json:"since,omitzero"`
	// Why says why, in words: "the filesystem has no room", "the store
	// is past the server's storage limit …", "the server disabled
	// JetStream …", or a file store's kept write error.
	Why string `json:"why,omitempty"`
	// Refusing names the streams and buckets whose file store holds a
	// write error (MESH, KV_MESH_NODES …): none of them stores or
	// answers a write until serve opens them again.
	Refusing []string `json:"refusing,omitempty"`
}

// StoreStatusName is the state service's reserved last token that asks
// for the [StoreStatus] instead of a node's state: no node can be named
// it (a name starts with a letter or digit), so a build before it answers
// 400 (a bad node name) and an operator's credentials that may ask a
// node's state may ask it.
const StoreStatusName = "_store"

// Err returns nil while the store takes writes, else an error matching
// [ErrStorageFull] that says since when and why, for a write that went
// unanswered (err, which it wraps too; may be nil):
//
//	the server cannot store: its data directory is full (or its storage limit reached): serve's store has taken no write since 17:53:14 UTC (4m10s): the filesystem has no room (MESH, KV_MESH_NODES refuse every write) (serve's answer); free space under …
func (s StoreStatus) Err(err error, now time.Time) error {
	if !s.Watched || s.Stores {
		return nil
	}
	return &storageFullError{err: err, what: s.said(now), source: "serve's answer"}
}

// said is what the status says of a store that takes no write: "serve's
// store has taken no write since 17:53:14 UTC (4m10s): the filesystem has
// no room (MESH, KV_MESH_NODES refuse every write)".
func (s StoreStatus) said(now time.Time) string {
	what := "serve's store takes no write"
	if !s.Since.IsZero() {
		what = fmt.Sprintf("serve's store has taken no write since %s (%s ago)", s.Since.UTC().Format("15:04:05 MST"),
			max(now.Sub(s.Since), 0).Round(time.Second))
	}
	if s.Why != "" {
		what += ": " + s.Why
	}
	if len(s.Refusing) > 0 {
		verb := " refuse every write)"
		if len(s.Refusing) == 1 {
			verb = " refuses every write)"
		}
		what += " (" + strings.Join(s.Refusing, ", ") + verb
	}
	return what
}

// Headline returns "" while the store takes writes (or is not watched),
// else the line fleet and the console's fleet page open with: what
// stopped, since when, why, what it means and what to do (a fresh user's
// finding G1: the stream took no write for 10 minutes while fleet said
// all was well):
//
//	serve's store has taken no write since 17:53:14 UTC (11m3s): the filesystem has no room (MESH refuses every write): no want, have, plan, lease or snapshot is stored until it has room, so what follows may be older than the fleet; free space under serve's --data (serve takes writes again by itself; docs/operations.md, "Disk full")
func (s StoreStatus) Headline(now time.Time) string {
	if !s.Watched || s.Stores {
		return ""
	}
	return s.said(now) + ": no want, have, plan, lease or snapshot is stored until it has room, so what follows may be older than the fleet; " +
		"free space under serve's --data (serve takes writes again by itself; docs/operations.md, \"Disk full\")"
}
