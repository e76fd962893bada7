package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// The state service's names and subjects (StateServiceName, StateSubject
// and the endpoints) are in package events, beside the stream's subjects:
// the credentials of package store/auth name them without linking the
// engine.

// Errors of the state service's client side.
var (
	// ErrUnknownNode: the reconciler answered that it has folded no event
	// of that node (micro error 404).
	ErrUnknownNode = errors.New("engine: unknown node: the reconciler has folded no event of it")
	// ErrNoReconciler: no reconciler answered (no responders, or none in
	// time).
	ErrNoReconciler = errors.New("engine: no reconciler answered")
)

// StateServiceConfig configures [AddStateService]. Every field is
// optional.
type StateServiceConfig struct {
	// Prefix is the stream's subject prefix; default "mesh". It keeps the
	// subjects of two meshes on one NATS apart.
	Prefix string
	// Partial says this reconciler owns only some nodes (a partitioned
	// deployment): every instance then receives every request (no queue
	// group) and only the one whose lookup knows the node answers; an
	// unknown node gets no answer, and the client falls back to the
	// snapshot. Without it, instances share a queue group and a lookup
	// miss answers 404.
	Partial bool
}

// AddStateService starts the state service on nc. lookup returns a node's
// current folded state, or false when the node is unknown; it is called
// from the service's subscription goroutines, concurrently, and must
// return a state the service may read without locks (a copy, as
// Reconciler.Node returns). Stop the returned service, or close nc, to end
// it.
//
// Errors: a bad prefix; the micro service failing to start.
func AddStateService(nc *nats.Conn, lookup func(node string) (*reconcile.State, bool), c StateServiceConfig) (micro.Service, error) {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if !events.ValidPrefix(c.Prefix) {
		return nil, fmt.Errorf("state service: prefix %q: %w", c.Prefix, events.ErrBadName)
	}
	if lookup == nil {
		return nil, errors.New("state service: lookup is nil")
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:               events.StateServiceName,
		Version:            events.StateServiceVersion,
		Description:        "meshfold: each node's folded state and composition, read-only",
		Metadata:           map[string]string{"prefix": c.Prefix},
		QueueGroupDisabled: c.Partial,
	})
	if err != nil {
		return nil, fmt.Errorf("state service: %w", err)
	}
	grp := svc.AddGroup(events.StateSubjectRoot + "." + c.Prefix)
	for _, ep := range []struct {
		name string
		body func(*reconcile.State) any
		desc string
	}{
		{events.EndpointState, func(s *reconcile.State) any { return s.View() }, "reconcile.View of the node named by the last token"},
		{events.EndpointComposition, func(s *reconcile.State) any { return reconcile.CompositionOf(s) }, "the last plan emitted for the node, row by row"},
		{events.EndpointFold, func(s *reconcile.State) any { return s }, "the node's whole folded state (the snapshot form), for dry runs"},
	} {
		h := func(req micro.Request) {
			subj := req.Subject()
			node := subj[strings.LastIndexByte(subj, '.')+1:]
			if !events.ValidName(node) {
				_ = req.Error("400", fmt.Sprintf("node %q: %v", node, events.ErrBadName), nil)
				return
			}
			st, ok := lookup(node)
			if !ok || st == nil {
				if c.Partial {
					return // another instance may own it
				}
				_ = req.Error("404", fmt.Sprintf("node %q: %v", node, ErrUnknownNode), nil)
				return
			}
			_ = req.RespondJSON(ep.body(st))
		}
		err := grp.AddEndpoint(ep.name, micro.HandlerFunc(h), micro.WithEndpointSubject(ep.name+".*"),
			micro.WithEndpointMetadata(map[string]string{"description": ep.desc}))
		if err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("state service: endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}

// RequestState asks the state service for node's view and composition.
// timeout bounds each of the two requests (0: 2 s).
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
		timeout = 2 * time.Second
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
// the request (0: 2 s).
//
// Errors: as [RequestState]; a state whose invariants do not hold.
func RequestFold(ctx context.Context, nc *nats.Conn, prefix, node string, timeout time.Duration) (*reconcile.State, error) {
	if !events.ValidName(node) {
		return nil, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
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
		return fmt.Errorf("%s: service error %s: %s", subject, code, desc)
	}
	if err := json.Unmarshal(msg.Data, into); err != nil {
		return fmt.Errorf("%s: decode reply: %w", subject, err)
	}
	return nil
}
