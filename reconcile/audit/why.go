package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// Link is an event a [Why] refers to.
type Link struct {
	Seq     uint64      `json:"seq"`
	Time    time.Time   `json:"time"`
	Kind    events.Kind `json:"kind"`
	Summary string      `json:"summary"`
}

// Why is the explanation of one event: the chain of earlier events that
// caused it, built by replaying the node's history through the fold. Its
// JSON field names are stable.
type Why struct {
	Node  string `json:"node"`
	Event Link   `json:"event"`
	// Cause is the event whose folding made a plan, knock or journal
	// entry.
	Cause *Link `json:"cause,omitempty"`
	// Want is the want a plan composes.
	Want *Link `json:"want,omitempty"`
	// Owed explains each item of a knock.
	Owed []OwedWhy `json:"owed,omitempty"`
	// Rows explains each row of a plan; Account its provisioner account;
	// Changes what differs from the plan before it.
	Rows    []RowWhy `json:"rows,omitempty"`
	Account string   `json:"account,omitempty"`
	Changes []string `json:"changes,omitempty"`
	// Effects are the plans, knocks and journal entries the event caused
	// (for an input event).
	Effects []Link `json:"effects,omitempty"`
	// Fate tells what became of a refusal's owed item.
	Fate string `json:"fate,omitempty"`
	// Replay says whether folding the cause again makes the same effect
	// as the one on the stream; a difference means the stream holds an
	// effect this build's rules would not make.
	Replay string `json:"replay,omitempty"`
	// Rollout is the rollout step that published a want (DESIGN.md §11):
	// why the node got it.
	Rollout *RolloutStep `json:"rollout,omitempty"`
	// Notes are everything else worth saying.
	Notes []string `json:"notes,omitempty"`
}

// OwedWhy explains one owed item of a knock.
type OwedWhy struct {
	events.Owed
	// Refusal is the refusal that made the item; Judged why it was
	// refused.
	Refusal *Link  `json:"refusal,omitempty"`
	Judged  string `json:"judged"`
	// Accepting is the newest settled plan that accepts the write, and
	// Settle the settle that made it the settled plan.
	Accepting *Link `json:"accepting,omitempty"`
	Settle    *Link `json:"settle,omitempty"`
	// Want is the want of the accepting plan, which declares the path.
	Want     *Link  `json:"want,omitempty"`
	Declared string `json:"declared,omitempty"`
	// Due says why the item was due when the knock was made.
	Due string `json:"due"`
}

// RowWhy explains one row of a plan.
type RowWhy struct {
	Module  string            `json:"module"`
	Held    bool              `json:"held"`
	Why     events.HoldReason `json:"why,omitempty"`
	Build   string            `json:"build"`
	Pending string            `json:"pending,omitempty"`
	// Reason says, in words, why the row is composed or held.
	Reason string `json:"reason"`
	// Approvals are the module's approvals known when the plan was made.
	Approvals []reconcile.Approval `json:"approvals,omitempty"`
}

func (h *History) link(ev events.Event) *Link {
	l := Link{Seq: ev.Seq, Time: ev.Time, Kind: ev.Kind, Summary: h.summary(ev, h.wantBefore(ev.Seq))}
	return &l
}

// linkSeq links the event at seq, or returns nil when the history does
// not hold it.
func (h *History) linkSeq(seq uint64) *Link {
	ev, ok := h.Event(seq)
	if !ok {
		return nil
	}
	return h.link(ev)
}

// wantBefore returns the node's last want before seq.
func (h *History) wantBefore(seq uint64) *events.Want {
	var w *events.Want
	for _, ev := range h.Events {
		if ev.Seq >= seq {
			break
		}
		if p, ok := ev.Payload.(*events.Want); ok {
			w = p
		}
	}
	return w
}

// eventRange says which sequences the node's events span, for a seq
// that is none of them ("" without events): a user who asked for #999
// learns where to look rather than only that #999 is not there (a fresh
// user's finding U24).
func (h *History) eventRange(seq uint64) string {
	if len(h.Events) == 0 {
		return ""
	}
	first, last := h.Events[0].Seq, h.Events[len(h.Events)-1].Seq
	span := fmt.Sprintf("#%d–#%d", first, last)
	if h.Partial {
		span += " as far as read"
	}
	if seq > first && seq < last {
		return fmt.Sprintf(" (its events span %s; #%d between them is another node's)", span, seq)
	}
	return fmt.Sprintf(" (its events span %s)", span)
}

// Why explains the event at seq: a knock, a plan, a journal entry, or an
// input event (what it led to; for a refusal, what became of its item).
//
// Errors: [ErrNotInHistory] when seq is not one of the node's events.
func (h *History) Why(seq uint64) (Why, error) {
	i, ok := h.Index(seq)
	if !ok {
		return Why{}, fmt.Errorf("why #%d: %w %s%s", seq, ErrNotInHistory, h.Node, h.eventRange(seq))
	}
	ev := h.Events[i]
	w := Why{Node: h.Node, Event: *h.link(ev)}
	if ev.Err != nil {
		w.Notes = append(w.Notes, "the event cannot be decoded, so it was not folded: "+ev.Err.Error())
		w.Effects = h.effectsOf(seq)
		return w, nil
	}
	switch p := ev.Payload.(type) {
	case *events.Knock:
		h.whyKnock(&w, p)
	case *events.Plan:
		h.whyPlan(&w, ev, p)
	case *events.Journal:
		h.whyJournal(&w, p)
	default:
		w.Effects = h.effectsOf(seq)
		if st, ok := h.step(ev); ok {
			w.Rollout = &st
		}
		if rf, ok := p.(*events.Refusal); ok {
			w.Fate = h.fate(i, rf)
		}
		if len(w.Effects) == 0 {
			w.Notes = append(w.Notes, "folding it made no plan, knock or journal entry")
		}
	}
	return w, nil
}

// effectsOf links the plans, knocks and journal entries caused by seq.
func (h *History) effectsOf(seq uint64) []Link {
	var out []Link
	for _, ev := range h.Events {
		if ev.Seq > seq && causeOf(ev.Payload) == seq {
			out = append(out, *h.link(ev))
		}
	}
	return out
}

// replayCause folds the history up to the cause and returns the state
// before it, the state after it and the effects folding it made. ok is
// false when the cause is not in the history.
func (h *History) replayCause(cause uint64) (before, after *reconcile.State, effs []reconcile.Effect, ok bool) {
	ci, ok := h.Index(cause)
	if !ok {
		return nil, nil, nil, false
	}
	before = h.Fold(ci)
	after = before.Clone()
	effs = after.Fold(h.Events[ci])
	return before, after, effs, true
}

func sameJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// replayVerdict compares the effect on the stream with the one of the
// same kind the fold makes at its cause.
func replayVerdict(kind events.Kind, cause uint64, onStream events.Payload, effs []reconcile.Effect) string {
	for _, e := range effs {
		if e.Kind == kind && sameJSON(e.Payload, onStream) {
			return fmt.Sprintf("folding #%d again makes this %s", cause, kind)
		}
	}
	for _, e := range effs {
		if e.Kind == kind {
			b, _ := json.Marshal(e.Payload)
			return fmt.Sprintf("DIFFERS: folding #%d again makes another %s: %s", cause, kind, b)
		}
	}
	return fmt.Sprintf("DIFFERS: folding #%d again makes no %s", cause, kind)
}

func (h *History) whyKnock(w *Why, k *events.Knock) {
	w.Cause = h.linkSeq(k.Cause)
	before, after, effs, ok := h.replayCause(k.Cause)
	if !ok {
		w.Notes = append(w.Notes, fmt.Sprintf("its cause #%d is not in the history read (trimmed, or outside the range)", k.Cause))
		return
	}
	w.Replay = replayVerdict(events.KindKnock, k.Cause, k, effs)
	cause := h.Events[mustIndex(h, k.Cause)]
	for _, o := range k.Owed {
		ow := OwedWhy{Owed: o}
		// The refusal that made the item: an owed item of the state
		// before the cause, or the cause itself (a refusal judged by an
		// older plan than one that accepts it is knocked at once).
		if j := slices.IndexFunc(before.Owed, func(it reconcile.Item) bool { return it.Owed == o }); j >= 0 {
			ow.Refusal = h.linkSeq(before.Owed[j].Seq)
		} else if rf, ok := cause.Payload.(*events.Refusal); ok && sameItem(rf, o) {
			ow.Refusal = h.link(cause)
		}
		ow.Judged = h.judged(o, ow.Refusal)
		h.accepting(&ow, after, cause)
		w.Owed = append(w.Owed, ow)
	}
}

func mustIndex(h *History, seq uint64) int {
	i, _ := h.Index(seq)
	return i
}

func sameItem(rf *events.Refusal, o events.Owed) bool {
	return rf.Module == o.Module && rf.Path == o.Path && rf.Plan == o.Plan && rf.Writer == o.Writer && rf.Reason == o.Reason
}

// planOf returns the plan event at seq, when the history holds one.
func (h *History) planOf(seq uint64) (*events.Plan, bool) {
	ev, ok := h.Event(seq)
	if !ok {
		return nil, false
	}
	p, ok := ev.Payload.(*events.Plan)
	return p, ok
}

// judged says why the write of o was refused, against the plan it names.
func (h *History) judged(o events.Owed, refusal *Link) string {
	var detail string
	if refusal != nil {
		if ev, ok := h.Event(refusal.Seq); ok {
			if rf, ok := ev.Payload.(*events.Refusal); ok && rf.Error != "" {
				detail = ": " + events.ErrorText(rf.Error)
			}
		}
	}
	p, known := h.planOf(o.Plan)
	switch o.Reason {
	case events.ReasonNoAccount:
		if o.Plan == 0 {
			return "no-account: the node had settled no plan, so it accepted no writer"
		}
		return fmt.Sprintf("no-account: plan #%d names no provisioner account", o.Plan)
	case events.ReasonWrongAccount:
		if known {
			return fmt.Sprintf("wrong-account: writer %s is not plan #%d's provisioner account %s", o.Writer, o.Plan, orNone(p.ProvisionerAccount))
		}
		return fmt.Sprintf("wrong-account: writer %s is not plan #%d's provisioner account", o.Writer, o.Plan)
	case events.ReasonUndeclared:
		if o.Plan == 0 {
			return "undeclared: the node had settled no plan"
		}
		return fmt.Sprintf("undeclared: plan #%d declares no %s for %s", o.Plan, o.Path, o.Module)
	}
	return "write-failed: the node could not write it" + detail
}

// accepting fills the settled plan that accepts o's write, the settle
// that settled it, the want that declared the path, and why o was due.
func (h *History) accepting(ow *OwedWhy, after *reconcile.State, cause events.Event) {
	o := ow.Owed
	var plan uint64
	if j := slices.IndexFunc(after.Accepting, func(a reconcile.Accepting) bool {
		return a.Module == o.Module && a.Path == o.Path && a.Account == o.Writer
	}); j >= 0 {
		plan = after.Accepting[j].Plan
	}
	switch {
	case plan > o.Plan:
		ow.Due = fmt.Sprintf("settled plan #%d is newer than plan %s and accepts the write from %s", plan, planRef(o.Plan), o.Writer)
	case o.Reason == events.ReasonWriteFailed:
		ow.Due = fmt.Sprintf("a write-failed item is due at the first settle or have after it: %s #%d", cause.Kind, cause.Seq)
	default:
		ow.Due = "no settled plan newer than the item's accepts it (the fold would not knock it)"
	}
	if plan == 0 {
		return
	}
	ow.Accepting = h.linkSeq(plan)
	for _, ev := range h.Events {
		if ev.Seq > cause.Seq {
			break
		}
		if s, ok := ev.Payload.(*events.Settle); ok && s.Plan == plan && s.Op != events.OpFailed {
			ow.Settle = h.link(ev)
			break
		}
	}
	p, ok := h.planOf(plan)
	if !ok {
		return
	}
	ow.Want = h.linkSeq(p.Want)
	row := p.Module(o.Module)
	if row == nil {
		return
	}
	var mode events.Mode
	for _, f := range row.Files {
		if f.Path == o.Path {
			mode = f.Mode
		}
	}
	if row.Held {
		ow.Declared = fmt.Sprintf("plan #%d holds %s (%s) and its held row carries %s %s: a held row's files count as declared", plan, o.Module, row.Why, o.Path, mode)
		return
	}
	ow.Declared = fmt.Sprintf("want #%d declares %s %s for %s, composed in plan #%d with account %s", p.Want, o.Path, mode, o.Module, plan, orNone(p.ProvisionerAccount))
}

func (h *History) whyPlan(w *Why, ev events.Event, p *events.Plan) {
	w.Cause = h.linkSeq(p.Cause)
	w.Want = h.linkSeq(p.Want)
	w.Changes = h.planChanges(ev.Seq, p)
	_, after, effs, ok := h.replayCause(p.Cause)
	if !ok {
		w.Notes = append(w.Notes, fmt.Sprintf("its cause #%d is not in the history read (trimmed, or outside the range)", p.Cause))
		return
	}
	w.Replay = replayVerdict(events.KindPlan, p.Cause, p, effs)
	wantMods := map[string]events.WantModule{}
	if after.Want != nil {
		for _, m := range after.Want.Modules {
			wantMods[m.Name] = m
		}
	}
	for _, row := range p.Modules {
		rw := RowWhy{Module: row.Name, Held: row.Held, Why: row.Why, Build: row.Build, Pending: row.Pending}
		m := wantMods[row.Name]
		runs, running := after.Runs(row.Name)
		for _, a := range after.Approvals {
			if a.Module == row.Name {
				rw.Approvals = append(rw.Approvals, a)
			}
		}
		gate, gated := after.Gated(row.Name)
		if !gated {
			gate.Seq = 0
		}
		dropped, _ := after.DroppedGate()
		rw.Reason = rowReason(p.Want, row, m, runs, running, rw.Approvals, gate, after.GatesFull, dropped)
		w.Rows = append(w.Rows, rw)
	}
	w.Account = accountReason(p)
}

// rowReason says why a plan row is composed or held, in the words of the
// one rule (reconcile.Hold); gate is the node's gate of the module (Seq 0
// when none); full, when set, says the node's gates are full
// (reconcile.State.GatesFull); dropped is a gate whose module a want
// dropped (Dropped 0 when none).
func rowReason(want uint64, row events.PlanModule, m events.WantModule, runs reconcile.Running, running bool, approvals []reconcile.Approval, gate reconcile.GateRecord, full *reconcile.GatesFull, dropped reconcile.GateRecord) string {
	what := "nothing runs"
	if running && runs.Build != "" {
		what = orNone(runs.Build) + " runs"
	}
	var others []string
	for _, a := range approvals {
		others = append(others, fmt.Sprintf("%s (#%d by %s)", a.Build, a.Seq, a.By))
	}
	switch {
	case row.Held && row.Why == events.HoldWant:
		return fmt.Sprintf("want #%d holds it; the row carries what runs (%s)", want, what)
	case row.Held && row.Why == events.HoldApproval:
		requires := fmt.Sprintf("want #%d requires approval", want)
		if !m.RequiresApproval && gate.Seq != 0 {
			// The gate alone holds it (DESIGN.md §4, "the gate").
			requires = fmt.Sprintf("the gate of %s set at #%d requires approval (want #%d leaves the flag out, which lifts no gate)", row.Name, gate.Seq, want)
			if gate.By != "" {
				requires = fmt.Sprintf("the gate of %s set by %s at #%d requires approval", row.Name, events.Text(gate.By), gate.Seq)
			}
		}
		if !m.RequiresApproval && gate.Seq == 0 && full != nil {
			// Fail closed: the gates are full (reconcile.State.GatesFull).
			requires = fmt.Sprintf("the node's gates are full since #%d (a gate was not kept), so every module requires approval until each module whose gate was not kept is gated or ungated", full.Seq)
		} else if !m.RequiresApproval && gate.Seq == 0 && dropped.Dropped != 0 {
			// A gated module dropped from the want (GateRecord.Dropped).
			requires = fmt.Sprintf("the gate of %s, which want #%d dropped, holds every module of the node (it could run %s's workload under another name)", dropped.Module, dropped.Dropped, dropped.Module)
		}
		s := fmt.Sprintf("%s and wants %s, but %s and no approval names %s", requires, row.Pending, what, row.Pending)
		if requires != fmt.Sprintf("want #%d requires approval", want) {
			s = fmt.Sprintf("%s; want #%d asks for %s, but %s and no approval names %s", requires, want, row.Pending, what, row.Pending)
		}
		if row.Pending == "" {
			s = fmt.Sprintf("%s; %s and no approval names the wanted build", requires, what)
		}
		if len(others) > 0 {
			return s + "; approvals exist for other builds: " + strings.Join(others, ", ")
		}
		return s + "; no approval exists for " + row.Name + " at any build"
	case m.RequiresApproval && running && runs.Build == m.Build && m.Build != "":
		return fmt.Sprintf("composed: requires approval, but %s already runs", m.Build)
	case m.RequiresApproval:
		for _, a := range approvals {
			if a.Build == row.Build {
				return fmt.Sprintf("composed: requires approval; %s was approved by %s at #%d", row.Build, a.By, a.Seq)
			}
		}
		return "composed: requires approval"
	}
	return fmt.Sprintf("composed from want #%d: %s as %s", want, row.Build, orNone(row.RunsAs))
}

// accountReason says where the plan's provisioner account comes from
// (DESIGN.md §4, incident 3).
func accountReason(p *events.Plan) string {
	for _, row := range p.Modules {
		if !row.Provisioner {
			continue
		}
		switch {
		case !row.Held && p.ProvisionerAccount == "":
			return fmt.Sprintf("none: the provisioner module %s is composed with no runs_as", row.Name)
		case !row.Held:
			return fmt.Sprintf("%s: the runs_as of the provisioner module %s, composed", p.ProvisionerAccount, row.Name)
		case p.ProvisionerAccount == "":
			return fmt.Sprintf("none: the provisioner module %s is held and runs as no account", row.Name)
		}
		return fmt.Sprintf("%s: the provisioner module %s is held and keeps the account it runs as", p.ProvisionerAccount, row.Name)
	}
	return "none: the want has no provisioner module"
}

// planChanges compares a plan with the node's plan event before it.
func (h *History) planChanges(seq uint64, p *events.Plan) []string {
	var prev *events.Plan
	var prevSeq uint64
	for _, ev := range h.Events {
		if ev.Seq >= seq {
			break
		}
		if q, ok := ev.Payload.(*events.Plan); ok {
			prev, prevSeq = q, ev.Seq
		}
	}
	if prev == nil {
		return []string{"the node's first plan in the history read"}
	}
	var out []string
	if prev.Want != p.Want {
		out = append(out, fmt.Sprintf("want #%d→#%d", prev.Want, p.Want))
	}
	if prev.ProvisionerAccount != p.ProvisionerAccount {
		out = append(out, fmt.Sprintf("account %s→%s", orNone(prev.ProvisionerAccount), orNone(p.ProvisionerAccount)))
	}
	for _, row := range p.Modules {
		o := prev.Module(row.Name)
		switch {
		case o == nil:
			out = append(out, "+"+row.Name+" "+rowText(row))
		case !sameJSON(*o, row):
			out = append(out, row.Name+" "+rowText(*o)+" → "+rowText(row))
		}
	}
	for _, o := range prev.Modules {
		if p.Module(o.Name) == nil {
			out = append(out, "-"+o.Name)
		}
	}
	if len(out) == 0 {
		out = append(out, "no row changed")
	}
	return append([]string{fmt.Sprintf("against plan #%d", prevSeq)}, out...)
}

func rowText(r events.PlanModule) string {
	if r.Held {
		s := fmt.Sprintf("held(%s) %s", r.Why, orNone(r.Build))
		if r.Pending != "" {
			s += " pending " + r.Pending
		}
		return s
	}
	return fmt.Sprintf("%s as %s", r.Build, orNone(r.RunsAs))
}

func (h *History) whyJournal(w *Why, j *events.Journal) {
	w.Cause = h.linkSeq(j.Cause)
	_, _, effs, ok := h.replayCause(j.Cause)
	if !ok {
		w.Notes = append(w.Notes, fmt.Sprintf("its cause #%d is not in the history read (trimmed, or outside the range)", j.Cause))
		return
	}
	w.Replay = replayVerdict(events.KindJournal, j.Cause, j, effs)
}

// fate follows the item a refusal (at position i) makes through the rest
// of the history.
func (h *History) fate(i int, rf *events.Refusal) string {
	st := h.Fold(i)
	item := events.Owed{Module: rf.Module, Path: rf.Path, Reason: rf.Reason, Plan: rf.Plan, Writer: rf.Writer}
	has := func(s *reconcile.State) (uint64, bool) {
		j := slices.IndexFunc(s.Owed, func(it reconcile.Item) bool {
			return it.Module == item.Module && it.Path == item.Path && it.Plan == item.Plan && it.Writer == item.Writer
		})
		if j < 0 {
			return 0, false
		}
		return s.Owed[j].Seq, true
	}
	if seq, ok := has(st); ok {
		return fmt.Sprintf("adds nothing: the same item is owed since #%d", seq)
	}
	if why := st.Unwanted(rf.Module, rf.Path); why != "" {
		return "owes nothing: " + why
	}
	effs := st.Fold(h.Events[i])
	if _, ok := has(st); !ok {
		for _, e := range effs {
			if k, ok := e.Payload.(*events.Knock); ok && slices.Contains(k.Owed, item) {
				return fmt.Sprintf("knocked at once by the knock caused by #%d: a settled plan newer than %s accepts it", h.Events[i].Seq, planRef(rf.Plan))
			}
		}
		return "owes nothing: a fill at its plan or a newer one already paid it"
	}
	for _, ev := range h.Events[i+1:] {
		effs := st.Fold(ev)
		if _, ok := has(st); ok {
			continue
		}
		for _, e := range effs {
			if k, ok := e.Payload.(*events.Knock); ok && slices.Contains(k.Owed, item) {
				return fmt.Sprintf("owed until the knock caused by %s #%d", ev.Kind, ev.Seq)
			}
		}
		if why := st.Unwanted(rf.Module, rf.Path); why != "" && ev.Kind != events.KindWant {
			return fmt.Sprintf("owed until %s #%d, then paid without a knock: %s", ev.Kind, ev.Seq, why)
		}
		switch ev.Kind {
		case events.KindFilled:
			return fmt.Sprintf("owed until filled #%d paid it", ev.Seq)
		case events.KindWant:
			return fmt.Sprintf("owed until want #%d removed %s, which pays its items", ev.Seq, rf.Module)
		}
		return fmt.Sprintf("owed until #%d %s", ev.Seq, ev.Kind)
	}
	return "still owed: no settled plan newer than " + planRef(rf.Plan) + " accepts it yet"
}
