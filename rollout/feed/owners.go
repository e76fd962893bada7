package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// Owners returns, for each of nodes that the newest rollout of a fleet
// other than fleet names (its start and the start's pages, DESIGN.md
// §11: a fleet file names the nodes a fleet owns), that fleet: what
// apply refuses to roll over unless told to take the nodes over. A node
// two other fleets name is given the first in name order. Nodes no other
// fleet names are absent; nil when none is named.
//
// Errors: the stream's reads.
func Owners(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet string, nodes []string) (map[string]string, error) {
	want := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		want[n] = true
	}
	fleets, err := Fleets(ctx, stream, subj)
	if err != nil {
		return nil, err
	}
	var out map[string]string
	for _, f := range fleets {
		if f == fleet {
			continue
		}
		named, err := rolloutNodes(ctx, stream, subj, f)
		if err != nil {
			return nil, err
		}
		for _, n := range named {
			if !want[n] {
				continue
			}
			if _, ok := out[n]; ok {
				continue
			}
			if out == nil {
				out = map[string]string{}
			}
			out[n] = f
		}
	}
	return out, nil
}

// rolloutNodes returns the nodes fleet's newest rollout names: its
// start's and its pages'.
func rolloutNodes(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet string) ([]string, error) {
	_, nodes, err := StartNodes(ctx, stream, subj, fleet)
	var out []string
	for _, n := range nodes {
		out = append(out, n.Node)
	}
	return out, err
}

// StartNodes returns fleet's newest rollout (its start's sequence, 0
// when there is none) and the nodes it names as its start and the
// start's pages hold them (read forward from the start on the fleet's
// nodes subject), in their order. A page not (yet) stored is skipped;
// an unreadable start names no node (the fold skips it too).
//
// Errors: the stream's reads.
func StartNodes(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet string) (uint64, []rollout.NodeAtStart, error) {
	m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout(fleet, string(rollout.KindStart)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("newest start of %s: %w", fleet, err)
	}
	var st rollout.Start
	if err := json.Unmarshal(m.Data, &st); err != nil {
		return m.Sequence, nil, nil
	}
	out := st.Nodes
	id, seen := m.Sequence, 1
	pagesSubj := subj.Rollout(fleet, string(rollout.KindNodes))
	for seq := id + 1; seen < st.Pages; {
		pm, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(pagesSubj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return 0, nil, fmt.Errorf("pages of %s's rollout %d: %w", fleet, id, err)
		}
		seq = pm.Sequence + 1
		var p rollout.Nodes
		if json.Unmarshal(pm.Data, &p) != nil || p.Rollout != id {
			continue
		}
		seen++
		out = append(out, p.Nodes...)
	}
	return id, out, nil
}
