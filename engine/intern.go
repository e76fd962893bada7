package engine

import (
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
type interner struct {
	m   map[string]string
	dec events.Decoder
}

func newInterner() *interner {
	m := map[string]string{}
	return &interner{m: m, dec: events.Decoder{Strings: m, Max: internCap}}
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

// files returns fs interned, in a copy of exactly its length: the
// decoder gives a slice room for several more elements than it holds (a
// module's one file took 320 bytes), and a state keeps it for as long as
// the want or plan stands (issue 17).
func (in *interner) files(fs []events.File) []events.File {
	fs = slices.Clone(fs)
	for i := range fs {
		fs[i].Path = in.s(fs[i].Path)
		fs[i].Mode = events.Mode(in.s(string(fs[i].Mode)))
	}
	return fs
}

func (in *interner) wantModules(ms []events.WantModule) {
	for i := range ms {
		m := &ms[i]
		m.Name, m.Build, m.RunsAs = in.s(m.Name), in.s(m.Build), in.s(m.RunsAs)
		m.Files = in.files(m.Files)
	}
}

func (in *interner) haveModules(ms []events.HaveModule) {
	for i := range ms {
		m := &ms[i]
		m.Name, m.Build, m.Account = in.s(m.Name), in.s(m.Build), in.s(m.Account)
		m.State = events.RunState(in.s(string(m.State)))
	}
}

func (in *interner) rows(rs []events.PlanModule) {
	for i := range rs {
		r := &rs[i]
		r.Name, r.Build, r.RunsAs, r.Pending = in.s(r.Name), in.s(r.Build), in.s(r.RunsAs), in.s(r.Pending)
		r.Why = events.HoldReason(in.s(string(r.Why)))
		r.Files = in.files(r.Files)
	}
}

func (in *interner) owed(o *events.Owed) {
	o.Module, o.Path, o.Writer = in.s(o.Module), in.s(o.Path), in.s(o.Writer)
	o.Reason = events.Reason(in.s(string(o.Reason)))
}

// payload interns the strings of the payloads the fold keeps.
func (in *interner) payload(p events.Payload) {
	switch p := p.(type) {
	case *events.Want:
		in.wantModules(p.Modules)
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
		st.Want.Modules = slices.Clone(st.Want.Modules)
		in.wantModules(st.Want.Modules)
	}
	if st.Have != nil {
		st.Have.Modules = slices.Clone(st.Have.Modules)
		in.haveModules(st.Have.Modules)
	}
	if st.Settled != nil {
		st.Settled.Account = in.s(st.Settled.Account)
		st.Settled.Modules = slices.Clone(st.Settled.Modules)
		in.rows(st.Settled.Modules)
	}
	for _, p := range st.Unsettled {
		p.Account = in.s(p.Account)
		p.Modules = slices.Clone(p.Modules)
		in.rows(p.Modules)
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
