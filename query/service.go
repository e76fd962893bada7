package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// Errors of the state service's client, and of a [Reader].
var (
	// ErrUnknownNode: nothing is known of the node: the reconciler
	// answered that it has folded no event of it (micro error 404), or,
	// with no reconciler answering, neither a snapshot nor the stream
	// holds it.
	ErrUnknownNode = errors.New("query: unknown node: the reconciler has folded no event of it")
	// ErrNoReconciler: no reconciler's state service answered (no
	// responders, or none in time).
	ErrNoReconciler = errors.New("query: no reconciler answered")
)

// DefaultTimeout bounds a request to the state service when none is given.
const DefaultTimeout = 2 * time.Second

// RequestState asks the reconciler's state service (engine.AddStateService,
// subjects events.StateSubject under prefix) for node's view and
// composition. timeout bounds each of the two requests (0: [DefaultTimeout]).
//
// Errors: [ErrNoReconciler] when no service answers; [ErrUnknownNode]
// when it answers 404; a bad node name (matching events.ErrInvalid);
// another service error or an undecodable reply otherwise.
func RequestState(ctx context.Context, nc *nats.Conn, prefix, node string, timeout time.Duration) (reconcile.View, reconcile.Composition, error) {
	var v reconcile.View
	var c reconcile.Composition
	if !events.ValidName(node) {
		return v, c, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if err := request(ctx, nc, events.StateSubject(prefix, events.EndpointState, node), timeout, &v); err != nil {
		return v, c, err
	}
	if err := request(ctx, nc, events.StateSubject(prefix, events.EndpointComposition, node), timeout, &c); err != nil {
		return v, c, err
	}
	return v, c, nil
}

// RequestFold asks the state service for node's whole folded state (what
// a dry run composes from), with its invariants checked. timeout bounds
// the request (0: [DefaultTimeout]).
//
// Errors: as [RequestState]; a state whose invariants do not hold.
func RequestFold(ctx context.Context, nc *nats.Conn, prefix, node string, timeout time.Duration) (*reconcile.State, error) {
	if !events.ValidName(node) {
		return nil, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	var raw json.RawMessage
	if err := request(ctx, nc, events.StateSubject(prefix, events.EndpointFold, node), timeout, &raw); err != nil {
		return nil, err
	}
	return reconcile.UnmarshalState(raw)
}

func request(ctx context.Context, nc *nats.Conn, subject string, timeout time.Duration, into any) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subject, nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil, errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("%s: %w", subject, ErrNoReconciler)
	case err != nil:
		return fmt.Errorf("%s: %w", subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		desc := msg.Header.Get(micro.ErrorHeader)
		if code == "404" {
			return fmt.Errorf("%s: %w", subject, ErrUnknownNode)
		}
		return &serviceError{subject: subject, code: code, desc: desc}
	}
	if err := json.Unmarshal(msg.Data, into); err != nil {
		return fmt.Errorf("%s: decode reply: %w", subject, err)
	}
	return nil
}

// RequestStoreStatus asks the state service what serve's embedded server
// knows of its store (store.StoreStatus, on the state endpoint's reserved
// name store.StoreStatusName): whether it takes writes, since when not,
// and why. timeout bounds the request (0: [DefaultTimeout]). A reconciler
// on an external server, or of a build before it (which answers 400, a
// bad node name), knows nothing: the status is then the zero one
// (Watched false), with no error.
//
// Errors: [ErrNoReconciler] when no service answers; another service
// error or an undecodable reply.
func RequestStoreStatus(ctx context.Context, nc *nats.Conn, prefix string, timeout time.Duration) (store.StoreStatus, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	var s store.StoreStatus
	err := request(ctx, nc, events.StateSubject(prefix, events.EndpointState, store.StoreStatusName), timeout, &s)
	var se *serviceError
	if errors.As(err, &se) && se.code == "400" {
		return store.StoreStatus{}, nil
	}
	return s, err
}

// serviceError is a state service's error reply other than 404.
type serviceError struct {
	subject, code, desc string
}

func (e *serviceError) Error() string {
	return fmt.Sprintf("%s: service error %s: %s", e.subject, e.code, e.desc)
}
