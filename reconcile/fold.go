package reconcile

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
)

// Fold folds one of the node's events into s, in place, and returns the
// effects to publish, in the order they must be published (nil when none).
//
// ev.Seq must be the event's stream sequence. An event at or below s.Seq was
// folded already: Fold returns nil and changes nothing (DESIGN.md §5.4).
// An event that could not be decoded (ev.Err set), has a newer schema
// version, or names a plan newer than the newest plan event folded is
// journaled at level error and not folded (DESIGN.md §3); it never stops
// the node's other events from folding.
//
// s may keep slices of ev.Payload (a want's or have's modules, a file
// list) rather than copies: the caller must not change a payload once
// folded, and may fold one payload, or slices equal lists share, into many
// states. The fold never changes a kept slice's elements.
//
// A plan event the reconciler did not emit (ev.Foreign: its signature does
// not verify against the reconciler's keys; or a plan of its retired key,
// ev.OldKey, whose cause matches no plan it emitted and has not yet
// folded) is never folded as a plan: it is journaled at level error and
// the last plan emitted is published again, under this event's cause, so
// the node returns to what the want says even if it applied it (issues
// 14, 24). A plan of its current key whose unsettled record the cap
// dropped before its event was read is recorded again from the event
// (issue 25); any other current-key plan that binds to nothing (a copy) is
// journaled at error.
//
// Knock, journal and unknown kinds are not inputs of the fold: they only
// advance s.Seq. A record one more would take past its cap (limits.go) is
// dropped, oldest first, and journaled (DESIGN.md §4, "Bounded by
// counts"); nothing is dropped otherwise.
func (s *State) Fold(ev events.Event) []Effect {
	if ev.Seq <= s.Seq {
		return nil
	}
	s.Seq = ev.Seq
	f := folder{s: s, ev: ev}
	f.fold()
	// Last: a noisy episode's journal entry follows every other effect
	// of the event, whose ids are then those of a fold without the rule.
	f.traffic()
	return f.out
}

// fold applies the rule of f.ev's kind.
func (f *folder) fold() {
	ev := f.ev
	if ev.Foreign && ev.Kind == events.KindPlan {
		f.foreignPlan("no valid signature of its keys")
		return
	}
	if ev.Err != nil {
		if errors.Is(ev.Err, events.ErrNewerVersion) {
			f.reject("not understood: %v", ev.Err)
		} else {
			f.reject("%v", ev.Err)
		}
		return
	}
	switch p := ev.Payload.(type) {
	case *events.Want:
		f.want(p)
	case *events.Approve:
		f.approve(p)
	case *events.Have:
		f.have(p)
	case *events.Settle:
		f.settle(p)
	case *events.Refusal:
		f.refusal(p)
	case *events.Filled:
		f.filled(p)
	case *events.Plan:
		f.plan(p)
	case *events.Pause:
		f.pause(p)
	case *events.Resume:
		f.resume(p)
	case *events.Poke:
		f.poke(p)
	case *events.Revoke:
		f.revoke(p)
	case *events.Waive:
		f.waive(p)
	case *events.Retire:
		f.retire(p)
	case *events.Agent:
		f.agent(p)
	case *events.Prov:
		f.prov(p)
	case *events.Ack:
		f.ack(p)
	case *events.Gate:
		f.gate(p)
	}
}

// folder carries one Fold call: the state, the event and the effects.
type folder struct {
	s   *State
	ev  events.Event
	out []Effect
	n   [3]int // effects emitted so far per kind: plan, knock, journal
}

func (f *folder) emit(kind events.Kind, p events.Payload) {
	i := 2
	switch kind {
	case events.KindPlan:
		i = 0
	case events.KindKnock:
		i = 1
	}
	events.Stamp(p, f.ev.At())
	f.out = append(f.out, Effect{Node: f.s.Node, Kind: kind, Cause: f.ev.Seq, N: f.n[i], Payload: p})
	f.n[i]++
}

func (f *folder) journal(level events.Level, format string, args ...any) {
	f.emit(events.KindJournal, &events.Journal{Level: level, Msg: fmt.Sprintf(format, args...), Cause: f.ev.Seq})
}

// reject journals an event that is not folded.
func (f *folder) reject(format string, args ...any) {
	f.journal(events.LevelError, "%s %d not folded: %s", f.ev.Kind, f.ev.Seq, fmt.Sprintf(format, args...))
}

// planExists is the DESIGN.md §3 check for events that name a plan: a
// plan newer than the newest plan event folded does not exist yet.
func (f *folder) planExists(plan uint64) bool {
	if plan > f.s.NewestPlan {
		f.reject("names plan %d, newer than the newest plan event folded (%d)", plan, f.s.NewestPlan)
		return false
	}
	return true
}

func (f *folder) want(p *events.Want) {
	f.dropGates(p.Modules)
	f.s.takeWant(f.ev.Seq, p.Modules)
	// Only a want that says so sets gates (events.Want.Gates): a want an
	// older build wrote folds as it did, so an upgrade changes no plan
	// (docs/architecture.md, "The gate is set only by a want that says
	// so").
	if p.Gates {
		for _, m := range p.Modules {
			if m.RequiresApproval {
				f.setGate(GateRecord{Module: m.Name, Seq: f.ev.Seq})
			}
		}
	}
	f.compose()
}

// dropGates marks the gates whose module the node's newest want names
// and modules, the new want, does not (GateRecord.Dropped), and unmarks
// those modules names again. A gated module renamed (dropped, and its
// workload placed under a new name) would otherwise move unapproved (a
// fresh user's finding M2). A gate no want ever named (an operator's
// gate of a module ahead of any want) is never dropped.
func (f *folder) dropGates(modules []events.WantModule) {
	s := f.s
	if len(s.Gates) == 0 {
		return
	}
	names := func(ms []events.WantModule, name string) bool {
		return slices.ContainsFunc(ms, func(m events.WantModule) bool { return m.Name == name })
	}
	var gates []GateRecord
	for i, g := range s.Gates {
		was := g.Dropped
		switch {
		case names(modules, g.Module):
			g.Dropped = 0
		case s.Want != nil && names(s.Want.Modules, g.Module):
			g.Dropped = f.ev.Seq
		}
		if g.Dropped != was {
			if gates == nil {
				gates = slices.Clone(s.Gates) // never changed in place
			}
			gates[i] = g
		}
	}
	if gates != nil {
		s.Gates = gates
	}
}

// gate sets or lifts an operator's gate of a module (DESIGN.md §4, "the
// gate"; §9). Lifting a gate that is not set changes nothing; the want's
// own requires_approval, while the want carries it, still holds the
// module (Hold).
func (f *folder) gate(p *events.Gate) {
	s := f.s
	if p.Lift {
		s.Gates = slices.DeleteFunc(s.Gates, func(g GateRecord) bool { return g.Module == p.Module })
		f.gateAccounted(p.Module, p.By, false) // an operator's word: it needs none
	} else {
		f.setGate(GateRecord{Module: p.Module, Seq: f.ev.Seq, By: p.By})
	}
	f.compose()
}

// gateAccounted takes module off the node's full gates
// (State.GatesFull): gated after all, or ungated by an operator. Once
// no module whose gate was not kept is left, the gates are kept again;
// past the list's bound (Unnamed), only with an operator's gate kept
// (kept set), whose operator read the journal's warnings.
func (f *folder) gateAccounted(module, by string, kept bool) {
	g := f.s.GatesFull
	if g == nil {
		return
	}
	if i, found := slices.BinarySearch(g.Modules, module); found {
		g.Modules = slices.Delete(g.Modules, i, i+1)
	}
	if len(g.Modules) > 0 || g.Unnamed > 0 && !(kept && by != "") {
		return
	}
	f.s.GatesFull = nil
	unnamed := ""
	if g.Unnamed > 0 {
		unnamed = fmt.Sprintf("; %d more gates were not kept, named only in this journal's warnings since #%d: gate each that needs approval", g.Unnamed, g.Seq)
	}
	f.journal(events.LevelWarn, "gates no longer full (since #%d): every module whose gate was not kept is gated or ungated now, so modules move without an approval again unless gated%s", g.Seq, unnamed)
}

// setGate keeps g unless its module is gated already (the first gate
// stands: who gated it, and since when). Past MaxGates it is not kept,
// journaled at warn: a gate kept is never dropped to make room, or a
// controller could lift one by gating others (limits.go).
func (f *folder) setGate(g GateRecord) {
	s := f.s
	i, found := slices.BinarySearchFunc(s.Gates, g, compareGate)
	if found {
		f.gateAccounted(g.Module, g.By, true)
		return
	}
	if len(s.Gates) >= MaxGates {
		// Fail closed: every module is held for an approval until each
		// whose gate was not kept is gated or ungated (State.GatesFull).
		full := s.GatesFull
		if full == nil {
			full = &GatesFull{Seq: g.Seq, By: g.By}
			s.GatesFull = full
		}
		switch j, lost := slices.BinarySearch(full.Modules, g.Module); {
		case lost:
		case len(full.Modules) < events.MaxModules:
			full.Modules = slices.Insert(full.Modules, j, g.Module)
		default:
			full.Unnamed++
		}
		f.journal(events.LevelWarn, "gate of %s not kept: the node keeps at most %d gates (reconcile.MaxGates) and drops none; "+
			"so its gates are full and every module of the node is held for an approval of its build until this one is gated or ungated: 'meshfold ungate' of a module that needs no approval makes room, then 'meshfold gate' of %s",
			events.Short(g.Module), MaxGates, events.Short(g.Module))
		return
	}
	s.Gates = slices.Insert(s.Gates, i, g)
	f.gateAccounted(g.Module, g.By, true)
}

// takeWant makes modules, the want at seq, the node's newest want: the
// fold's want rule, which [State.DryRun] runs too.
func (s *State) takeWant(seq uint64, modules []events.WantModule) {
	if s.Want != nil {
		// Removing a module from the want pays its items and drops its
		// waivers; removing a file from a module the want keeps pays that
		// file's items (DESIGN.md §4, "Bounded by counts").
		for _, m := range s.Want.Modules {
			i := slices.IndexFunc(modules, func(n events.WantModule) bool { return n.Name == m.Name })
			if i < 0 {
				s.Owed = slices.DeleteFunc(s.Owed, func(it Item) bool { return it.Module == m.Name })
				s.Waivers = slices.DeleteFunc(s.Waivers, func(w Waiver) bool { return w.Module == m.Name })
				continue
			}
			for _, file := range m.Files {
				if !declares(modules[i].Files, file.Path) {
					s.Owed = slices.DeleteFunc(s.Owed, func(it Item) bool { return it.Module == m.Name && it.Path == file.Path })
				}
			}
		}
	}
	// A failed apply of a module the want no longer names is no reason
	// the node is unsettled any more: its plan's next plan has no row for
	// it, and a failing removal of it reports itself again.
	s.Failed = slices.DeleteFunc(s.Failed, func(fa FailedApply) bool {
		return fa.Module != "" && !slices.ContainsFunc(modules, func(m events.WantModule) bool { return m.Name == fa.Module })
	})
	// A later want brings a retired (or retiring) node back (DESIGN.md §9).
	s.Retire = nil
	s.Want = &WantRecord{Seq: seq, Modules: kept(modules)}
}

// kept is xs as the state keeps it: xs itself when it has no spare
// capacity (the shell's decoder gives exact-size slices, and its interner
// one copy of a list many nodes share), else an exact-size copy (a slice
// with room to grow, as encoding/json decodes one, would keep that room for
// as long as the record stands). The state never changes a record's
// elements in place, so sharing xs with the event, or with other nodes'
// states, changes nothing the fold does (issue 27: the copy of every have's
// modules was a sixth of what a cold refold allocated).
func kept[T any](xs []T) []T {
	if len(xs) == cap(xs) {
		return xs
	}
	return slices.Clone(xs)
}

func (f *folder) approve(p *events.Approve) {
	s := f.s
	a := Approval{Module: p.Module, Build: p.Build, By: p.By, Seq: f.ev.Seq}
	if _, found := slices.BinarySearchFunc(s.Approvals, a, compareApproval); !found {
		lim := s.limits()
		n := 0
		for _, o := range s.Approvals {
			if o.Module == p.Module {
				n++
			}
		}
		if n >= lim.moduleApprovals {
			f.dropApproval(func(o Approval) bool { return o.Module == p.Module },
				"a module", lim.moduleApprovals, "reconcile.MaxModuleApprovals")
		}
		if len(s.Approvals) >= lim.approvals {
			f.dropApproval(nil, "a node", lim.approvals, "reconcile.MaxApprovals")
		}
	}
	s.Approvals = upsert(s.Approvals, a, compareApproval, func(Approval) bool { return false })
	f.compose()
}

// dropApproval drops the oldest approval among those of (all when nil),
// preferring one of a build the want does not ask for, and journals it at
// warn: one more approval would pass the cap max, named name.
func (f *folder) dropApproval(of func(Approval) bool, whose string, max int, name string) {
	s := f.s
	wanted := func(a Approval) bool {
		return s.Want != nil && slices.ContainsFunc(s.Want.Modules, func(m events.WantModule) bool {
			return m.Name == a.Module && m.Build == a.Build
		})
	}
	seq := func(a Approval) uint64 { return a.Seq }
	i := oldest(s.Approvals, seq, func(a Approval) bool { return wanted(a) || (of != nil && !of(a)) })
	if i < 0 {
		i = oldest(s.Approvals, seq, func(a Approval) bool { return of != nil && !of(a) })
	}
	if i < 0 {
		return
	}
	old := s.Approvals[i]
	s.Approvals = slices.Delete(s.Approvals, i, i+1)
	f.journal(events.LevelWarn, "approval #%d of %s at build %s dropped: %s keeps at most %d approvals (%s); going back to that build needs a new approval",
		old.Seq, events.Short(old.Module), events.Short(old.Build), whose, max, name)
}

func (f *folder) have(p *events.Have) {
	h := &HaveRecord{Seq: f.ev.Seq, Time: f.ev.Time, Modules: kept(p.Modules)}
	h.HealthSince = healthSince(f.s.Have, h)
	f.s.Crashes = crashes(f.s.Crashes, f.s.Have, h)
	f.s.Have = h
	if a := f.s.Agent; a != nil && !a.Up {
		// Only a live agent publishes a have: it is up again on its
		// first, whenever its lease's up is recorded (DESIGN.md §11).
		// Whether it is a new agent, which knocks, the up naming its
		// claim tells (agent).
		f.s.Agent = &AgentRecord{Up: true, Seq: f.ev.Seq, Time: f.ev.Time}
		f.s.AgentWas = a.Claim
	}
	f.compose()
	if p.NoPlan {
		f.planAgain(p.LookedBefore, "the node's agent started with no plan (the stream's --max-age removed it?)")
	}
	f.knock(true)
	f.missing(p.Missing, p.Started)
}

// missing takes in the files a have reports missing on the node
// (events.Have.Missing: in place before, deleted there since: a crash, a
// reboot with /run on a tmpfs, an rm) and knocks, with reason missing,
// when one of them is newly reported: not reported by the previous have
// since it was last filled. So the module that crash-loops on it has it
// back within a fill, not at the provisioner's resync (a fresh user's
// finding U21; DESIGN.md §1: a node never crash-loops on a missing
// credential nobody asked to rewrite). Only files of the settled plan
// (what the agent judges writes by) that a filled reported before count:
// a file never filled is the settle's knock's to fill (owed items, and
// `state`'s unfilled line, say it), and the agent reports every declared
// file it finds missing, those too. Bounded: a file reported again
// knocks nothing, so a provisioner that cannot fill it (no source: its
// fill status says why, and its own retry tries again) is asked once,
// not at every crash of the module; only a filled of it, or a have
// without it, lets a later report knock again. Nothing is paid (as a
// poke). A retiring node keeps no record and is not knocked (its plan
// is empty); a have that knocked for owed items already knocks no second
// time (every knock fills every file).
//
// A file gone at the agent's start (events.MissingFile.AtStart: a
// reboot or re-image emptied /run), reported under its claim (started),
// is recorded marked so; when it is fresh, the have knocks only if the
// agent's start has not (startKnock): one knock for the start, at this
// have or at the agent's up, whichever is folded first (an earlier agent
// reported none of them, and its have raced the up's knock into a second
// one). Such a report of a file whose newest filled was written by the
// same agent (FilledMark.Claim) is stale: the agent looked before that
// write, so the file is back, or was never there before this agent (a
// fresh node, incident 1: the settle's knock filled it); it is neither
// recorded nor knocked for, in whatever order the up, the have and the
// filled are folded.
func (f *folder) missing(reported []events.MissingFile, started string) {
	s := f.s
	if s.Retire != nil {
		s.Missing = nil
		return
	}
	var out []MissingFile
	gone, atStart := false, false // a fresh report: deleted in the agent's life, gone at its start
	for _, m := range reported {
		if !s.settledDeclares(m.Module, m.Path) {
			continue
		}
		i, filled := slices.BinarySearchFunc(s.Filled, FilledMark{Module: m.Module, Path: m.Path}, compareFilled)
		if !filled || m.AtStart && s.Filled[i].Claim == started {
			continue
		}
		r := MissingFile{Module: m.Module, Path: m.Path, Seq: f.ev.Seq, Time: f.ev.Time, AtStart: m.AtStart}
		if i, found := slices.BinarySearchFunc(s.Missing, r, compareMissing); found {
			r = s.Missing[i]
		} else if m.AtStart {
			atStart = true
		} else {
			gone = true
		}
		out = append(out, r)
	}
	slices.SortFunc(out, compareMissing)
	s.Missing = slices.CompactFunc(out, func(a, b MissingFile) bool { return compareMissing(a, b) == 0 })
	if !gone && !atStart {
		return
	}
	// The start knocks once, here or by the knock this have made for
	// owed items (every knock fills every file), unless its up did.
	start := atStart && f.startKnock(started)
	if f.n[1] > 0 || !gone && !start {
		return
	}
	reasons := []events.KnockReason{events.KnockMissing}
	s.LastKnock = &KnockRecord{Cause: f.ev.Seq, Reasons: reasons, Owed: []events.Owed{}}
	f.emit(events.KindKnock, &events.Knock{Cause: f.ev.Seq, Reasons: reasons, Owed: []events.Owed{}})
}

// pruneMissing drops the missing files the settled plan no longer
// declares (a module removed, a file dropped).
func (s *State) pruneMissing() {
	s.Missing = slices.DeleteFunc(s.Missing, func(m MissingFile) bool { return !s.settledDeclares(m.Module, m.Path) })
	if len(s.Missing) == 0 {
		s.Missing = nil
	}
}

// settledDeclares reports whether the settled plan declares path for
// module.
func (s *State) settledDeclares(module, path string) bool {
	if s.Settled == nil {
		return false
	}
	row := s.Settled.Row(module)
	return row != nil && declares(row.Files, path)
}

// planAgain answers a have of an agent that holds no plan (it found none
// in the stream at its start and settled none since) while this
// reconciler emitted one: the node's last plan is published again, and
// the shell signs it, so that the agent and the provisioner, which read
// the node's newest plan from the stream, find it again. The stream's
// max-age removes a quiet node's plan (every event of it older than the
// age); the node's next reboot lost what /run held, and nothing else
// would publish a plan until the want changed: the credentials were never
// filled again, every view green (a fresh user's finding U28). Bounded:
// nothing is published while a plan published again is unsettled (on its
// way, or refused: the agent says so once it applies it), nor while the
// last plan emitted is not yet in the stream (Seq 0: on its way), nor
// for a retired node, nor when the last plan was published after the
// agent looked for one (at or after looked, the have's LookedBefore; 0
// when the agent does not say): the agent started before it and gets it from its
// follow; its have sent before it takes that plan (an older agent's,
// until the plan settles) still says no plan, which is not a lost plan (a fresh user's finding V1: the first plan of 4 nodes
// of 8 was published twice, with this warning).
func (f *folder) planAgain(looked uint64, why string) {
	s := f.s
	last := s.Emitted()
	if last == nil || last.Seq == 0 || s.Retire != nil && s.Retire.Retired {
		return
	}
	if looked != 0 && last.Seq >= looked {
		return
	}
	if last.Again && slices.Contains(s.Unsettled, last) {
		return
	}
	f.journal(events.LevelWarn, "plan %d published again (cause %d): %s", last.Seq, f.ev.Seq, why)
	f.emitRecord(&PlanRecord{Cause: f.ev.Seq, Want: last.Want, Account: last.Account, Modules: slices.Clone(last.Modules), Again: true})
}

// crashes returns the crash records after the have h, given those
// before it and the previous have: a module that ran in prev and, in h,
// failed or runs with more restarts, at the same build, crashed after
// running, at h's time; each module keeps its last FlapRestarts such
// times, of the build h runs: a crash belongs to the build that crashed,
// and a module h lists at another build than its record's starts with
// none (a fresh user's finding F2: a revert's build was called flapping
// for the crashes of the build it replaced). A record of a snapshot
// written before records named their build (Build "") is taken as of
// prev's build. Modules h does not list are dropped.
func crashes(old []Crashes, prev, h *HaveRecord) []Crashes {
	var out []Crashes
	for _, m := range h.Modules {
		var p *events.HaveModule
		if prev != nil {
			if j := slices.IndexFunc(prev.Modules, func(o events.HaveModule) bool { return o.Name == m.Name }); j >= 0 {
				p = &prev.Modules[j]
			}
		}
		var times []time.Time
		if i := slices.IndexFunc(old, func(c Crashes) bool { return c.Module == m.Name }); i >= 0 {
			if b := old[i].Build; b == m.Build || b == "" && p != nil && p.Build == m.Build {
				times = old[i].Times
			}
		}
		if p != nil && p.Build == m.Build && p.State == events.Running &&
			(m.State == events.Failed || m.State == events.Running && m.Restarts > p.Restarts) {
			times = append(slices.Clone(times), h.Time)
			if len(times) > FlapRestarts {
				times = times[len(times)-FlapRestarts:]
			}
		}
		if len(times) > 0 {
			out = append(out, Crashes{Module: m.Name, Build: m.Build, Times: times})
		}
	}
	slices.SortFunc(out, func(a, b Crashes) int { return strings.Compare(a.Module, b.Module) })
	return out
}

// healthSince returns, for each module of the new have h, the stream
// time since which its health says what it says: the previous have's
// time for it when that have said the same of the same run of the module
// ([sameRun]), else h's; nil when no module of h reports health. A new
// process is not healthy until its own check says so: a have that
// reports a restarted module healthy (an on_fill restart whose first
// check passed before the agent's next have) starts its stretch afresh,
// at that have, where it read "healthy since" the previous process's
// stretch (a fresh user's finding m4: "healthy … 7m ago" the moment the
// process started). The have's time, not the run's since, starts it:
// the run's since is the agent's clock and comes before its first pass,
// and the stretch never says healthy longer than a have did.
func healthSince(prev, h *HaveRecord) []time.Time {
	if !slices.ContainsFunc(h.Modules, func(m events.HaveModule) bool { return m.Health != "" }) {
		return nil
	}
	out := make([]time.Time, len(h.Modules))
	for i, m := range h.Modules {
		if m.Health == "" {
			continue
		}
		out[i] = h.Time
		if prev == nil || len(prev.HealthSince) != len(prev.Modules) {
			continue
		}
		if j := slices.IndexFunc(prev.Modules, func(o events.HaveModule) bool { return o.Name == m.Name }); j >= 0 &&
			prev.Modules[j].Health == m.Health && sameRun(prev.Modules[j], m) && !prev.HealthSince[j].IsZero() {
			out[i] = prev.HealthSince[j]
		}
	}
	return out
}

// sameRun reports whether have module b is the process a was: the same
// build, the same since (a crash's restart and an on_fill restart each
// set a new one) and neither restart count grown (an agent older than
// the on_fill since rule only counted its fill restarts).
func sameRun(a, b events.HaveModule) bool {
	sameSince := a.Since == nil && b.Since == nil || a.Since != nil && b.Since != nil && a.Since.Equal(*b.Since)
	return a.Build == b.Build && sameSince && b.Restarts <= a.Restarts && b.FillRestarts <= a.FillRestarts
}

// agent records the node's agent up or down (DESIGN.md §11 "Liveness"):
// the event itself is the record `audit` and `fleet` read. It emits only
// the knock of an agent back (agentBack): an up of a claim other than the
// one recorded (up or down) before it. An up after a have already
// brought the agent back keeps that have's moment, the earlier sign of
// life, and knocks when its claim is not the one recorded down before
// that have (AgentWas; none: a state of a build that knocked at the have).
func (f *folder) agent(p *events.Agent) {
	up := p.State == events.AgentUp
	if a := f.s.Agent; up && a != nil && a.Up && a.Claim == "" {
		was := f.s.AgentWas
		a.Claim, a.Host, a.PID = p.Claim, p.Host, p.PID
		f.s.AgentWas = ""
		if was != "" && was != p.Claim {
			f.agentBack(p.Claim)
		}
		return
	}
	f.s.AgentWas = ""
	again := up && f.s.Agent != nil && f.s.Agent.Claim != p.Claim
	f.s.Agent = &AgentRecord{Up: up, Seq: f.ev.Seq, Time: f.ev.Time, Claim: p.Claim, Host: p.Host, PID: p.PID, Why: p.Why}
	if again {
		f.agentBack(p.Claim)
	}
}

// agentBack knocks with reason agent when a new agent of the node comes
// up after an agent of it was recorded (a restart, a reboot, a
// replacement): at the up of a claim other than the one recorded before
// it, whether a have brought the agent back first or not (the new
// agent's have can be stored before its up). A claim is one process's: a
// claim that expired and is claimed again (the agent lost its server, not
// its files) is not a new agent, nor the have of such an agent after its
// down, and knocks nothing; a flapping lease, or every lease of a server
// that stalled past the TTL, knocked every node with files once a flap
// (a reviewer's finding). The first up of a node is not: its up can be
// folded after the settles of the very agent that made it, and no agent
// ran before it to lose anything. It knocks when the settled plan
// declares files: the node may have lost them (/run is a tmpfs), and a
// module needing one would crash-loop until the provisioner's resync
// (DESIGN.md §1: a node never crash-loops on a missing credential nobody
// asked to rewrite). A fill of content the node already holds changes
// nothing there. It pays no owed item, as a poke; a retiring node is not
// knocked (its plan is empty). docs/architecture.md records the rule.
//
// claim is the new agent's: a start its first have knocked for already
// (files gone at the start, folded before this up) knocks no second time
// (startKnock).
func (f *folder) agentBack(claim string) {
	s := f.s
	if f.n[1] > 0 {
		return // this event knocked already: every knock fills every file
	}
	if s.Retire != nil || s.Settled == nil || !events.DeclaresFiles(s.Settled.Modules) {
		return
	}
	if !f.startKnock(claim) {
		return
	}
	reasons := []events.KnockReason{events.KnockAgent}
	s.LastKnock = &KnockRecord{Cause: f.ev.Seq, Reasons: reasons, Owed: []events.Owed{}}
	f.emit(events.KindKnock, &events.Knock{Cause: f.ev.Seq, Reasons: reasons, Owed: []events.Owed{}})
}

// startKnock reports whether the start of the agent of claim may knock,
// and notes that it has: once an agent's start, whether its up
// (agentBack) or its have reporting the files gone at its start
// (missing) is folded first; every knock fills every file, so the
// second would only fill again what the first did.
func (f *folder) startKnock(claim string) bool {
	if f.s.StartKnocked == claim {
		return false
	}
	f.s.StartKnocked = claim
	return true
}

// prov records the node's provisioner client up or down (its lease, as
// the reconciler saw it). It emits nothing: a knock waits in the stream
// for the next provisioner, which fills everything on start and answers
// the newest knock (docs/design.md §11 "Liveness").
//
// An up recorded while the stream held no plan of the node (NoPlan: the
// stream's --max-age removed it) is answered as an agent's have that says
// so (planAgain, with its bounds): the provisioner that came up found no
// plan to fill by, and while the agent runs on with its plan nothing else
// would publish one until the want changed: a knock for a file deleted on
// the node, a sealed put, filled nothing (provfix). An up recorded while
// the node's newest plan was signed by a key the reconciler no longer
// signs with (OldKey: a rotation's retired key, which a provisioner
// started after the rotation's --finish refuses) is answered the same
// way: the plan published again is signed with the current key.
func (f *folder) prov(p *events.Prov) {
	f.s.Provisioner = &AgentRecord{Up: p.State == events.AgentUp, Seq: f.ev.Seq, Time: f.ev.Time, Claim: p.Claim,
		Host: p.Host, PID: p.PID, Why: p.Why}
	switch {
	case p.State != events.AgentUp:
	case p.NoPlan:
		f.planAgain(p.LookedBefore, "the node's provisioner started with no plan (the stream's --max-age removed it?)")
	case p.OldKey:
		f.planAgain(p.LookedBefore, "the node's provisioner started while the node's newest plan was signed by a key this reconciler no longer signs with (a rotated key, which it may not trust): published under the current key")
	}
}

func (f *folder) settle(p *events.Settle) {
	s := f.s
	if !f.planExists(p.Plan) {
		return
	}
	if p.Op == events.OpFailed {
		// The plan does not count as settled; the node keeps judging by
		// its previous one.
		// A failed settle with no module is the plan's as a whole (the
		// agent refused it, or failed before any module): no empty name.
		if p.Module == "" {
			f.journal(events.LevelError, "apply of plan %d failed for the plan as a whole: %s", p.Plan, events.ErrorText(p.Error))
		} else {
			f.journal(events.LevelError, "apply of plan %d failed for module %q: %s", p.Plan, p.Module, events.ErrorText(p.Error))
		}
		f.failed(p)
		if p.Untrusted && p.Module == "" {
			f.resign(p)
		}
		f.knock(true)
		return
	}
	if s.Settled != nil && p.Plan < s.Settled.Seq {
		return // an older plan than the newest settled: changes nothing
	}
	if s.Settled != nil && p.Plan == s.Settled.Seq && len(s.Failed) > 0 {
		// The settled plan applied again (an agent that lost its state
		// re-applies its newest plan) and it held this time: its failed
		// re-apply no longer says anything (a fresh user's finding 1).
		s.Failed = slices.DeleteFunc(s.Failed, func(fa FailedApply) bool { return fa.Plan <= p.Plan })
	}
	if s.Settled == nil || p.Plan > s.Settled.Seq {
		i := slices.IndexFunc(s.Unsettled, func(r *PlanRecord) bool { return r.Seq == p.Plan })
		if i < 0 {
			if j, dropped := slices.BinarySearch(s.Dropped, p.Plan); dropped {
				// A plan whose record the cap dropped after its event was
				// read: newer plans were emitted after it, and the node
				// follows its plans in stream order, so it applies a newer
				// one next (issue 25), and never one older than this.
				s.Dropped = slices.Delete(s.Dropped, 0, j)
				f.journal(events.LevelInfo, "settle %d not folded: plan %d is superseded by a newer plan of the node, which it applies next (its record was dropped: a node keeps at most %d unsettled plans, reconcile.MaxUnsettled)",
					f.ev.Seq, p.Plan, s.limits().unsettled)
				return
			}
			f.reject("names sequence %d, which is no plan emitted for this node after the settled one", p.Plan)
			return
		}
		// The whole plan counts as settled from the first settle naming it.
		prev := s.Settled
		s.Settled = s.Unsettled[i]
		if s.Unsettled = slices.Delete(s.Unsettled, 0, i+1); len(s.Unsettled) == 0 {
			// A settled node's usual case: no array of one cleared
			// pointer kept per node (issue 27, objects a state).
			s.Unsettled = nil
		}
		s.Dropped = slices.DeleteFunc(s.Dropped, func(seq uint64) bool { return seq <= s.Settled.Seq })
		s.place(prev, f.ev)
		s.Failed = slices.DeleteFunc(s.Failed, func(fa FailedApply) bool { return fa.Plan <= s.Settled.Seq })
		f.accept()
		f.payUnwanted()
		s.pruneMissing()
		f.compose()
		f.retired()
	}
	f.knock(true)
}

// failed records p, a failed settle, as its module's newest failed apply
// when its plan is the settled one or above it; past MaxFailed the record
// of the oldest settle is dropped. A failure of the settled plan itself
// is an agent that re-applied it (it lost its state: a reimaged node) and
// could not: the plan still counts as settled (DESIGN.md §4, the first
// settle naming it), but what runs does not hold it, so it is recorded
// as any failed apply is, and cleared as one is: by a settle of that plan
// or a newer one, or a want without its module (a fresh user's finding
// 1: the node looked healthy once its journal was acknowledged).
// A failure of an older plan records nothing.
func (f *folder) failed(p *events.Settle) {
	s := f.s
	if s.Settled != nil && p.Plan < s.Settled.Seq {
		return
	}
	fa := FailedApply{Module: p.Module, Plan: p.Plan, Seq: f.ev.Seq, Time: f.ev.Time, Error: events.Cut(events.ErrorText(p.Error), MaxFailedError)}
	i, found := slices.BinarySearchFunc(s.Failed, fa, compareFailed)
	if found {
		if s.Failed[i].Plan > fa.Plan {
			return // a failure of an older plan than the one recorded
		}
		s.Failed[i] = fa
		return
	}
	if len(s.Failed) >= MaxFailed {
		j := oldest(s.Failed, func(fa FailedApply) uint64 { return fa.Seq }, nil)
		s.Failed = slices.Delete(s.Failed, j, j+1)
		i, _ = slices.BinarySearchFunc(s.Failed, fa, compareFailed)
	}
	s.Failed = slices.Insert(s.Failed, i, fa)
}

// accept records the newly settled plan as the newest that accepts each
// of its files from its provisioner account. A record one more would take
// past the accepting cap drops the one of the oldest plan (never one of
// this plan's files, whose records are all of this plan); the drops of one
// settle are journaled once, at info.
func (f *folder) accept() {
	s := f.s
	if s.Settled.Account == "" {
		return
	}
	plan := func(a Accepting) uint64 { return a.Plan }
	ours := func(a Accepting) bool { return a.Plan == s.Settled.Seq }
	dropped, oldestPlan := 0, uint64(0)
	for _, row := range s.Settled.Modules {
		for _, file := range row.Files {
			if _, refused := Judge(s.Settled.Account, s.Settled.Modules, row.Name, file.Path, s.Settled.Account); refused != "" {
				continue
			}
			a := Accepting{Module: row.Name, Path: file.Path, Account: s.Settled.Account, Plan: s.Settled.Seq}
			if _, found := slices.BinarySearchFunc(s.Accepting, a, compareAccepting); !found && len(s.Accepting) >= s.limits().accepting {
				if i := oldest(s.Accepting, plan, ours); i >= 0 {
					if dropped == 0 {
						oldestPlan = s.Accepting[i].Plan
					}
					dropped++
					s.Accepting = slices.Delete(s.Accepting, i, i+1)
				} else {
					continue // every record is of this plan: the cap holds no more
				}
			}
			s.Accepting = upsert(s.Accepting, a, compareAccepting, func(Accepting) bool { return true })
		}
	}
	if dropped > 0 {
		f.journal(events.LevelInfo, "%d accepting records dropped, the oldest of plan %d: the node keeps at most %d (reconcile.MaxAccepting); a refusal judged by a plan that old is not knocked",
			dropped, oldestPlan, s.limits().accepting)
	}
}

// place updates, for each file the newly settled plan declares for a
// module it runs (a row with a build), the settled plan since which it has
// been declared so, and that settle's stream time: kept when the previous
// settled plan declared it for the module running too (a new build keeps
// the module's files on disk), else this plan. A file no longer declared,
// or of a row that runs nothing, is dropped: removing a module deletes its
// files (DESIGN.md §8), so declaring it again places it anew.
func (s *State) place(prev *PlanRecord, ev events.Event) {
	var placed []Placement
	for _, row := range s.Settled.Modules {
		if row.Build == "" {
			continue
		}
		var old *events.PlanModule
		if prev != nil {
			old = prev.Row(row.Name)
		}
		for _, f := range row.Files {
			p := Placement{Module: row.Name, Path: f.Path, Plan: s.Settled.Seq, Seq: ev.Seq, Time: ev.Time}
			if old != nil && old.Build != "" && declares(old.Files, f.Path) {
				if i, found := slices.BinarySearchFunc(s.Placed, p, comparePlacement); found {
					p = s.Placed[i]
				} else {
					// Declared before this state recorded placements (a
					// snapshot older than the field): placed at no known
					// plan, so any fill of it counts.
					p.Plan, p.Seq, p.Time = 0, 0, time.Time{}
				}
			}
			placed = append(placed, p)
		}
	}
	slices.SortFunc(placed, comparePlacement)
	s.Placed = placed
}

func (f *folder) refusal(p *events.Refusal) {
	s := f.s
	if !f.planExists(p.Plan) {
		return
	}
	if s.Retire != nil || s.waived(p.Module, p.Path, p.Plan) {
		// A retiring node owes nothing (DESIGN.md §9), nor does a file
		// waived at this plan or a newer one.
		return
	}
	if why := s.Unwanted(p.Module, p.Path); why != "" {
		// A want removed its module or file, which pays its items
		// (takeWant): a refusal folded after that want owes nothing
		// either, as it would had it folded before it. Owed, it stayed in
		// fleet's NEEDS, stuck after an hour, until a waive (a fresh
		// user's finding U18). docs/architecture.md records the rule.
		f.journal(events.LevelInfo, "refusal %d of %s (%s, %s, plan %d) owes nothing: %s",
			f.ev.Seq, events.Short(p.Path), events.Short(p.Module), p.Reason, p.Plan, why)
		return
	}
	it := Item{Owed: events.Owed{Module: p.Module, Path: p.Path, Reason: p.Reason, Plan: p.Plan, Writer: p.Writer}, Seq: f.ev.Seq, Time: f.ev.Time}
	if p.Error != "" {
		// Cut in the middle: the node's cause is at the error's end
		// ("…: no space left on device"), after a path that can take
		// the whole budget (a fresh user's finding: `state` showed the
		// path and cut the cause).
		it.Why = events.CutMiddle(events.ErrorText(p.Error), MaxWhy)
	}
	if !f.paidByFilled(it) {
		// An unpaid item reported again adds nothing; items are never
		// replaced.
		if _, found := slices.BinarySearchFunc(s.Owed, it, compareItem); !found && len(s.Owed) >= s.limits().owed {
			i := oldest(s.Owed, func(it Item) uint64 { return it.Seq }, nil)
			old := s.Owed[i]
			s.Owed = slices.Delete(s.Owed, i, i+1)
			f.journal(events.LevelWarn, "owed item of %s (%s, refusal #%d) dropped: the node owes at most %d items (reconcile.MaxOwed); the file waits for the provisioner's next refill",
				events.Short(old.Path), events.Short(old.Module), old.Seq, s.limits().owed)
		}
		s.Owed = upsert(s.Owed, it, compareItem, func(Item) bool { return false })
	}
	f.knock(false)
}

// Unwanted says why an owed item of module's path is no operator's need
// any more: the node's newest want no longer declares the file (it has no
// such module, or the module no such file) while a settled plan did (an
// accepting record of it stands): a want removed it, and removing a
// module or file pays its items (DESIGN.md §4). It is "" when the want
// declares the file, and for a file no settled plan declared: a write
// ahead of the want that will declare it is owed (incident 1).
func (s *State) Unwanted(module, path string) string {
	if s.Want == nil {
		return ""
	}
	i, _ := slices.BinarySearchFunc(s.Accepting, Accepting{Module: module, Path: path}, compareAccepting)
	if i == len(s.Accepting) || s.Accepting[i].Module != module || s.Accepting[i].Path != path {
		return ""
	}
	plan := s.Accepting[i].Plan
	for _, a := range s.Accepting[i+1:] {
		if a.Module != module || a.Path != path {
			break
		}
		plan = max(plan, a.Plan)
	}
	j := slices.IndexFunc(s.Want.Modules, func(m events.WantModule) bool { return m.Name == module })
	if j < 0 {
		return fmt.Sprintf("want #%d removed module %s (settled plan %d declared the file)", s.Want.Seq, events.Short(module), plan)
	}
	if !declares(s.Want.Modules[j].Files, path) {
		return fmt.Sprintf("want #%d removed the file from %s (settled plan %d declared it)", s.Want.Seq, events.Short(module), plan)
	}
	return ""
}

// payUnwanted pays, without a knock, the owed items of files the newest
// want no longer declares that a settled plan has now accepted
// ([State.Unwanted]): a refusal folded after the want that removed its
// file owes nothing, so one folded before the settle that records the
// file's acceptance owes nothing after it either, whichever comes first.
// Each is journaled at info.
func (f *folder) payUnwanted() {
	s := f.s
	s.Owed = slices.DeleteFunc(s.Owed, func(it Item) bool {
		why := s.Unwanted(it.Module, it.Path)
		if why != "" {
			f.journal(events.LevelInfo, "owed item of %s (%s, refusal #%d, plan %d) paid without a knock: %s",
				events.Short(it.Path), events.Short(it.Module), it.Seq, it.Plan, why)
		}
		return why != ""
	})
}

// paidByFilled reports whether a filled that came before it pays it: one
// at a newer plan, or at the same plan unless it is a write failure (a
// newer failure than that filled).
func (f *folder) paidByFilled(it Item) bool {
	i, found := slices.BinarySearchFunc(f.s.Filled, FilledMark{Module: it.Module, Path: it.Path}, compareFilled)
	if !found {
		return false
	}
	fp := f.s.Filled[i].Plan
	return it.Plan < fp || (it.Plan == fp && it.Reason != events.ReasonWriteFailed)
}

func (f *folder) filled(p *events.Filled) {
	s := f.s
	if !f.planExists(p.Plan) {
		return
	}
	m := FilledMark{Module: p.Module, Path: p.Path, Plan: p.Plan}
	if _, found := slices.BinarySearchFunc(s.Filled, m, compareFilled); !found && len(s.Filled) >= s.limits().filled {
		i := oldest(s.Filled, func(m FilledMark) uint64 { return m.Plan }, nil)
		old := s.Filled[i]
		s.Filled = slices.Delete(s.Filled, i, i+1)
		f.journal(events.LevelInfo, "filled mark of %s (%s) at plan %d dropped: the node keeps at most %d (reconcile.MaxFilled); a late refusal judged by an older plan is knocked once more",
			events.Short(old.Path), events.Short(old.Module), old.Plan, s.limits().filled)
	}
	s.Filled = upsert(s.Filled, m, compareFilled, func(old FilledMark) bool { return old.Plan < m.Plan })
	// Who wrote it last, at whatever plan (folder.missing).
	i, _ := slices.BinarySearchFunc(s.Filled, m, compareFilled)
	s.Filled[i].Claim = p.Claim
	// Items that arrived before it, at its plan or older, are paid.
	s.Owed = slices.DeleteFunc(s.Owed, func(it Item) bool {
		return it.Module == p.Module && it.Path == p.Path && it.Plan <= p.Plan
	})
	// The file is in place again.
	if i, found := slices.BinarySearchFunc(s.Missing, MissingFile{Module: p.Module, Path: p.Path}, compareMissing); found {
		if s.Missing = slices.Delete(s.Missing, i, i+1); len(s.Missing) == 0 {
			s.Missing = nil
		}
	}
}

func (f *folder) plan(p *events.Plan) {
	s := f.s
	for i, r := range s.Unsettled {
		if r.Seq == 0 && r.Cause == p.Cause {
			r.Seq = f.ev.Seq
			s.NewestPlan = f.ev.Seq
			s.dropSkipped(i)
			return
		}
	}
	if !f.ev.OldKey && s.droppedPlan(p.Cause) {
		// Signed with the current key, so emitted by this fold at its
		// cause (the fold is deterministic); its record was dropped past
		// the cap before its event was read (issue 25). The node may apply
		// and settle it like any other plan: recorded again, from the
		// event, as it was emitted.
		s.rebind(p, f.ev.Seq)
		return
	}
	if f.ev.OldKey {
		// A plan of a key the reconciler no longer signs with (a retired
		// key) that binds to nothing it emitted: foreign as a forgery is,
		// since the node may have applied it (issue 24).
		f.foreignPlan(fmt.Sprintf("its cause %d matches no plan this reconciler emitted and has not yet folded", p.Cause))
		return
	}
	// Signed with the current key, and not a plan the fold is waiting
	// for: a copy of one of its plans already read (published again past
	// the dedup window, or replayed by a publisher of the node's plan
	// subject). Journaled only: publishing the last plan again would add
	// an unsettled record per such copy (the loop TestChaos found after
	// kill -9, eb06fc9). A node agent refuses a plan whose cause is not
	// newer than the plan it settled.
	f.reject("signed with this reconciler's key, but its cause %d is no plan it waits for (a copy of an older plan, published again or replayed); the node's agent refuses it if it settled a newer plan: `meshfold audit %s` shows whether it applied it",
		p.Cause, s.Node)
}

// dropSkipped drops the unbound records emitted before Unsettled[i], which
// has just bound: plans are published in the order they are emitted, so
// such a plan was never published (the shell skipped it as superseded,
// DESIGN.md §3).
func (s *State) dropSkipped(i int) {
	kept := s.Unsettled[:0]
	for j, o := range s.Unsettled {
		if o.Seq != 0 || j >= i {
			kept = append(kept, o)
		}
	}
	clear(s.Unsettled[len(kept):])
	s.Unsettled = kept
}

// droppedPlan reports whether a plan event of the current key whose cause
// binds to no unsettled record is one the fold emitted and whose record the
// unsettled cap dropped before the event was read: its cause lies after the
// newest plan whose event was folded (a bound record, else the settled
// plan) and before the last plan emitted, whose event is still to come.
// Plans are published in the order they are emitted, so every plan of such
// a cause was unbound when it was dropped, and the plans emitted after it
// follow it in the stream; a copy of a plan already read has a cause at or
// below the newest one folded.
func (s *State) droppedPlan(cause uint64) bool {
	last := s.Emitted()
	if last == nil || last.Seq != 0 || cause >= last.Cause {
		return false
	}
	var floor uint64
	if s.Settled != nil {
		floor = s.Settled.Cause
	}
	for _, r := range s.Unsettled {
		if r.Seq != 0 {
			floor = r.Cause
		}
	}
	return cause > floor
}

// rebind records p, a plan of the fold's own whose record the cap dropped
// (droppedPlan), as bound at seq: after the bound records, before the
// unbound ones emitted after it. The unbound ones emitted before it are
// dropped, as when a plan binds (dropSkipped). Past the cap, one record is
// dropped again, never this one nor the last emitted ([State.dropPlan]).
func (s *State) rebind(p *events.Plan, seq uint64) {
	s.Unsettled = slices.DeleteFunc(s.Unsettled, func(o *PlanRecord) bool { return o.Seq == 0 && o.Cause < p.Cause })
	r := &PlanRecord{Seq: seq, Cause: p.Cause, Want: p.Want, Account: p.ProvisionerAccount, Modules: slices.Clone(p.Modules)}
	i := slices.IndexFunc(s.Unsettled, func(o *PlanRecord) bool { return o.Seq == 0 })
	s.Unsettled = slices.Insert(s.Unsettled, i, r)
	s.NewestPlan = seq
	if len(s.Unsettled) > s.limits().unsettled {
		s.dropPlan(len(s.Unsettled) - 1)
	}
}

// pause holds plans back (DESIGN.md §9). A pause while paused keeps the
// first one: who paused, and since when.
func (f *folder) pause(p *events.Pause) {
	if f.s.Paused == nil {
		f.s.Paused = &PauseRecord{Seq: f.ev.Seq, Time: f.ev.Time, By: p.By, Reason: p.Reason}
	}
}

// resume ends a pause; the plan composed now is published if it differs
// from the last one emitted (compose's one rule), so once.
func (f *folder) resume(*events.Resume) {
	if f.s.Paused == nil {
		return
	}
	f.s.Paused = nil
	f.compose()
}

// poke knocks with reason operator: the provisioner client fills every
// file again. It pays no owed item (a refill the node refuses again is
// reported again, and an item becomes due only when a plan accepts it).
func (f *folder) poke(*events.Poke) {
	reasons := []events.KnockReason{events.KnockOperator}
	f.s.LastKnock = &KnockRecord{Cause: f.ev.Seq, Reasons: reasons, Owed: []events.Owed{}}
	f.emit(events.KindKnock, &events.Knock{Cause: f.ev.Seq, Reasons: reasons, Owed: []events.Owed{}})
}

// revoke removes the approval of module at build. Compose decides the
// rest with its one hold rule: a module held for that approval stays
// held; one already running that build is not held (its wanted build is
// what runs), so it is not stopped.
func (f *folder) revoke(p *events.Revoke) {
	s := f.s
	s.Approvals = slices.DeleteFunc(s.Approvals, func(a Approval) bool { return a.Module == p.Module && a.Build == p.Build })
	f.compose()
}

// waive pays the owed items of one file without a knock, and owes nothing
// for a refusal of it judged by any plan that exists now, whether that
// refusal arrives before or after the waive.
func (f *folder) waive(p *events.Waive) {
	s := f.s
	s.Owed = slices.DeleteFunc(s.Owed, func(it Item) bool { return it.Module == p.Module && it.Path == p.Path })
	w := Waiver{Module: p.Module, Path: p.Path, Plan: s.NewestPlan, By: p.By, Seq: f.ev.Seq}
	if _, found := slices.BinarySearchFunc(s.Waivers, w, compareWaiver); !found {
		// A loop, not one drop: a snapshot written before the cap may
		// hold more.
		for len(s.Waivers) >= s.limits().waivers {
			i := oldest(s.Waivers, func(w Waiver) uint64 { return w.Seq }, nil)
			old := s.Waivers[i]
			s.Waivers = slices.Delete(s.Waivers, i, i+1)
			f.journal(events.LevelWarn, "waiver #%d of %s (%s) at plan %d dropped: the node keeps at most %d (reconcile.MaxWaivers); a late refusal of that file judged by a plan it covered is owed again",
				old.Seq, events.Short(old.Path), events.Short(old.Module), old.Plan, s.limits().waivers)
		}
	}
	s.Waivers = upsert(s.Waivers, w, compareWaiver, func(old Waiver) bool { return old.Plan <= w.Plan })
}

// waived reports whether a waive covers a refusal of module's path judged
// by plan.
func (s *State) waived(module, path string, plan uint64) bool {
	i, found := slices.BinarySearchFunc(s.Waivers, Waiver{Module: module, Path: path}, compareWaiver)
	return found && plan <= s.Waivers[i].Plan
}

// ack records an operator's acknowledgement of the node's journal
// warnings up to p.Upto (0, or above the ack's own sequence: up to the
// ack itself). The record covering the most is kept: an ack of no more
// than it covers changes nothing, so the state holds one record however
// many acks come. It changes no plan, knock or owed item.
func (f *folder) ack(p *events.Ack) {
	upto := p.Upto
	if upto == 0 || upto > f.ev.Seq {
		upto = f.ev.Seq
	}
	if f.s.Ack != nil && f.s.Ack.Upto >= upto {
		return
	}
	f.s.Ack = &AckRecord{Seq: f.ev.Seq, Time: f.ev.Time, By: p.By, Upto: upto}
}

// retire empties the node's plan and pays every owed item; the node is
// retired once that plan settles, or at once when forced. A retire ends a
// pause: removing every module is what the operator asked for.
func (f *folder) retire(p *events.Retire) {
	s := f.s
	if s.Retire != nil && s.Retire.Retired {
		return // retired already
	}
	if s.Retire == nil || (p.Force && !s.Retire.Force) {
		s.Retire = &RetireRecord{Seq: f.ev.Seq, Time: f.ev.Time, By: p.By, Force: p.Force}
	}
	s.Owed = nil
	s.Paused = nil
	s.Missing = nil
	f.compose()
	if p.Force {
		s.Retire.Retired, s.Retire.RetiredSeq, s.Retire.RetiredTime = true, f.ev.Seq, f.ev.Time
		return
	}
	f.retired()
}

// retired completes a retirement once nothing the node was asked to run
// is left: every plan emitted has settled and the settled one has no row
// (or no plan was ever emitted).
func (f *folder) retired() {
	s := f.s
	r := s.Retire
	if r == nil || r.Retired || len(s.Unsettled) > 0 || (s.Settled != nil && len(s.Settled.Modules) > 0) {
		return
	}
	r.Retired, r.RetiredSeq, r.RetiredTime = true, f.ev.Seq, f.ev.Time
}

// resign answers an agent's refusal of the node's newest plan for its
// signer (p.Untrusted): the same plan is published again, and the shell
// signs it with the current key. After a key rotation whose overlap ended,
// an agent that restarts (a reboot) re-verifies its newest plan, of the old
// key, and refuses it; nothing else would publish a plan until the want
// changed, and the node ran nothing (a fresh user's finding G2). Only the
// newest plan is answered (an older one is superseded; a newer one is on
// its way), once: a plan published again this way and refused again means
// the agent does not trust the current key either, which the journal says.
func (f *folder) resign(p *events.Settle) {
	s := f.s
	last := s.Emitted()
	if last == nil || last.Seq != p.Plan {
		return
	}
	if last.Again {
		f.journal(events.LevelError, "plan %d, published again under this reconciler's key, refused again for its signer: the node's agent does not trust this reconciler's key. An agent reads its keys at its start only: restart it if its --trust-from directory's reconcilers.pub (or its --trust file) names this key now (a rotated or a new key); else they are another deployment's", p.Plan)
		return
	}
	f.journal(events.LevelWarn, "plan %d refused by the node's agent for its signer (a key it does not trust, or one retired past its overlap): published again under this reconciler's key (cause %d)", p.Plan, f.ev.Seq)
	f.emitRecord(&PlanRecord{Cause: f.ev.Seq, Want: last.Want, Account: last.Account, Modules: slices.Clone(last.Modules), Again: true})
}

// foreignPlan journals a plan event this reconciler did not emit, saying
// why it is not its own, and publishes its last emitted plan again.
func (f *folder) foreignPlan(why string) {
	s := f.s
	last := s.Emitted()
	if last == nil {
		f.journal(events.LevelError, "plan %d not emitted by this reconciler (%s): not folded; no plan of its own to publish again", f.ev.Seq, why)
		return
	}
	f.journal(events.LevelError, "plan %d not emitted by this reconciler (%s): not folded; its last plan (cause %d) is published again", f.ev.Seq, why, last.Cause)
	f.emitRecord(&PlanRecord{Cause: f.ev.Seq, Want: last.Want, Account: last.Account, Modules: slices.Clone(last.Modules)})
}

// compose recomposes the plan and emits it when it differs from the last
// plan emitted ([State.differs]); it journals the provisioner-account
// transition once (incident 3). While the node is paused it does neither:
// the want and approvals are in the state, and [State.View] shows what
// resuming would publish.
func (f *folder) compose() {
	s := f.s
	if s.Paused != nil {
		return
	}
	account, same := s.composesEmitted()
	if !same {
		var rows []events.PlanModule
		var ok bool
		if rows, account, ok = s.Compose(); !ok {
			return
		}
		f.emitPlan(rows, account)
	}
	running := s.runningAccountOfProvisioner()
	if s.Retire != nil || s.removesProvisioner() {
		// Removing every module is the point of a retirement, not the
		// account loss of incident 3; nor is a want that removes the
		// provisioner module itself and declares no file (the demo's
		// teardown, a want of none): nothing is left to write (a fresh
		// user's finding 3b). A want that keeps a file, or keeps the
		// module but drops its provisioner mark, is incident 3.
		running = ""
	}
	switch cond := account == "" && running != ""; {
	case cond && !s.AccountJournaled:
		s.AccountJournaled = true
		f.journal(events.LevelWarn, "plan names no provisioner account while what runs names %q: the node will refuse every filled write", running)
	case !cond:
		s.AccountJournaled = false
	}
}

// emitPlan emits a plan of rows and account when it differs from the last
// plan emitted ([State.differs]).
func (f *folder) emitPlan(rows []events.PlanModule, account string) {
	s := f.s
	if s.differs(rows, account) {
		f.emitRecord(&PlanRecord{Cause: f.ev.Seq, Want: s.Want.Seq, Account: account, Modules: rows})
	}
}

// emitRecord records r, a plan emitted at this event, as the newest
// unsettled one (making room past the cap, [State.roomForPlan]) and emits
// its plan event: the one way a plan is emitted (a composed plan, a plan
// published again after a foreign one or a refusal for its key).
func (f *folder) emitRecord(r *PlanRecord) {
	f.s.roomForPlan()
	f.s.Unsettled = append(f.s.Unsettled, r)
	f.emit(events.KindPlan, &events.Plan{Cause: r.Cause, Want: r.Want, ProvisionerAccount: r.Account, Modules: r.Modules})
}

// roomForPlan makes room for one more unsettled plan ([State.dropPlan]).
// Not journaled: a dropped plan's event, when read, records it again, and
// the node applies the newest plan it follows; a settle naming a dropped
// plan whose event was read is (at info while it is in Dropped).
func (s *State) roomForPlan() {
	if n := len(s.Unsettled); n > 0 && n >= s.limits().unsettled {
		s.dropPlan(n)
	}
}

// dropPlan drops one unsettled record: the oldest unbound one among the
// first end (its event, still to come, records it again: rebind), else the
// second oldest, keeping the oldest (the node may be applying it) and the
// newer ones (it applies the newest it follows). A bound record dropped
// leaves its sequence in Dropped, so that a settle naming it is known as
// a superseded plan's.
func (s *State) dropPlan(end int) {
	i := slices.IndexFunc(s.Unsettled[:end], func(r *PlanRecord) bool { return r.Seq == 0 })
	if i < 0 {
		i = min(1, len(s.Unsettled)-1)
	}
	if seq := s.Unsettled[i].Seq; seq != 0 {
		if j, found := slices.BinarySearch(s.Dropped, seq); !found {
			s.Dropped = slices.Insert(s.Dropped, j, seq)
		}
		if len(s.Dropped) > MaxDroppedPlans {
			s.Dropped = slices.Delete(s.Dropped, 0, 1)
		}
	}
	s.Unsettled = slices.Delete(s.Unsettled, i, i+1)
}

// knock publishes one knock carrying every due item, which pays them
// (DESIGN.md §4, "owe and knock"). An item is due when a settled plan newer
// than its own accepts it; a write-failed item also when writeFailedDue
// (the first settle or have after it).
func (f *folder) knock(writeFailedDue bool) {
	s := f.s
	var due []events.Owed
	s.Owed = slices.DeleteFunc(s.Owed, func(it Item) bool {
		if (writeFailedDue && it.Reason == events.ReasonWriteFailed) || s.accepting(it.Module, it.Path, it.Writer) > it.Plan {
			due = append(due, it.Owed)
			return true
		}
		return false
	})
	if len(due) == 0 {
		return
	}
	var reasons []events.KnockReason
	for _, it := range due {
		r := events.KnockReasonOf(it.Reason)
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	slices.Sort(reasons)
	s.LastKnock = &KnockRecord{Cause: f.ev.Seq, Reasons: reasons, Owed: due}
	f.emit(events.KindKnock, &events.Knock{Cause: f.ev.Seq, Reasons: reasons, Owed: due})
}

// accepting returns the newest settled plan that accepts writes of path
// for module from account, or 0.
func (s *State) accepting(module, path, account string) uint64 {
	i, found := slices.BinarySearchFunc(s.Accepting, Accepting{Module: module, Path: path, Account: account}, compareAccepting)
	if !found {
		return 0
	}
	return s.Accepting[i].Plan
}
