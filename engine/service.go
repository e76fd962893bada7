package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// The state service's names and subjects (StateServiceName, StateSubject
// and the endpoints) are in package events, beside the stream's subjects:
// the credentials of package store/auth name them without linking the
// engine. Its client half is package query's (query.RequestState,
// query.RequestFold): readers link neither the loop nor Prometheus.

// StateServiceConfig configures [AddStateService]. Every field is
// optional.
type StateServiceConfig struct {
	// Prefix is the stream's subject prefix; default "mesh". It keeps the
	// subjects of two meshes on one NATS apart.
	Prefix string
	// Partial says this reconciler owns only some nodes (a partitioned
	// deployment): every instance then receives every request (no queue
	// group) and only the one whose lookup knows the node answers; an
	// unknown node gets no answer from the instances that do not own it,
	// and the client falls back to the snapshot after its timeout.
	// Without it, instances share a queue group and a lookup miss
	// answers 404 (query.ErrUnknownNode to the client).
	Partial bool
	// Unknown, in a Partial service, reports whether this instance owns
	// the node's partition and knows it holds no state of it
	// (Reconciler.Unknown): a lookup miss is then answered 404 at once,
	// as an unpartitioned service does. Nil: a Partial service never
	// answers a miss.
	Unknown func(node string) bool
	// StoreStatus, when set, answers the state endpoint's reserved name
	// store.StoreStatusName ($MESHFOLD.<prefix>.state._store) with what
	// the embedded server knows of its store: a write the store does not
	// answer leaves the client only a timeout, and this names the cause
	// (a fresh user's finding G1). Nil: {"watched": false}.
	StoreStatus func() store.StoreStatus
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
		Metadata:           map[string]string{"prefix": c.Prefix, events.MetaNamedOperators: "1", events.MetaNamedRollouts: "1"},
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
			if node == store.StoreStatusName && ep.name == events.EndpointState {
				// Every instance of a group answers (the first answer is
				// taken): one that watches no store says so at once, so
				// that fleet never waits out the ask.
				st := store.StoreStatus{}
				if c.StoreStatus != nil {
					st = c.StoreStatus()
				}
				_ = req.RespondJSON(st)
				return
			}
			if !events.ValidName(node) {
				_ = req.Error("400", fmt.Sprintf("node %q: %v", node, events.ErrBadName), nil)
				return
			}
			st, ok := lookup(node)
			if !ok || st == nil {
				if c.Partial && (c.Unknown == nil || !c.Unknown(node)) {
					return // another instance may own it
				}
				_ = req.Error("404", fmt.Sprintf("node %q: unknown: the reconciler has folded no event of it", node), nil)
				return
			}
			_ = req.RespondJSON(ep.body(st))
		}
		// A JetStream delivery steered onto the subject is dropped
		// (store.CoreRequestsOnly): answering it would ack another
		// role's consumer.
		err := grp.AddEndpoint(ep.name, store.CoreRequestsOnly(micro.HandlerFunc(h), nil), micro.WithEndpointSubject(ep.name+".*"),
			micro.WithEndpointMetadata(map[string]string{"description": ep.desc}))
		if err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("state service: endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}
