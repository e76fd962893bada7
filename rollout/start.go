package rollout

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/meshfold/meshfold/events"
)

// Candidate is one of the fleet's nodes as `apply` sees it: the want the
// fleet file gives it, and its newest want and liveness as the stream
// says now.
type Candidate struct {
	Node string
	// Want is the fleet file's want for the node.
	Want []events.WantModule
	// Prev is its newest want's sequence (0: none) and Current that
	// want's modules.
	Prev    uint64
	Current []events.WantModule
	// Down, DownSince and Unhealthy are its availability now (see
	// [NodeAtStart]).
	Down      bool
	DownSince time.Time
	Unhealthy []string
	// PausedBy and PausedReason: the node is paused (see [NodeAtStart]).
	PausedBy, PausedReason string
	// Retired: an operator's retire of the node is newer than its newest
	// want (it is retired or retiring; DESIGN.md §9: a later want brings
	// it back). Such a node is a target even when its want is unchanged,
	// so applying its fleet again brings it back, as a want does.
	Retired bool
	// Back is the want a revert gives it back instead of Prev, set by
	// [State.RevertBases] (see [NodeAtStart].Back); 0: Prev.
	Back uint64
	// HadSeq, when set, is the sequence of the want a revert gives it
	// back which the stream no longer holds, and Had its modules: the
	// start carries them ([NodeAtStart].Had). Apply sets them for a node
	// whose newest want aged out of the stream (--max-age; Prev is 0),
	// from the reconciler's state, Current being that want too; and
	// [State.RevertBases] from a superseded rollout that carried one.
	// A target with one was never "a node with no want before": a revert
	// must give it back this want, never an empty one (a fresh user's
	// finding F0: the revert removed every module of the canary).
	HadSeq uint64
	Had    []events.WantModule
	// Restarts are the restarts its newest have reported, of the
	// modules that had any (see [NodeAtStart].Restarts).
	Restarts []ModuleRestarts
	// Trusts are the reconciler keys its agent trusts, from its newest
	// agent event when that is an up listing them
	// ([events.Agent].Trusts); nil when unknown (an older agent, one
	// that verifies nothing, or its agent down). PlanSigner and PlanSeq
	// are its newest plan's signer (empty: unsigned) and sequence (0:
	// none). Apply reads them only to warn ([feed.Plan.UntrustedNote]);
	// the start carries neither.
	Trusts     []string
	PlanSigner string
	PlanSeq    uint64
}

// restartsAtStart returns c's restarts of the modules its new want
// leaves at their build, without the build, as many as keep n's encoding
// within [RestartsNodeBytes] ([NodeAtStart].Restarts), and n's DownSince
// as it is to be carried: a down target's time (about 50 bytes encoded)
// is given up, zero, when it would leave out a restart count. Which is
// worth more: without its time the fold takes the start's for when the
// agent went down (it is said in texts only); without a module's count
// the fold counts its restarts whole, and a module the rollout leaves
// as it was, which crash-looped an hour before, halts the rollout and
// reverts the fleet (a fresh user's finding: a node recorded down at
// apply lost its count to its down_since, and its first step failed for
// 7 restarts 24 minutes old).
func restartsAtStart(n NodeAtStart, c Candidate) ([]ModuleRestarts, time.Time) {
	out, all := restartsWithin(n, c)
	if all || n.DownSince.IsZero() {
		return out, n.DownSince
	}
	without := n
	without.DownSince = time.Time{}
	if more, _ := restartsWithin(without, c); len(more) > len(out) {
		return more, time.Time{}
	}
	return out, n.DownSince
}

// restartsWithin is restartsAtStart's count for n as it is: the
// restarts that fit, and whether every one did.
func restartsWithin(n NodeAtStart, c Candidate) (out []ModuleRestarts, all bool) {
	return restartsBounded(n, c, RestartsNodeBytes)
}

// restartsBounded is c's restarts of the modules its new want leaves at
// their build, as many as keep n's encoding within bound bytes (at most
// events.MaxHaveModules), and whether every one fit.
func restartsBounded(n NodeAtStart, c Candidate, bound int) (out []ModuleRestarts, all bool) {
	for _, r := range c.Restarts {
		same := func(m events.WantModule) bool { return m.Name == r.Module && m.Build == r.Build }
		if !slices.ContainsFunc(c.Current, same) || !slices.ContainsFunc(c.Want, same) {
			continue // changed by the want: applied anew, its count starts again
		}
		n.Restarts = append(out, ModuleRestarts{Module: r.Module, Restarts: r.Restarts})
		if b, err := json.Marshal(n); err != nil || len(b) > bound || len(n.Restarts) > events.MaxHaveModules {
			return out, false
		}
		out = n.Restarts
	}
	return out, true
}

// Target reports whether apply rolls c out: it has no want yet (none in
// the stream, and none the reconciler's state holds: HadSeq), its want
// changes, or it is retired (its want, published again, brings it back).
func (c Candidate) Target() bool {
	return c.New() || c.Retired || !EqualWant(c.Want, c.Current)
}

// New reports whether the node had no want before: the stream holds none
// of it (Prev 0) and none aged out of it (HadSeq 0). A revert gives such
// a target an empty want (every module removed), and only such a one.
func (c Candidate) New() bool {
	return c.Prev == 0 && c.HadSeq == 0
}

// NewStart builds the start of a rollout over the candidates: the
// targets are those whose want differs from their newest want (or that
// have none, or are retired: [Candidate.Target]), in the candidates' order; each distinct want is carried
// once. Nodes beyond [MaxNodesPerEvent] go to pages, which the caller
// publishes after the start as [Nodes] events (Page i+1 of the start's
// sequence). Each target's want before the rollout is carried too
// ([NodeAtStart].Had), within the start's bound ([carryBefore]), so that
// a revert gives it back whatever the stream still holds. It returns a
// nil start when no node's want changes.
func NewStart(by, reason string, params Params, cands []Candidate) (start *Start, pages [][]NodeAtStart) {
	start = &Start{By: by, Reason: reason, Params: params, Wants: [][]events.WantModule{}}
	var all []NodeAtStart
	var of []Candidate // of[i] is all[i]'s candidate
	targets := 0
	for _, c := range cands {
		n := NodeAtStart{Node: c.Node, Prev: c.Prev, Down: c.Down, Unhealthy: c.Unhealthy, PausedBy: c.PausedBy, PausedReason: c.PausedReason}
		if c.Down {
			n.DownSince = c.DownSince
		}
		if c.Target() {
			n.Back = c.Back
			n.Want = wantIndex(start, c.Want)
			// Every count at first: a page over its bound is cut
			// below (fitRestarts).
			n.Restarts, _ = restartsBounded(n, c, events.MaxEventBytes)
			if c.HadSeq != 0 && c.Back == 0 {
				// The want a revert gives back, carried: the stream
				// no longer holds it.
				n.Had, n.HadSeq = wantIndex(start, c.Had), c.HadSeq
			}
			if fresh := NewFiles(c.Current, c.Want); len(fresh) > 0 {
				j := slices.IndexFunc(start.NewFiles, func(l []FileRef) bool { return slices.Equal(l, fresh) })
				if j < 0 {
					j = len(start.NewFiles)
					start.NewFiles = append(start.NewFiles, fresh)
				}
				n.NewFiles = j + 1
			}
			targets++
		}
		all, of = append(all, n), append(of, c)
	}
	if targets == 0 {
		return nil, nil
	}
	for i := 0; i < len(all); i += MaxNodesPerEvent {
		j := min(len(all), i+MaxNodesPerEvent)
		fitRestarts(all[i:j], of[i:j])
	}
	start.Nodes = all[:min(len(all), MaxNodesPerEvent)]
	for rest := all[len(start.Nodes):]; len(rest) > 0; {
		k := min(len(rest), MaxNodesPerEvent)
		pages = append(pages, rest[:k])
		rest = rest[k:]
	}
	start.Pages = 1 + len(pages)
	current := make(map[string][]events.WantModule, len(cands))
	for _, c := range cands {
		if c.Target() && c.Current != nil {
			current[c.Node] = c.Current
		}
	}
	carryBefore(start, pages, func(node string) ([]events.WantModule, bool) {
		w, ok := current[node]
		return w, ok
	})
	return start, pages
}

// pageRestartsBytes bounds the encoded nodes of one start or page with
// every restart count carried: 192 KiB, under what the per-node bound
// keeps a full page within (MaxNodesPerEvent × RestartsNodeBytes), with
// room left for the start's wants and the wants before the rollout it
// carries ([CarryBytes]).
const pageRestartsBytes = 192 << 10

// fitRestarts keeps every target's restart counts in a page (nodes, their
// candidates of) whose encoding is within pageRestartsBytes: most nodes
// carry none, so a page has room for those that do. A page over it has
// each node's counts cut to RestartsNodeBytes ([restartsAtStart]), which
// keeps any page within it. Before, every node's entry was held to
// RestartsNodeBytes whatever its page held, and a node whose other
// fields were long (down at apply, with its down_since and its unhealthy
// modules) lost its counts: a fresh user's rollout halted and reverted
// the fleet for 7 restarts 24 minutes old of a module it left as it was.
func fitRestarts(nodes []NodeAtStart, of []Candidate) {
	if b, err := json.Marshal(nodes); err == nil && len(b) <= pageRestartsBytes {
		return
	}
	for i := range nodes {
		if len(nodes[i].Restarts) == 0 {
			continue
		}
		n := nodes[i]
		n.Restarts = nil
		nodes[i].Restarts, nodes[i].DownSince = restartsAtStart(n, of[i])
	}
}

// CarryBytes bounds a start's or a page's encoding once the wants its
// targets had before the rollout are carried ([carryBefore]): 16 KiB
// under events.MaxEventBytes, for the header the publish stamps and
// the event's subject and headers.
const CarryBytes = 240 << 10

// carryBefore makes start carry, for each target whose revert would copy
// its want before the rollout from the stream (Prev set, no Back, none
// carried yet), that want, before(node) (the candidate's Current, which
// apply read at Prev; false when unknown, a want that did not decode:
// never carried as an empty want, which would remove every module):
// Had names it among the start's wants, each
// distinct want carried once, and HadSeq is Prev. A revert then gives it
// back from the start, whatever the stream still holds: with --max-age
// shorter than a rollout the want before it ages out meanwhile, and a
// revert that copied it was refused ("the previous want #N could not be
// read"). A target is carried only while the start keeps at most
// [MaxWants] wants and the start and its page stay within [CarryBytes]
// (a fleet whose nodes had many distinct large wants): one left out
// reverts by copy as before. Targets are taken in order, the start's
// first; one that does not fit does not stop the next, which may share
// a want already carried. It returns how many targets were left out.
func carryBefore(start *Start, pages [][]NodeAtStart, before func(node string) ([]events.WantModule, bool)) (left int) {
	size := func(v any) int {
		b, err := json.Marshal(v)
		if err != nil {
			return CarryBytes + 1
		}
		return len(b)
	}
	startBytes := size(start)
	for pi := -1; pi < len(pages); pi++ {
		list, bytes := start.Nodes, &startBytes
		pageBytes := 0
		if pi >= 0 {
			list, pageBytes, bytes = pages[pi], size(pages[pi])+64, &pageBytes
		}
		for i := range list {
			n := &list[i]
			if n.Want == 0 || n.Prev == 0 || n.Back != 0 || n.Had != 0 {
				continue
			}
			w, ok := before(n.Node)
			if !ok {
				left++
				continue
			}
			if w == nil {
				w = []events.WantModule{}
			}
			c := *n
			c.Had, c.HadSeq = len(start.Wants)+1, n.Prev
			j := slices.IndexFunc(start.Wants, func(x []events.WantModule) bool { return EqualWant(x, w) })
			grow := 0 // the start's growth by a want carried anew
			if j >= 0 {
				c.Had = j + 1
			} else {
				grow = size(w) + 1
			}
			cost := size(c) - size(*n)
			fits := (j >= 0 || len(start.Wants) < MaxWants) && *bytes+cost <= CarryBytes
			if pi >= 0 {
				fits = fits && startBytes+grow <= CarryBytes
			} else {
				fits = fits && startBytes+cost+grow <= CarryBytes
			}
			if !fits {
				left++
				continue
			}
			if j < 0 {
				start.Wants = append(start.Wants, w)
			}
			startBytes += grow
			*bytes += cost
			*n = c
		}
	}
	return left
}

// wantIndex returns 1 + the index of w in the start's wants, adding it
// when absent: each distinct want is carried once.
func wantIndex(start *Start, w []events.WantModule) int {
	i := slices.IndexFunc(start.Wants, func(x []events.WantModule) bool { return EqualWant(x, w) })
	if i < 0 {
		i = len(start.Wants)
		start.Wants = append(start.Wants, w)
	}
	return i + 1
}

// NewFiles returns the files want declares that current does not declare
// for a module of the same name that runs something (a build), in want's
// order: the files a target of the rollout waits for (a fresh user's
// finding G4); nil when none.
func NewFiles(current, want []events.WantModule) []FileRef {
	var out []FileRef
	for _, m := range want {
		var had []events.File
		if i := slices.IndexFunc(current, func(c events.WantModule) bool { return c.Name == m.Name }); i >= 0 && current[i].Build != "" {
			had = current[i].Files
		}
		for _, f := range m.Files {
			if !slices.ContainsFunc(had, func(h events.File) bool { return h.Path == f.Path }) {
				out = append(out, FileRef{Module: m.Name, Path: f.Path})
			}
		}
	}
	return out
}

// EqualWant reports whether two wants declare the same modules, in the
// same order, with the same fields (a nil and an empty file list are the
// same).
func EqualWant(a, b []events.WantModule) bool {
	return slices.EqualFunc(a, b, func(x, y events.WantModule) bool {
		return x.Name == y.Name && WantFields(x, y) == nil
	})
}

// WantFields returns the names of the fields, as a want's JSON spells
// them (build, runs_as, files, provisioner, requires_approval, hold), in
// which module x and y differ, their name aside; nil when none does. It
// is the one comparison of two wants' modules: [EqualWant] and apply's
// description of a change both use it.
func WantFields(x, y events.WantModule) []string {
	var f []string
	add := func(differ bool, name string) {
		if differ {
			f = append(f, name)
		}
	}
	add(x.Build != y.Build, "build")
	add(x.RunsAs != y.RunsAs, "runs_as")
	add(!slices.Equal(x.Files, y.Files), "files")
	add(x.Provisioner != y.Provisioner, "provisioner")
	add(x.RequiresApproval != y.RequiresApproval, "requires_approval")
	add(x.Hold != y.Hold, "hold")
	return f
}

// Stalled says what 'rollout status' would say of start's rollout as
// soon as it and its pages are folded, were no other event to come: its
// stalled line ([View].Stalled) when nodes already unavailable (agents
// down, paused, unhealthy) spend max_unavailable so that no target, the
// canary included, can be changed; "" otherwise. apply and its dry run
// print it before anything moves (a fresh user's finding U20: nothing
// moved and apply said nothing). The text is the view's, not a second
// one.
func Stalled(fleet string, start *Start, pages [][]NodeAtStart, now time.Time) string {
	if start == nil {
		return ""
	}
	s := NewState(fleet)
	const id = 1
	s.Fold(Input{Seq: id, Time: now, Kind: KindStart, Payload: start})
	for i, p := range pages {
		s.Fold(Input{Seq: uint64(id + 1 + i), Time: now, Kind: KindNodes, Payload: &Nodes{Rollout: id, Page: i + 1, Nodes: p}})
	}
	return s.View().Stalled
}
