package engine

import (
	"hash/maphash"
	"slices"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// internCap bounds the strings one partition's interner keeps: past it,
// new strings are used as they are (the fold's results do not change,
// only how much memory equal strings take).
const internCap = 1 << 14

// interner keeps one copy of each string a partition's node states hold.
// A fleet's module names, builds, accounts and paths repeat from node to
// node; decoded separately, each node kept its own copies. The pure fold
// cannot share memory across nodes, so the loop does it, before folding
// and when loading snapshots. One partition's session owns one: it is not
// safe for concurrent use. Its decoder takes the strings of the events
// the session decodes from the same map, so that most of them are found
// rather than allocated and then dropped for the interned copy.
//
// It also keeps one copy of each list of files, of a want's modules and of
// a plan's rows that its states hold (issue 27, objects a state): a
// cohort of nodes given the same want holds equal lists, and the fold
// keeps a list it is given without copying it ([reconcile.State.Fold]),
// so the nodes share one. Haves are not shared: an agent's have names
// when each module's state last changed, different on every node.
type interner struct {
	m     map[string]string
	dec   events.Decoder
	seed  maphash.Seed
	fileL lists[events.File]
	wantL lists[events.WantModule]
	rowL  lists[events.PlanModule]
}

func newInterner() *interner {
	m := map[string]string{}
	return &interner{m: m, dec: events.Decoder{Strings: m, Max: internCap}, seed: maphash.MakeSeed()}
}

// listCap bounds the lists of one kind a partition's interner keeps; past
// it, they are forgotten and kept anew (a list already shared stays
// shared, held by its states; only later equal lists make a second copy).
// Builds roll, and each want of a new build makes new lists: forgetting
// bounds the memory of the old ones.
const listCap = 1 << 12

// lists keeps one copy of each list of Ts by content: a hash of the
// content to the list kept; a list whose hash is taken by an unequal one
// is not kept (nothing but memory depends on whether two equal lists are
// one).
type lists[T any] struct {
	m map[uint64][]T
}

// share returns the list kept equal to xs (hashed to h by the caller),
// else own(xs), a list of its own equal to xs with its strings interned,
// which it keeps. xs is never changed: it may be a list states hold. An
// empty xs is returned as it is.
func (l *lists[T]) share(xs []T, h uint64, equal func(a, b T) bool, own func([]T) []T) []T {
	if len(xs) == 0 {
		return xs
	}
	k, ok := l.m[h]
	if ok && slices.EqualFunc(k, xs, equal) {
		return k
	}
	xs = own(xs)
	if !ok {
		if l.m == nil || len(l.m) >= listCap {
			l.m = make(map[uint64][]T)
		}
		l.m[h] = xs
	}
	return xs
}

func hashFiles(h *maphash.Hash, fs []events.File) {
	maphash.WriteComparable(h, len(fs))
	for _, f := range fs {
		h.WriteString(f.Path)
		h.WriteByte(0)
		h.WriteString(string(f.Mode))
		h.WriteByte(0)
	}
}

func equalFile(a, b events.File) bool { return a == b }

func equalWant(a, b events.WantModule) bool {
	return a.Name == b.Name && a.Build == b.Build && a.RunsAs == b.RunsAs && a.Provisioner == b.Provisioner &&
		a.RequiresApproval == b.RequiresApproval && a.Hold == b.Hold && slices.Equal(a.Files, b.Files)
}

func equalRow(a, b events.PlanModule) bool {
	return a.Name == b.Name && a.Build == b.Build && a.RunsAs == b.RunsAs && a.Provisioner == b.Provisioner &&
		a.Held == b.Held && a.Why == b.Why && a.Pending == b.Pending && slices.Equal(a.Files, b.Files)
}

func flags(bs ...bool) byte {
	var b byte
	for i, x := range bs {
		if x {
			b |= 1 << i
		}
	}
	return b
}

// files returns the file list kept equal to fs: one copy, its strings
// interned, of exactly its length (the decoder gives a slice room for
// several more elements than it holds: a module's one file took 320
// bytes, kept for as long as the want or plan stands, issue 17).
func (in *interner) files(fs []events.File) []events.File {
	h := maphash.Hash{}
	h.SetSeed(in.seed)
	hashFiles(&h, fs)
	return in.fileL.share(fs, h.Sum64(), equalFile, func(fs []events.File) []events.File {
		out := make([]events.File, len(fs))
		for i, f := range fs {
			out[i] = events.File{Path: in.s(f.Path), Mode: events.Mode(in.s(string(f.Mode)))}
		}
		return out
	})
}

// wants returns the want module list kept equal to ms (see files).
func (in *interner) wants(ms []events.WantModule) []events.WantModule {
	h := maphash.Hash{}
	h.SetSeed(in.seed)
	for _, m := range ms {
		h.WriteString(m.Name)
		h.WriteByte(0)
		h.WriteString(m.Build)
		h.WriteByte(0)
		h.WriteString(m.RunsAs)
		h.WriteByte(flags(m.Provisioner, m.RequiresApproval, m.Hold))
		hashFiles(&h, m.Files)
	}
	return in.wantL.share(ms, h.Sum64(), equalWant, func(ms []events.WantModule) []events.WantModule {
		out := slices.Clone(ms)
		for i := range out {
			m := &out[i]
			m.Name, m.Build, m.RunsAs = in.s(m.Name), in.s(m.Build), in.s(m.RunsAs)
			m.Files = in.files(m.Files)
		}
		return out
	})
}

// rows returns the plan row list kept equal to rs (see files).
func (in *interner) rows(rs []events.PlanModule) []events.PlanModule {
	h := maphash.Hash{}
	h.SetSeed(in.seed)
	for _, r := range rs {
		h.WriteString(r.Name)
		h.WriteByte(0)
		h.WriteString(r.Build)
		h.WriteByte(0)
		h.WriteString(r.RunsAs)
		h.WriteByte(0)
		h.WriteString(string(r.Why))
		h.WriteByte(0)
		h.WriteString(r.Pending)
		h.WriteByte(flags(r.Provisioner, r.Held))
		hashFiles(&h, r.Files)
	}
	return in.rowL.share(rs, h.Sum64(), equalRow, func(rs []events.PlanModule) []events.PlanModule {
		out := slices.Clone(rs)
		for i := range out {
			r := &out[i]
			r.Name, r.Build, r.RunsAs, r.Pending = in.s(r.Name), in.s(r.Build), in.s(r.RunsAs), in.s(r.Pending)
			r.Why = events.HoldReason(in.s(string(r.Why)))
			r.Files = in.files(r.Files)
		}
		return out
	})
}

// folded shares the rows of a plan st's fold just emitted (effs are its
// effects) with other nodes' equal ones. The caller holds the partition's
// lock, as for the fold.
func (in *interner) folded(st *reconcile.State, effs []reconcile.Effect) {
	for _, e := range effs {
		if e.Kind == events.KindPlan {
			if r := st.Emitted(); r != nil {
				r.Modules = in.rows(r.Modules)
			}
			return
		}
	}
}

// absorb takes o's strings that in lacks (up to internCap), so that the
// events in decodes share the strings of the states o interned (a
// restart's pass over the rest of the states interns them apart, beside
// the fold: restPass).
func (in *interner) absorb(o *interner) {
	for k, v := range o.m {
		if len(in.m) >= internCap {
			return
		}
		if _, ok := in.m[k]; !ok {
			in.m[k] = v
		}
	}
}

func (in *interner) s(x string) string {
	if x == "" {
		return x
	}
	if v, ok := in.m[x]; ok {
		return v
	}
	if len(in.m) < internCap {
		in.m[x] = x
	}
	return x
}

func (in *interner) haveModules(ms []events.HaveModule) {
	for i := range ms {
		m := &ms[i]
		m.Name, m.Build, m.Account = in.s(m.Name), in.s(m.Build), in.s(m.Account)
		m.State = events.RunState(in.s(string(m.State)))
	}
}

func (in *interner) owed(o *events.Owed) {
	o.Module, o.Path, o.Writer = in.s(o.Module), in.s(o.Path), in.s(o.Writer)
	o.Reason = events.Reason(in.s(string(o.Reason)))
}

// read interns a payload its decoder has just read, as the fold's loop
// does: a payload read on the fast path has the interner's strings
// already and no slice with room to spare (events.Decoder.Fast), so only
// its lists are shared; another is interned whole ([interner.payload]).
func (in *interner) read(p events.Payload) {
	if !in.dec.Fast {
		in.payload(p)
		return
	}
	if w, ok := p.(*events.Want); ok {
		w.Modules = in.wants(w.Modules)
	}
}

// payload interns the strings of the payloads the fold keeps, and shares
// a want's modules with the equal lists of other nodes.
func (in *interner) payload(p events.Payload) {
	switch p := p.(type) {
	case *events.Want:
		p.Modules = in.wants(p.Modules)
	case *events.Have:
		in.haveModules(p.Modules)
	case *events.Approve:
		p.Module, p.Build, p.By = in.s(p.Module), in.s(p.Build), in.s(p.By)
	case *events.Refusal:
		p.Module, p.Path, p.Writer = in.s(p.Module), in.s(p.Path), in.s(p.Writer)
		p.Reason = events.Reason(in.s(string(p.Reason)))
	case *events.Filled:
		p.Module, p.Path = in.s(p.Module), in.s(p.Path)
	}
}

// state interns a state decoded from a snapshot, and trims the spare
// capacity the decoder left in its largest slices.
func (in *interner) state(st *reconcile.State) {
	if st.Want != nil {
		st.Want.Modules = in.wants(st.Want.Modules)
	}
	if st.Have != nil {
		st.Have.Modules = slices.Clone(st.Have.Modules)
		in.haveModules(st.Have.Modules)
	}
	if st.Settled != nil {
		st.Settled.Account = in.s(st.Settled.Account)
		st.Settled.Modules = in.rows(st.Settled.Modules)
	}
	for _, p := range st.Unsettled {
		p.Account = in.s(p.Account)
		p.Modules = in.rows(p.Modules)
	}
	st.Accepting = slices.Clone(st.Accepting)
	for i := range st.Accepting {
		a := &st.Accepting[i]
		a.Module, a.Path, a.Account = in.s(a.Module), in.s(a.Path), in.s(a.Account)
	}
	st.Filled = slices.Clone(st.Filled)
	for i := range st.Filled {
		st.Filled[i].Module, st.Filled[i].Path = in.s(st.Filled[i].Module), in.s(st.Filled[i].Path)
	}
	st.Approvals = slices.Clone(st.Approvals)
	for i := range st.Approvals {
		a := &st.Approvals[i]
		a.Module, a.Build, a.By = in.s(a.Module), in.s(a.Build), in.s(a.By)
	}
	st.Owed = slices.Clone(st.Owed)
	for i := range st.Owed {
		in.owed(&st.Owed[i].Owed)
	}
	st.Unsettled = slices.Clone(st.Unsettled)
	st.Placed = slices.Clone(st.Placed)
	for i := range st.Placed {
		st.Placed[i].Module, st.Placed[i].Path = in.s(st.Placed[i].Module), in.s(st.Placed[i].Path)
	}
	st.Gates = slices.Clone(st.Gates)
	for i := range st.Gates {
		g := &st.Gates[i]
		g.Module, g.By = in.s(g.Module), in.s(g.By)
	}
	st.Waivers = slices.Clone(st.Waivers)
	for i := range st.Waivers {
		w := &st.Waivers[i]
		w.Module, w.Path, w.By = in.s(w.Module), in.s(w.Path), in.s(w.By)
	}
	if k := st.LastKnock; k != nil {
		k.Reasons = slices.Clone(k.Reasons)
		for i := range k.Reasons {
			k.Reasons[i] = events.KnockReason(in.s(string(k.Reasons[i])))
		}
		k.Owed = slices.Clone(k.Owed)
		for i := range k.Owed {
			in.owed(&k.Owed[i])
		}
	}
}
