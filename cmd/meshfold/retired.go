package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// retiredNode is a node whose newest retire is newer than its newest
// want: retiring, or retired once it settled its empty plan (the fold's
// rule: only a later want brings such a node back, DESIGN.md §9).
type retiredNode struct {
	Node   string
	Retire uint64 // the retire's stream sequence
	By     string
	Want   uint64 // the node's newest want's sequence, 0 for none
}

// retiredNodes returns, in nodes' order, those of nodes that are retired
// or retiring (retiredNode): two direct gets a node, the newest retire
// and the newest want. A retire that does not decode is no retire (the
// fold refuses it too).
//
// Errors: the stream's lookup; a get that fails other than for no message.
func (a *app) retiredNodes(ctx context.Context, js jetstream.JetStream, nodes []string) ([]retiredNode, error) {
	stream, cfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return nil, err
	}
	var out []retiredNode
	for _, n := range nodes {
		rm, err := store.LastMsg(ctx, stream, cfg.Subjects(), n, events.KindRetire)
		if errors.Is(err, store.ErrNoMessage) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: read its retire: %w", n, err)
		}
		r, ok := rm.Event.Payload.(*events.Retire)
		if !ok {
			continue
		}
		var want uint64
		wm, err := store.LastMsg(ctx, stream, cfg.Subjects(), n, events.KindWant)
		switch {
		case err == nil:
			want = wm.Event.Seq
		case !errors.Is(err, store.ErrNoMessage):
			return nil, fmt.Errorf("node %s: read its want: %w", n, err)
		}
		if rm.Event.Seq > want {
			out = append(out, retiredNode{Node: n, Retire: rm.Event.Seq, By: r.By, Want: want})
		}
	}
	return out, nil
}

// dropRetired removes from nodes (--all's, every node with a want) the
// retired and retiring ones (retiredNodes) and says on stderr how many
// it skipped, naming them (the first few). Only the nodes that ever had
// a retire are read (the stream's subjects of kind retire): a fleet's
// --all costs nothing more when none was retired.
func (a *app) dropRetired(ctx context.Context, js jetstream.JetStream, kind events.Kind, nodes []string) ([]string, error) {
	stream, cfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return nil, err
	}
	ever, err := store.ListNodes(ctx, stream, cfg.Subjects(), events.KindRetire)
	if err != nil {
		return nil, err
	}
	var cand []string
	for _, n := range ever {
		if _, ok := slices.BinarySearch(nodes, n); ok {
			cand = append(cand, n)
		}
	}
	if len(cand) == 0 {
		return nodes, nil
	}
	retired, err := a.retiredNodes(ctx, js, cand)
	if err != nil || len(retired) == 0 {
		return nodes, err
	}
	skip := map[string]bool{}
	names := make([]string, 0, len(retired))
	for _, r := range retired {
		skip[r.Node] = true
		names = append(names, r.Node)
	}
	kept := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return skip[n] })
	const show = 10
	list := strings.Join(names[:min(len(names), show)], ", ")
	if len(names) > show {
		list += fmt.Sprintf(", … (%d more)", len(names)-show)
	}
	fmt.Fprintf(a.stderr, "note: --all skipped %s (retired or retiring: %s); no %s published to %s ('meshfold fleet --all' lists them)\n",
		plural(len(names), "retired node"), list, kind, map[bool]string{true: "it", false: "them"}[len(names) == 1])
	return kept, nil
}

// allVerbs are the verbs that take --all: those skip retired nodes
// under --all and refuse one named (refuseRetired). retire itself (a
// retiring node may be retired again, with --force), revoke, waive and
// ack (a retired node's warnings may still be read) act on any node.
var allVerbs = []events.Kind{events.KindPause, events.KindResume, events.KindPoke, events.KindApprove}

// refuseRetired refuses (exit 1, nothing published) a verb of allVerbs
// naming a node that is retired or retiring (retiredNodes), saying who
// retired it and how to bring it back.
func (a *app) refuseRetired(ctx context.Context, js jetstream.JetStream, kind events.Kind, nodes []string) error {
	if !slices.Contains(allVerbs, kind) {
		return nil
	}
	retired, err := a.retiredNodes(ctx, js, nodes)
	if err != nil || len(retired) == 0 {
		return err
	}
	r := retired[0]
	since := "it has no want"
	if r.Want != 0 {
		since = fmt.Sprintf("its newest want, #%d, is older", r.Want)
	}
	others := ""
	if len(nodes) > 1 {
		others = ", nor to the other nodes named"
	}
	return fmt.Errorf("node %s is retired (retire #%d by %s; %s): no %s published to it%s; a want brings it back ('meshfold want %s -f FILE'), and 'meshfold fleet --all' lists it",
		r.Node, r.Retire, events.Text(r.By), since, kind, others, r.Node)
}
