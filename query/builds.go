package query

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

// MissingBuilds returns, in the want's order, each module of w whose
// build no node could run: a build of no build's form
// (bundle.CheckForm: no scheme, or a malformed sha256 build), or a
// bundle build (sha256:…) the builds bucket does not hold, since a node
// agent could not fetch it (DESIGN.md §8). Other runtimes' builds
// ("img:…") are not checked further. It reads bundles' metadata only,
// and no bucket at all when every build is malformed or another
// runtime's.
//
// Errors: a malformed build is reported as missing with an error
// matching bundle.ErrBadBuild (bundle.ErrNoScheme when it has no
// scheme); the server's other errors are returned.
func (r *Reader) MissingBuilds(ctx context.Context, w *events.Want) ([]MissingBuild, error) {
	st := bundle.NewStore(r.js, r.c.Stream.Name)
	var out []MissingBuild
	seen := map[string]bool{}
	for _, m := range w.Modules {
		if seen[m.Build] {
			continue
		}
		seen[m.Build] = true
		if err := bundle.CheckForm(m.Build); err != nil {
			out = append(out, MissingBuild{Module: m.Name, Build: m.Build, Err: err})
			continue
		}
		if !strings.HasPrefix(m.Build, bundle.BuildScheme) {
			continue
		}
		// Asked again while unanswered (a builds bucket electing a
		// leader after a kill -9 of the server that led it), each ask
		// bounded: one ask of the dead leader waited out the verb's
		// whole --timeout (a fresh user's finding).
		_, err := store.RideOut(ctx, st.Bucket(), func(ctx context.Context) (bundle.Info, error) {
			return st.Stat(ctx, m.Build)
		})
		switch {
		case err == nil:
		case errors.Is(err, bundle.ErrNotFound), errors.Is(err, bundle.ErrNoBucket), errors.Is(err, bundle.ErrBadBuild):
			out = append(out, MissingBuild{Module: m.Name, Build: m.Build, Err: err})
		default:
			return nil, err
		}
	}
	return out, nil
}

// MissingBuild is a module whose build no node could run, and why
// (bundle.ErrNotFound, bundle.ErrNoBucket or bundle.ErrBadBuild).
type MissingBuild struct {
	Module string
	Build  string
	Err    error
}

// Builds returns every bundle the builds bucket holds, newest first
// (bundle.Store.List; none when there is no bucket).
//
// Errors: the server's.
func (r *Reader) Builds(ctx context.Context) ([]bundle.Info, error) {
	return bundle.NewStore(r.js, r.c.Stream.Name).List(ctx)
}

// BuildUse is who still names a bundle build (DESIGN.md §8): what
// `meshfold build rm` must not remove without being told, since a node
// that has not cached it could no longer fetch it ("no such bundle").
type BuildUse struct {
	Build string
	// Wants are the nodes whose newest want names the build, sorted. A
	// node retired since its newest want is not counted: it runs nothing,
	// and a want brings it back.
	Wants []string
	// Runs are the nodes whose newest have lists a module at the build
	// (running, failed or stopped), sorted; retired nodes aside too.
	Runs []string
	// Reverts are the fleets whose newest rollout would give nodes a
	// previous want naming the build on a revert (rollout.State.GivesBack),
	// by fleet.
	Reverts []RevertUse
	// Steps are the fleets whose newest rollout, still able to step
	// (loading, running or waiting for a promote), has yet to give nodes
	// a new want naming the build (a target pending, or whose want is not
	// recorded published), by fleet: removed, those steps would fail to
	// fetch it. A rollout no controller has stepped yet names its build
	// in no node's want.
	Steps []RevertUse
	// Snapshots is true when the stream no longer holds its oldest events
	// (an age or size limit): the nodes whose newest want or have went
	// with them were read from their stored snapshots, as fresh as the
	// reconciler's last checkpoint.
	Snapshots bool
	// Last is the stream's last sequence as the check began: what was
	// published after it the check may not have seen ([Reader.NamedSince]).
	Last uint64
}

// RevertUse is a rollout a revert of which would give Nodes their
// previous want, one naming the build ([BuildUse.Reverts]), or one whose
// next steps would give Nodes a new want naming it ([BuildUse.Steps]).
type RevertUse struct {
	Fleet   string
	Rollout uint64
	Phase   rollout.Phase
	Nodes   []string
}

// InUse reports whether anything names the build.
func (u BuildUse) InUse() bool {
	return len(u.Wants) > 0 || len(u.Runs) > 0 || len(u.Reverts) > 0 || len(u.Steps) > 0
}

// BuildUse returns who names build now: each node's newest want and have
// and retire, read from the stream in one pass per kind that delivers
// only the newest message of each node (store.LastPerSubject; a message
// is decoded only when its bytes hold the build), and each fleet's
// newest rollout: the previous wants of its targets (read in one pass
// over the wants between the oldest and the newest of them), and, when
// one names the build, the rollout refolded (feed.Replay) to learn which
// of them a revert would still give back, or when its start's wants name
// it, which targets its next steps would still give it (BuildUse.Steps).
// When the stream's oldest
// events are gone (an age or size limit), the snapshots of the nodes
// none of whose wants, or haves, the stream holds are read too
// (BuildUse.Snapshots).
//
// Errors: build not a bundle build (bundle.ErrNotBundle, ErrBadBuild);
// the stream's lookup and reads.
func (r *Reader) BuildUse(ctx context.Context, build string) (BuildUse, error) {
	u := BuildUse{Build: build}
	if _, err := bundle.ParseBuild(build); err != nil {
		return u, err
	}
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return u, err
	}
	subj := cfg.Subjects()
	first, last, err := store.StreamBounds(ctx, stream)
	if err != nil {
		return u, err
	}
	u.Snapshots, u.Last = first > 1, last
	needle := []byte(build)
	names := func(subject string, seq uint64, data []byte) (string, bool) {
		node, _, err := subj.Parse(subject)
		if err != nil || !bytes.Contains(data, needle) {
			return node, false
		}
		ev, err := subj.DecodeEvent(subject, data, seq, time.Time{})
		if err != nil {
			return node, false
		}
		switch p := ev.Payload.(type) {
		case *events.Want:
			return node, slices.ContainsFunc(p.Modules, func(m events.WantModule) bool { return m.Build == build })
		case *events.Have:
			return node, slices.ContainsFunc(p.Modules, func(m events.HaveModule) bool { return m.Build == build })
		}
		return node, false
	}
	// Retires first (few): a node's newest want is then kept only for
	// the nodes that have one, to tell a retired node.
	retired := map[string]uint64{}
	for _, f := range []string{subj.StoredKind(events.KindRetire), subj.StoredNamedKind(events.KindRetire)} {
		if err := store.LastPerSubject(ctx, r.js, cfg.Name, f, func(subject string, seq uint64, _ []byte) error {
			if node, _, err := subj.Parse(subject); err == nil {
				retired[node] = max(retired[node], seq)
			}
			return nil
		}); err != nil {
			return u, err
		}
	}
	wantSeq := map[string]uint64{}
	wants, runs := map[string]bool{}, map[string]bool{}
	var seenWant, seenHave map[string]bool // with Snapshots only
	if u.Snapshots {
		seenWant, seenHave = map[string]bool{}, map[string]bool{}
	}
	if err := store.LastPerSubject(ctx, r.js, cfg.Name, subj.StoredKind(events.KindWant), func(subject string, seq uint64, data []byte) error {
		node, ok := names(subject, seq, data)
		if _, r := retired[node]; r {
			wantSeq[node] = seq
		}
		if seenWant != nil {
			seenWant[node] = true
		}
		if ok {
			wants[node] = true
		} else {
			delete(wants, node) // a newer want, published during the pass
		}
		return nil
	}); err != nil {
		return u, err
	}
	if err := store.LastPerSubject(ctx, r.js, cfg.Name, subj.StoredKind(events.KindHave), func(subject string, seq uint64, data []byte) error {
		node, ok := names(subject, seq, data)
		if seenHave != nil {
			seenHave[node] = true
		}
		if ok {
			runs[node] = true
		} else {
			delete(runs, node)
		}
		return nil
	}); err != nil {
		return u, err
	}
	if u.Snapshots {
		if err := r.snapshotUse(ctx, build, seenWant, seenHave, wants, runs); err != nil {
			return u, err
		}
	}
	for node, seq := range retired {
		if seq > wantSeq[node] {
			delete(wants, node)
			delete(runs, node)
		}
	}
	u.Wants, u.Runs = slices.Sorted(maps.Keys(wants)), slices.Sorted(maps.Keys(runs))
	u.Reverts, u.Steps, err = r.rolloutUse(ctx, build)
	return u, err
}

// snapshotUse adds to wants and runs the nodes whose stored snapshot's
// want or have names build, of those whose want (have) the stream no
// longer holds.
func (r *Reader) snapshotUse(ctx context.Context, build string, seenWant, seenHave, wants, runs map[string]bool) error {
	snaps, err := r.snapshots(ctx)
	if errors.Is(err, ErrNoSnapshots) {
		return nil
	}
	if err != nil {
		return err
	}
	needle := []byte(build)
	return snaps.LoadAll(ctx, func(node string, data []byte) error {
		if !bytes.Contains(data, needle) {
			return nil
		}
		st, err := reconcile.UnmarshalStateShared(data)
		if err != nil {
			return nil
		}
		if st.Retire != nil && (st.Want == nil || st.Retire.Seq > st.Want.Seq) {
			return nil
		}
		if st.Want != nil && !seenWant[node] && slices.ContainsFunc(st.Want.Modules, func(m events.WantModule) bool { return m.Build == build }) {
			wants[node] = true
		}
		if st.Have != nil && !seenHave[node] && slices.ContainsFunc(st.Have.Modules, func(m events.HaveModule) bool { return m.Build == build }) {
			runs[node] = true
		}
		return nil
	})
}

// rolloutUse returns the fleets whose newest rollout would give nodes a
// previous want naming build on a revert (reverts), and those whose
// newest rollout has yet to step nodes to a new want naming it (steps).
func (r *Reader) rolloutUse(ctx context.Context, build string) (reverts, steps []RevertUse, err error) {
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	subj := cfg.Subjects()
	fleets, err := feed.Fleets(ctx, stream, subj)
	if err != nil {
		return nil, nil, err
	}
	type target struct{ fleet, node string }
	prevs := map[uint64][]target{}
	var lo, hi uint64
	// forward: the fleets whose newest start gives a want naming build.
	forward := map[string]bool{}
	needle := []byte(build)
	for _, f := range fleets {
		m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout(f, string(rollout.KindStart)))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return nil, nil, fmt.Errorf("newest start of %s: %w", f, err)
		case bytes.Contains(m.Data, needle):
			var st rollout.Start
			if json.Unmarshal(m.Data, &st) == nil && slices.ContainsFunc(st.Wants, func(w []events.WantModule) bool { return wantNames(w, build) }) {
				forward[f] = true
			}
		}
		_, nodes, err := feed.StartNodes(ctx, stream, subj, f)
		if err != nil {
			return nil, nil, err
		}
		for _, n := range nodes {
			back := n.RevertTo() // the want a revert gives back
			if n.Want == 0 || back == 0 {
				continue
			}
			prevs[back] = append(prevs[back], target{f, n.Node})
			if lo == 0 || back < lo {
				lo = back
			}
			hi = max(hi, back)
		}
	}
	// The previous wants naming build, by fleet, in one pass over the
	// wants from the oldest to the newest of them.
	hits := map[string]map[string]uint64{}
	if len(prevs) > 0 {
		err = store.ReadFilter(ctx, r.js, cfg.Name, subj, subj.StoredKind(events.KindWant), "previous wants", lo, hi, func(m store.Msg) error {
			ts, ok := prevs[m.Event.Seq]
			if !ok {
				return nil
			}
			w, ok := m.Event.Payload.(*events.Want)
			if !ok || !wantNames(w.Modules, build) {
				return nil
			}
			for _, t := range ts {
				if hits[t.fleet] == nil {
					hits[t.fleet] = map[string]uint64{}
				}
				hits[t.fleet][t.node] = m.Event.Seq
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("reading the rollouts' previous wants: %w", err)
		}
	}
	replay := maps.Clone(forward)
	for f := range hits {
		replay[f] = true
	}
	for _, f := range slices.Sorted(maps.Keys(replay)) {
		s, err := feed.Replay(ctx, r.js, cfg, nil, f)
		if errors.Is(err, feed.ErrNoRollout) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		ro := s.Rollout
		if ro == nil {
			continue
		}
		ru := RevertUse{Fleet: f, Rollout: ro.ID, Phase: ro.Phase}
		for _, n := range s.GivesBack() {
			seq, ok := hits[f][n.Name]
			carried := n.RevertTo() == 0 && n.Had > 0 && n.Had <= len(ro.Wants) && wantNames(ro.Wants[n.Had-1], build)
			if (ok && seq == n.RevertTo()) || carried {
				ru.Nodes = append(ru.Nodes, n.Name)
			}
		}
		if len(ru.Nodes) > 0 {
			slices.Sort(ru.Nodes)
			reverts = append(reverts, ru)
		}
		if !forward[f] || (ro.Phase != rollout.Loading && ro.Phase != rollout.Running && ro.Phase != rollout.WaitingPromote) {
			continue
		}
		su := RevertUse{Fleet: f, Rollout: ro.ID, Phase: ro.Phase}
		for _, name := range ro.Targets {
			n := ro.Nodes[name]
			if (n.Status == rollout.Pending || n.Status == rollout.Publishing) && n.Want > 0 && n.Want <= len(ro.Wants) && wantNames(ro.Wants[n.Want-1], build) {
				su.Nodes = append(su.Nodes, name)
			}
		}
		if len(su.Nodes) > 0 {
			slices.Sort(su.Nodes)
			steps = append(steps, su)
		}
	}
	return reverts, steps, nil
}

// wantNames reports whether a want's modules name build.
func wantNames(modules []events.WantModule, build string) bool {
	return slices.ContainsFunc(modules, func(m events.WantModule) bool { return m.Build == build })
}

// RevertMissing is a target's previous want's build that a revert would
// give back and no node could fetch.
type RevertMissing struct {
	Node string
	// Prev is the previous want's sequence.
	Prev uint64
	MissingBuild
}

// RevertMissing returns, in target order, the builds a revert of s's
// rollout would give back (each target's previous want, of the targets
// [rollout.State.GivesBack] names) that no node could run: a bundle
// build the builds bucket no longer holds ('meshfold build rm --force'
// since the rollout started), as [Reader.MissingBuilds] judges it. It
// reads each previous want with a direct get and stats each build once.
// A previous want the stream no longer holds is left out (the
// controller says so when it reverts).
//
// Errors: the stream's lookup; a get's, other than for no message; the
// server's on a stat.
func (r *Reader) RevertMissing(ctx context.Context, s *rollout.State) ([]RevertMissing, error) {
	nodes := s.GivesBack()
	if len(nodes) == 0 {
		return nil, nil
	}
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	judged := map[string]*MissingBuild{} // by build; nil: runnable
	var out []RevertMissing
	for _, n := range nodes {
		prev := n.RevertTo()
		var modules []events.WantModule
		if prev == 0 {
			// The rollout carries it (its want aged out of the stream).
			if n.Had == 0 || n.Had > len(s.Rollout.Wants) {
				continue
			}
			prev, modules = n.HadSeq, s.Rollout.Wants[n.Had-1]
		} else {
			raw, err := stream.GetMsg(ctx, prev)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("node %s: previous want #%d: %w", n.Name, prev, err)
			}
			ev, err := cfg.Subjects().DecodeEvent(raw.Subject, raw.Data, raw.Sequence, raw.Time)
			if err != nil {
				continue
			}
			w, ok := ev.Payload.(*events.Want)
			if !ok {
				continue
			}
			modules = w.Modules
		}
		for _, m := range modules {
			mb, seen := judged[m.Build]
			if !seen {
				miss, err := r.MissingBuilds(ctx, &events.Want{Modules: []events.WantModule{m}})
				if err != nil {
					return nil, err
				}
				if len(miss) > 0 {
					mb = &miss[0]
				}
				judged[m.Build] = mb
			}
			if mb != nil {
				out = append(out, RevertMissing{Node: n.Name, Prev: prev, MissingBuild: MissingBuild{Module: m.Name, Build: m.Build, Err: mb.Err}})
			}
		}
	}
	return out, nil
}

// NamedSince returns what names build among the events stored after
// sequence after (BuildUse.Last): the nodes a want of which names it,
// sorted, and the fleets whose newest rollout start gives a want naming
// it, sorted. 'meshfold build rm' reads it once the bundle is removed, to
// say what was published between its check and the removal (a want
// published after this read, by a command that found the build stored
// before the removal, is not seen: docs/architecture.md, "build rm's
// window"). The wants are read from the stream's leader (store.ReadFilter),
// from after on; the starts one a fleet (store.LastPerSubject).
//
// Errors: the stream's lookup and reads.
func (r *Reader) NamedSince(ctx context.Context, build string, after uint64) (wants, starts []string, err error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	subj := cfg.Subjects()
	needle := []byte(build)
	seen := map[string]bool{}
	if err := store.ReadFilter(ctx, r.js, cfg.Name, subj, subj.StoredKind(events.KindWant), "wants", after+1, 0, func(m store.Msg) error {
		if w, ok := m.Event.Payload.(*events.Want); ok && wantNames(w.Modules, build) && !seen[m.Event.Node] {
			seen[m.Event.Node] = true
			wants = append(wants, m.Event.Node)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if err := store.LastPerSubject(ctx, r.js, cfg.Name, subj.Rollout("*", string(rollout.KindStart)), func(subject string, seq uint64, data []byte) error {
		if seq <= after || !bytes.Contains(data, needle) {
			return nil
		}
		fleet, _, ok := subj.ParseRollout(subject)
		var st rollout.Start
		if ok && !slices.Contains(starts, fleet) && json.Unmarshal(data, &st) == nil &&
			slices.ContainsFunc(st.Wants, func(w []events.WantModule) bool { return wantNames(w, build) }) {
			starts = append(starts, fleet)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	slices.Sort(wants)
	slices.Sort(starts)
	return wants, starts, nil
}
