package audit

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// AsOf is a node's state as of a bound: the fold of every event of the
// node at or before it. Its JSON field names are stable.
type AsOf struct {
	Node string `json:"node"`
	// Bound is the bound as written.
	Bound string `json:"bound"`
	// Events counts the events folded; Seq and Time are the last one's
	// (0 and zero when none).
	Events int       `json:"events"`
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time,omitzero"`
	// Note says where the bound falls when it names no event exactly.
	Note string `json:"note,omitempty"`
	// At is the time ages are told against: a time bound's end, else the
	// last event's time.
	At          time.Time             `json:"at,omitzero"`
	View        reconcile.View        `json:"view"`
	Composition reconcile.Composition `json:"composition"`
	State       *reconcile.State      `json:"state"`
}

// AsOf folds the node's events at or before b with the reconciler's fold.
func (h *History) AsOf(b Bound) AsOf {
	n, note := h.Until(b)
	st := h.Fold(n)
	a := AsOf{Node: h.Node, Bound: b.String(), Events: n, Note: note, View: st.View(), Composition: reconcile.CompositionOf(st), State: st}
	if n > 0 {
		a.Seq, a.Time, a.At = h.Events[n-1].Seq, h.Events[n-1].Time, h.Events[n-1].Time
	}
	if b.IsTime() {
		a.At = b.Time
	}
	return a
}

// Text returns the as-of state as lines of at most [LineWidth] columns.
// The age of the last have is told against At.
func (a AsOf) Text() string {
	var t textWriter
	if a.Events == 0 {
		t.line(0, "", fmt.Sprintf("%s as of %s: no event folded", a.Node, a.Bound))
	} else {
		t.line(0, "", fmt.Sprintf("%s as of %s: %s folded, the last #%d at %s", a.Node, a.Bound, plural(a.Events, "event"), a.Seq, FormatTime(a.Time)))
	}
	if a.Note != "" {
		t.line(1, "note", a.Note)
	}
	writeState(&t, a.View, a.Composition, a.At, "before the bound")
	if s := a.State; s != nil && len(s.Approvals) > 0 {
		var ap []string
		for _, x := range s.Approvals {
			ap = append(ap, fmt.Sprintf("%s %s (#%d by %s)", x.Module, x.Build, x.Seq, x.By))
		}
		t.line(1, "approvals", strings.Join(ap, ", "))
	}
	return t.b.String()
}

// StateText returns the state view and composition of a node as
// `meshfold state` prints it; now is the present, for the age of the last
// have, and source says where the state came from.
func StateText(v reconcile.View, c reconcile.Composition, now time.Time, source string) string {
	var t textWriter
	t.line(0, "", fmt.Sprintf("%s: folded through #%d, from %s", v.Node, v.Seq, source))
	writeState(&t, v, c, now, "ago")
	return t.b.String()
}

// GateText says what set node's gate g, and, when the newest want no
// longer marks its module requires_approval, that the gate holds it on
// its own and how an operator lifts it (DESIGN.md §4, "the gate").
func GateText(node string, g reconcile.Gate) string {
	s := fmt.Sprintf("%s: gated since want #%d marked it requires_approval", g.Module, g.Seq)
	if g.By != "" {
		s = fmt.Sprintf("%s: gated by %s (#%d)", g.Module, events.Text(g.By), g.Seq)
	}
	s += ": a new build moves only with an approval"
	if g.Dropped != 0 {
		return s + fmt.Sprintf("; want #%d dropped it, so every module of the node moves to a new build only with an approval (it could run %s's workload under another name) until a want names %s again or 'meshfold ungate %s %s --by NAME' lifts the gate",
			g.Dropped, g.Module, g.Module, node, g.Module)
	}
	if !g.Wanted {
		s += fmt.Sprintf("; the newest want does not mark it, and does not lift the gate: only 'meshfold ungate %s %s --by NAME' does", node, g.Module)
	}
	return s
}

// GatesFullText says that node's gates are full and what that holds
// (reconcile.State.GatesFull): every module moves only with an approval
// until an operator gates one again.
func GatesFullText(node string, g reconcile.GatesFull) string {
	lost := make([]string, len(g.Modules))
	for i, m := range g.Modules {
		lost[i] = events.Text(m)
	}
	names := strings.Join(lost, ", ")
	if g.Unnamed > 0 {
		names += fmt.Sprintf(" and %d more (named in the journal's warnings since #%d)", g.Unnamed, g.Seq)
	}
	gate := "MODULE"
	if len(g.Modules) > 0 {
		gate = events.Text(g.Modules[0])
	}
	return fmt.Sprintf("FULL since #%d: %d gates kept, and the gates of %s were not: so every module of the node moves to a new build only with an approval, "+
		"until each of them is gated or ungated: 'meshfold ungate %s MODULE --by NAME' of a module that needs none makes room, then 'meshfold gate %s %s --by NAME'",
		g.Seq, reconcile.MaxGates, names, node, node, gate)
}

func seqOrNone(seq uint64) string {
	if seq == 0 {
		return "none"
	}
	return fmt.Sprintf("#%d", seq)
}

// writeState writes the view and the composition's rows; ages are told
// against now, followed by suffix ("ago").
func writeState(t *textWriter, v reconcile.View, c reconcile.Composition, now time.Time, suffix string) {
	emitted := seqOrNone(v.EmittedPlan)
	if v.EmittedPlan == 0 && c.Cause != 0 {
		emitted = fmt.Sprintf("not yet on the stream (cause #%d)", c.Cause)
	}
	t.line(1, "want", seqOrNone(v.Want))
	t.line(1, "plan", fmt.Sprintf("last emitted %s, last settled %s, %d unsettled", emitted, seqOrNone(v.SettledPlan), v.Unsettled))
	for _, f := range v.Failed {
		t.line(1, "failed", FailedText(f, v.SettledPlan, now, suffix))
	}
	acct := fmt.Sprintf("plan names %s, what runs names %s", orNone(v.ProvisionerAccount), orNone(v.RunningAccount))
	if v.AccountWarning {
		acct += " (WARNING: the node refuses every filled write)"
	}
	t.line(1, "account", acct)
	t.line(1, "counts", fmt.Sprintf("%s, %s, %d held", plural(v.Modules, "module"), plural(v.Files, "declared file"), v.Held))
	if n := v.Noisy; n != nil {
		t.line(1, "noisy", fmt.Sprintf("%s (#%d–#%d), its last event %s %s: over %d events or %s of its own events in %s (docs/operations.md, \"A node that floods the stream\")",
			n, n.Seq, n.LastSeq, Age(now.Sub(n.Last)), suffix, reconcile.NoisyEvents, reconcile.FormatBytes(reconcile.NoisyBytes), reconcile.FormatSpan(reconcile.NoisyWindow)))
	}
	for _, r := range c.Modules {
		if r.Held {
			t.line(1, "held", HeldText(r.Name, r.Why, r.Build, r.Pending))
			continue
		}
		s := fmt.Sprintf("%s %s as %s", r.Name, r.Build, orNone(r.RunsAs))
		if n := len(r.Files); n > 0 {
			s += ", " + plural(n, "file")
		}
		if r.Provisioner {
			s += " (provisioner)"
		}
		t.line(1, "composed", s)
	}
	if g := v.GatesFull; g != nil {
		t.line(1, "gates", GatesFullText(v.Node, *g))
	}
	for _, g := range v.Gates {
		if g.By != "" || !g.Wanted { // a want's flag in force says it already
			t.line(1, "gate", GateText(v.Node, g))
		}
	}
	for _, r := range v.Runtime {
		t.line(1, "runs", runtimeText(r, now, suffix))
	}
	writeOperator(t, v, now, suffix)
	if len(v.Owed) == 0 {
		t.line(1, "owed", "nothing")
	}
	for i, o := range v.Owed {
		s := fmt.Sprintf("%s %s (%s, plan %s, writer %s)", o.Module, o.Path, o.Reason, planRef(o.Plan), o.Writer)
		if i < len(v.OwedAt) && !v.OwedAt[i].IsZero() {
			age := now.Sub(v.OwedAt[i])
			s += fmt.Sprintf(", refused %s %s", Age(age), suffix)
			if age > reconcile.OwedStuckAfter {
				s += ": STUCK (waive it if nobody will ever fill it)"
			}
		}
		if i < len(v.OwedWhy) && v.OwedWhy[i] != "" {
			s += "; why: " + v.OwedWhy[i]
		}
		t.line(1, "owed", s)
	}
	if k := v.LastKnock; k != nil {
		var paths []string
		for _, o := range k.Owed {
			paths = append(paths, o.Path)
		}
		rs := make([]string, len(k.Reasons))
		for i, r := range k.Reasons {
			rs[i] = string(r)
		}
		what := strings.Join(paths, ", ")
		if len(paths) == 0 {
			what = "every file" // an operator's poke
		}
		t.line(1, "knock", fmt.Sprintf("last caused by #%d: %s; %s", k.Cause, strings.Join(rs, ","), what))
	} else {
		t.line(1, "knock", "none")
	}
	if a := v.Agent; a != nil {
		t.line(1, "agent", agentText(a, now, suffix))
	}
	if p := v.Provisioner; p != nil {
		t.line(1, "prov", provText(p, v.Files, now, suffix))
	}
	if v.HaveSeq == 0 {
		t.line(1, "have", "none yet")
	} else {
		t.line(1, "have", fmt.Sprintf("#%d at %s, %s %s", v.HaveSeq, FormatTime(v.HaveTime), Age(now.Sub(v.HaveTime)), suffix))
	}
}

// FailedText says why a module's apply failed, for `state`, `fleet` and
// the console: the module ("the plan" when the agent refused it whole),
// the plan, how long ago and the error, shortened (DESIGN.md §10). A
// failure of the node's settled plan (settled: its sequence) is an agent
// that applied it again (it lost its state) and could not: it says so.
func FailedText(f reconcile.FailedApply, settled uint64, now time.Time, suffix string) string {
	what := "module " + f.Module
	if f.Module == "" {
		what = "the plan"
	}
	if f.Plan <= settled {
		return fmt.Sprintf("re-apply of settled plan #%d failed for %s (#%d, %s %s): %s",
			f.Plan, what, f.Seq, Age(now.Sub(f.Time)), suffix, f.Error)
	}
	return fmt.Sprintf("apply of plan #%d failed for %s (#%d, %s %s): %s", f.Plan, what, f.Seq, Age(now.Sub(f.Time)), suffix, f.Error)
}

// agentText tells the node's agent as the state knows it: "DOWN since
// … (45s ago, #812): lease expired, not renewed (agent pid 4242 on web-1)"
// or "up since … (#830)".
func agentText(a *reconcile.AgentRecord, now time.Time, suffix string) string {
	state := "up"
	if !a.Up {
		state = "DOWN"
	}
	s := fmt.Sprintf("%s since %s (%s %s, #%d)", state, FormatTime(a.Time), Age(now.Sub(a.Time)), suffix, a.Seq)
	switch {
	case !a.Up:
		s += ": " + strings.TrimPrefix(AgentSummary(&events.Agent{State: events.AgentDown, Why: a.Why, Host: a.Host, PID: a.PID}), "DOWN: ")
	case a.Claim == "":
		s += ": a have came after the agent's down"
	case a.PID > 0:
		s += fmt.Sprintf(": agent pid %d", a.PID)
		if a.Host != "" {
			s += " on " + events.Text(a.Host)
		}
	}
	return s
}

// provText tells the node's provisioner client as the state knows it
// (its lease): "DOWN since … (45s ago, #812): lease expired, not renewed
// (provisioner pid 4242 on web-1); no knock is answered, no file
// filled" or "up since … (#830): provisioner pid 4300 on web-1"; files
// is the count of files the last plan declares.
func provText(p *reconcile.AgentRecord, files int, now time.Time, suffix string) string {
	s := agentText(p, now, suffix)
	s = strings.Replace(s, "agent pid", "provisioner pid", 1)
	if !p.Up {
		s = strings.Replace(s, "agent stopped", "provisioner stopped", 1)
		s = strings.Replace(s, "a new agent", "a new provisioner", 1)
		if files > 0 {
			s += "; no knock is answered and no file filled until a provisioner runs again"
		}
	}
	return s
}

// writeOperator writes what the operator events of DESIGN.md §9 left on
// the node, and what is stuck: the pause and what resuming would publish,
// the retirement, and the files never filled since their module was
// placed, with how long ago that plan settled. Ages are told against now.
func writeOperator(t *textWriter, v reconcile.View, now time.Time, suffix string) {
	if p := v.Paused; p != nil {
		s := fmt.Sprintf("by %s since %s (%s %s, #%d): no new plan is published", events.Text(p.By), FormatTime(p.Time), Age(now.Sub(p.Time)), suffix, p.Seq)
		if p.Reason != "" {
			s += "; reason: " + events.Text(p.Reason)
		}
		t.line(1, "paused", s)
		if w := v.Withheld; w != nil {
			for _, line := range diffLines(*w) {
				t.line(1, "withheld", line)
			}
		} else {
			t.line(1, "withheld", "nothing: resuming publishes no plan")
		}
	}
	if a := v.Ack; a != nil {
		t.line(1, "acked", fmt.Sprintf("journal warnings through #%d acknowledged by %s at %s (%s %s, #%d): they do not flag the node",
			a.Upto, events.Text(a.By), FormatTime(a.Time), Age(now.Sub(a.Time)), suffix, a.Seq))
	}
	if r := v.Retire; r != nil {
		s := fmt.Sprintf("retiring since %s (#%d by %s): the empty plan waits to settle (retire --force forgets it now)",
			FormatTime(r.Time), r.Seq, events.Text(r.By))
		if r.Retired {
			s = fmt.Sprintf("retired at %s (#%d; retire #%d by %s): a want brings it back", FormatTime(r.RetiredTime), r.RetiredSeq, r.Seq, events.Text(r.By))
		}
		t.line(1, "retire", s)
	}
	for _, m := range v.Missing {
		t.line(1, "missing", MissingText(m))
	}
	for _, u := range v.Unfilled {
		s := fmt.Sprintf("%s %s: never filled since plan #%d placed it, settled %s %s", u.Module, u.Path, u.Plan, Age(now.Sub(u.Since)), suffix)
		if u.Plan == 0 {
			s = fmt.Sprintf("%s %s: never filled (declared since before this state recorded placements)", u.Module, u.Path)
		}
		if now.Sub(u.Since) > reconcile.UnfilledStuckAfter {
			s += ": STUCK (is the provisioner's source for it there?)"
		}
		t.line(1, "unfilled", s)
	}
}

// MissingText says a declared file the node's agent reported missing on
// the node (reconcile.View.Missing), and that its refill was asked:
// "declared file /run/app/token of module app is missing on the node
// (reported at #41): refill asked". `state` and `fleet` print it until
// the file is filled, or reported back.
//
// A file gone at the agent's start (MissingFile.AtStart: a reboot or a
// re-image emptied /run) says so: "declared file /run/app/token of
// module app is missing on the node, gone at its agent's start (reported
// at #41): refill asked".
func MissingText(m reconcile.MissingFile) string {
	if m.AtStart {
		return fmt.Sprintf("declared file %s of module %s is missing on the node, gone at its agent's start (reported at #%d): refill asked",
			events.Text(m.Path), m.Module, m.Seq)
	}
	return fmt.Sprintf("declared file %s of module %s is missing on the node (reported at #%d): refill asked",
		events.Text(m.Path), m.Module, m.Seq)
}

// diffLines tells a plan difference as short lines: the want, the account,
// each row added, removed or changed.
func diffLines(d reconcile.PlanDiff) []string {
	var out []string
	if d.WantFrom != d.WantTo && d.WantTo != 0 {
		out = append(out, fmt.Sprintf("want %s → #%d", seqOrNone(d.WantFrom), d.WantTo))
	}
	if d.AccountFrom != d.AccountTo {
		out = append(out, fmt.Sprintf("account %s → %s", orNone(d.AccountFrom), orNone(d.AccountTo)))
	}
	for _, r := range d.Added {
		out = append(out, "added "+planRowText(r))
	}
	for _, r := range d.Removed {
		out = append(out, "removed "+r.Name)
	}
	for _, c := range d.Changed {
		out = append(out, c.Module+": "+changeText(c))
	}
	return out
}

func changeText(c reconcile.RowChange) string {
	var parts []string
	for _, f := range c.Fields {
		switch f {
		case "build":
			parts = append(parts, fmt.Sprintf("build %s → %s", orNone(c.From.Build), orNone(c.To.Build)))
		case "runs_as":
			parts = append(parts, fmt.Sprintf("runs_as %s → %s", orNone(c.From.RunsAs), orNone(c.To.RunsAs)))
		case "files":
			parts = append(parts, fmt.Sprintf("files %d → %d", len(c.From.Files), len(c.To.Files)))
		case "held":
			if c.To.Held {
				parts = append(parts, "held ("+string(c.To.Why)+")")
			} else {
				parts = append(parts, "composed")
			}
		case "why":
			if c.From.Held && c.To.Held {
				parts = append(parts, fmt.Sprintf("why %s → %s", c.From.Why, c.To.Why))
			}
		case "pending":
			parts = append(parts, fmt.Sprintf("pending %s → %s", orNone(c.From.Pending), orNone(c.To.Pending)))
		default:
			parts = append(parts, f)
		}
	}
	return strings.Join(parts, ", ")
}

// Age formats a duration for an operator: 45s, 12m, 3h10m, 2d4h. A
// negative duration is a time ahead of the reader's clock (the writer's
// clock runs ahead): under a second it is "0s", as a sub-second age is,
// never "-0s"; a larger one keeps its sign ("-5s") so the skew shows.
func Age(d time.Duration) string {
	if d < 0 {
		if d > -time.Second {
			return "0s"
		}
		return "-" + Age(-d)
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// FleetRow is one node of `meshfold fleet`. Its JSON field names are
// stable.
type FleetRow struct {
	Node string `json:"node"`
	Seq  uint64 `json:"seq"`
	// Behind: the stream holds an event of the node newer than Seq, of a
	// kind the reconciler folds (not its own knocks or journal entries), so
	// the row is from a snapshot older than the node's events (the
	// reconciler stores them at its checkpoints, a second or so apart);
	// NewestSeq is that event's sequence. Set by a reader that read the
	// events past the checkpoints ([FleetRow.SetNewest]); absent when
	// the row is as new as the node's events, or when nobody looked.
	Behind      bool   `json:"behind,omitempty"`
	NewestSeq   uint64 `json:"newest_seq,omitempty"`
	Want        uint64 `json:"want"`
	SettledPlan uint64 `json:"settled_plan"`
	EmittedPlan uint64 `json:"emitted_plan"`
	Unsettled   int    `json:"unsettled"`
	Modules     int    `json:"modules"`
	Held        int    `json:"held"`
	// Pending are the rows held for an approval, with the build waiting.
	Pending []reconcile.Held `json:"pending,omitempty"`
	Owed    int              `json:"owed"`
	// LastKnockCause is the sequence of the event that caused the last
	// knock (the knock itself is the reconciler's next publish: the
	// timeline shows it as ←#cause); 0 when none.
	LastKnockCause uint64 `json:"last_knock_cause,omitempty"`
	// HaveTime is the last have's stream time; HaveAge its age in
	// seconds at the time the row was made (-1: no have yet).
	HaveTime       time.Time `json:"have_time,omitzero"`
	HaveAge        float64   `json:"have_age_s"`
	StaleHave      bool      `json:"stale_have"`
	AccountWarning bool      `json:"account_warning"`
	// Agent is "up" or "down" (DESIGN.md §11 "Liveness": "down" when the
	// node's agent's lease ended and no have came since), absent while
	// nothing is known; AgentSince is the stream time of the event that
	// made it so.
	Agent      string    `json:"agent,omitempty"`
	AgentSince time.Time `json:"agent_since,omitzero"`
	// FeedLost, when not zero, is since when the node's live agent has
	// read no plan: its plan feed lost its consumer and no new one reads
	// yet, as its lease says (store.Holder.FeedLost, read live beside the
	// snapshots: [FleetRow.SetFeedLost]). Need "feed-lost".
	FeedLost time.Time `json:"feed_lost,omitzero"`
	// Failed are the modules the newest have reports failed (a crash
	// loop), with the files they wait for.
	Failed []reconcile.ModuleRuntime `json:"failed,omitempty"`
	// FailedApplies are, per module, the newest failed apply of a plan
	// not settled yet, with its error cut (reconcile.View.Failed), the
	// newest first: the NEEDS column, cut at its width, shows it.
	FailedApplies []reconcile.FailedApply `json:"failed_applies,omitempty"`
	// Missing are the declared files the node's agent reported missing
	// on the node, whose refill the reconciler asked
	// (reconcile.View.Missing).
	Missing []reconcile.MissingFile `json:"missing,omitempty"`
	// Noisy is the node's noisy episode (reconcile.NoisyRecord: its
	// own events past 1000 or 2 MB in 10 s of stream time) while it is
	// news: its last event less than reconcile.NoisyShow before now and
	// after the node's acknowledgement (`meshfold ack`). Absent otherwise.
	Noisy *reconcile.NoisyRecord `json:"noisy,omitempty"`
	// Unhealthy are the modules alive with a failing health check;
	// Flapping those that run but crash-loop (at least
	// reconcile.FlapRestarts restarts, running for less than
	// reconcile.FlapWindow): DESIGN.md §11.
	Unhealthy []reconcile.ModuleRuntime `json:"unhealthy,omitempty"`
	Flapping  []reconcile.ModuleRuntime `json:"flapping,omitempty"`
	// Warnings counts journal entries of level warn or error in the
	// window asked for (-1: not counted).
	Warnings int `json:"journal_warnings"`
	// WarningSeqs are the stream sequences of the entries Warnings
	// counts, oldest first ([FleetRow.SetWarningSeqs]); WarningNotes
	// the newest of them told shortly ([WarningNote]), as a reader
	// filled them in for fleet's table. Neither is in JSON.
	WarningSeqs  []uint64 `json:"-"`
	WarningNotes []string `json:"-"`
	// ClearedWarnings counts, beside Warnings, the entries older than the
	// node's newest settled plan on a node nothing else flags: their
	// condition cleared since, and they do not flag it
	// ([FleetRow.SetWarningSeqs]).
	ClearedWarnings int `json:"journal_warnings_cleared,omitempty"`
	// AckedWarnings counts, beside Warnings and ClearedWarnings, the
	// entries at or below Ack.Upto: an operator acknowledged them
	// (`meshfold ack`), and they do not flag the node.
	AckedWarnings int `json:"journal_warnings_acked,omitempty"`
	// Ack is the node's acknowledgement that covers the most (issue 25);
	// absent when none.
	Ack *reconcile.AckRecord `json:"ack,omitempty"`
	// Sources are the files the node's provisioner could not fill, and
	// why (DESIGN.md §12), as it reported them; set with [FleetRow.SetSources].
	Sources []SourceProblem `json:"source_problems,omitempty"`
	// ProvisionerDown is the node's provisioner client's down, while its
	// plan declares a file (reconcile.View.ProvisionerDown): nobody
	// answers its knocks, and its Sources are as that provisioner last
	// saw them (each Stale). Absent otherwise.
	ProvisionerDown *reconcile.AgentRecord `json:"provisioner_down,omitempty"`
	// Attention lists what needs an operator, most pressing first:
	// "error", "noisy", "agent-down", "provisioner-down", "failed", "apply-failed",
	// "unhealthy", "flapping", "missing", "unfilled", "source", "owed", "approval", "unsettled",
	// "paused", "retiring", "account", "stale-have", "journal". A retired
	// node needs nothing.
	Attention []string `json:"attention"`
	// Error says why the node's snapshot could not be read.
	Error string `json:"error,omitempty"`
	// Stuck is what is stuck (DESIGN.md §9, issue 15): the pause (by
	// whom, since when), the retirement, files never filled since their
	// module was placed (a minute after), owed items older than an hour.
	Stuck reconcile.Stuck `json:"stuck"`
	// Retired: the node is retired; `fleet` hides it unless --all.
	Retired bool `json:"retired,omitempty"`
}

// SetNewest records newest, the sequence of the node's newest event in
// the stream: when it is past the row's Seq, the row is Behind.
//
// A row Behind needs no "stale-have": the node's newer events may hold a
// have (a fresh user's finding M9: with every reconciler down, the rows
// of nodes whose haves were in the stream said "stale-have", the age
// growing with the snapshot's).
func (r *FleetRow) SetNewest(newest uint64) {
	if newest > r.Seq {
		r.Behind, r.NewestSeq = true, newest
		r.setAttention()
	}
}

// SetFeedLost sets since when the node's live agent reads no plan (its
// lease's store.Holder.FeedLost; zero: its feed reads) and what the row
// needs with it: a live agent that follows no plan needs an operator as
// much as a dead one (a fresh user's finding M8).
func (r *FleetRow) SetFeedLost(since time.Time) {
	r.FeedLost = since
	r.setAttention()
}

// FeedLostText says since when a node's agent follows no plan, at now.
func FeedLostText(since, now time.Time) string {
	return fmt.Sprintf("plan feed lost since %s (%s ago): the agent lives, reads no plan, and tries a new consumer by itself",
		FormatTime(since), Age(now.Sub(since)))
}

// FleetFeedLostText returns, for the lines after fleet's table, each row
// whose live agent reads no plan, and since when ([FeedLostText]).
func FleetFeedLostText(rows []FleetRow, now time.Time) string {
	var t textWriter
	for _, r := range rows {
		if slices.Contains(r.Attention, "feed-lost") {
			t.line(0, "feed-lost", r.Node+" "+FeedLostText(r.FeedLost, now))
		}
	}
	return t.b.String()
}

// FleetRowOf returns the fleet row of s at now; a have older than stale
// (or none at all) is stale.
func FleetRowOf(s *reconcile.State, now time.Time, stale time.Duration) FleetRow {
	return FleetRowOfView(s.View(), now, stale)
}

// newestFirst returns a copy of fa, the newest failed settle first.
func newestFirst(fa []reconcile.FailedApply) []reconcile.FailedApply {
	if len(fa) < 2 {
		return fa
	}
	fa = slices.Clone(fa)
	slices.SortFunc(fa, func(a, b reconcile.FailedApply) int { return cmp.Compare(b.Seq, a.Seq) })
	return fa
}

// FleetRowOfView returns the fleet row of a node's view at now, as
// [FleetRowOf] makes it from the state: for a view the reconciler's state
// service answered (the web console's live rows).
func FleetRowOfView(v reconcile.View, now time.Time, stale time.Duration) FleetRow {
	r := FleetRow{Node: v.Node, Seq: v.Seq, Want: v.Want, SettledPlan: v.SettledPlan, EmittedPlan: v.EmittedPlan,
		Unsettled: v.Unsettled, Modules: v.Modules, Held: v.Held, Owed: len(v.Owed),
		AccountWarning: v.AccountWarning, HaveTime: v.HaveTime, HaveAge: -1, Warnings: -1,
		Failed: failing(v.Runtime), FailedApplies: newestFirst(v.Failed), Unhealthy: unhealthy(v.Runtime), Flapping: flapping(v.Runtime, now),
		Missing: v.Missing, Stuck: v.Stuck(now)}
	r.Retired = r.Stuck.Retired
	r.Ack = v.Ack
	if n := v.Noisy; n.Shown(now) && (v.Ack == nil || v.Ack.Upto < n.LastSeq) {
		r.Noisy = n
	}
	for _, h := range v.Holds {
		if h.Why == events.HoldApproval && h.Pending != "" {
			r.Pending = append(r.Pending, h)
		}
	}
	if v.LastKnock != nil {
		r.LastKnockCause = v.LastKnock.Cause
	}
	if a := v.Agent; a != nil {
		r.Agent, r.AgentSince = "up", a.Time
		if !a.Up {
			r.Agent = "down"
		}
	}
	r.ProvisionerDown = v.ProvisionerDown()
	if v.HaveSeq != 0 {
		age := now.Sub(v.HaveTime)
		r.HaveAge = age.Seconds()
		r.StaleHave = age > stale
	} else {
		r.StaleHave = true
	}
	r.Attention = attention(&r)
	return r
}

// FleetErrorRow is the row of a node whose snapshot cannot be read.
func FleetErrorRow(node string, err error) FleetRow {
	r := FleetRow{Node: node, HaveAge: -1, Warnings: -1, Error: err.Error()}
	r.Attention = attention(&r)
	return r
}

// SourceProblem is why a node's provisioner could not fill one file
// (DESIGN.md §12): no source had it, a source failed, a sealed secret is
// sealed to another key or cannot be opened. It never holds content.
type SourceProblem struct {
	Module string `json:"module"`
	Path   string `json:"path"`
	// State: missing, source-failed, sealed-to-other-key, cannot-open,
	// not-sent, refused (store.FillState); or [Shadowed], a file filled
	// from an earlier source than its sealed secret; or, with Module and
	// Path empty, the node's: [Untrusted] (its provisioner refuses the
	// node's plans and knocks for their signer) or [NoProvisioner].
	State string `json:"state"`
	// Why says what each source answered.
	Why string `json:"why"`
	// Since is when the provisioner first saw it so.
	Since time.Time `json:"since"`
	// Signer is, of an [Untrusted] problem, the key that signed the plan
	// or knock the provisioner refused (empty: unsigned); empty otherwise.
	Signer string `json:"signer,omitempty"`
	// LastFilled is, of a file not filled now, when its provisioner last
	// had the node write it (store.FillStatus.LastFilled): the node holds
	// that content unless its agent reported it gone (Gone), or its agent
	// is older than the report of files gone at its start (a reboot
	// emptying a tmpfs, a re-image). Zero: never filled, as the
	// provisioners recorded.
	LastFilled time.Time `json:"last_filled,omitzero"`
	// Gone is, of a file the node's agent reported missing on the node
	// (reconcile.View.Missing: deleted there since it was last in
	// place), the have that reported it ([MarkGone]): the node does not
	// keep what was last filled. 0: not reported.
	Gone uint64 `json:"gone,omitempty"`
	// GoneAtStart: the file Gone names was gone at the start of the
	// node's agent (reconcile.MissingFile.AtStart: a reboot or a re-image
	// emptied /run).
	GoneAtStart bool `json:"gone_at_start,omitempty"`
	// Stale: the provisioner that reported it is down
	// (reconcile.View.ProvisionerDown): it is what that provisioner last
	// saw, and nobody looks again until one runs (which fills on start,
	// and clears what it fills).
	Stale bool `json:"stale,omitempty"`
}

// SetSources sets the source problems of r and updates what needs
// attention. While r's provisioner is down, each reported file's problem
// is marked Stale; each file the node reported missing (r.Missing) is
// marked Gone, as `meshfold state` marks it ([MarkGone]: fleet's "the
// node has not reported it gone" a line after its "missing on the
// node" line, a fresh user's finding M6). p is not changed: a copy is
// kept.
func (r *FleetRow) SetSources(p []SourceProblem) {
	r.Sources = MarkGone(MarkStale(p, r.ProvisionerDown), r.Missing)
	r.setAttention()
}

// MarkStale returns ps with each file's problem marked Stale when down
// (the node's provisioner's down, reconcile.View.ProvisionerDown) is not
// nil; ps itself when it is, or when none is a file's.
func MarkStale(ps []SourceProblem, down *reconcile.AgentRecord) []SourceProblem {
	if down == nil || !slices.ContainsFunc(ps, func(p SourceProblem) bool { return p.State != NoProvisioner }) {
		return ps
	}
	out := slices.Clone(ps)
	for i := range out {
		if out[i].State != NoProvisioner {
			out[i].Stale = true
		}
	}
	return out
}

// MarkGone returns ps with each file's problem that missing (the node's
// reconcile.View.Missing) names marked Gone, with the have that reported
// it: the provisioners' record says what they last had the node write,
// the have what the node holds, and "last filled at" of a file the
// node reported gone read as held (provfix). ps itself when none is
// marked.
func MarkGone(ps []SourceProblem, missing []reconcile.MissingFile) []SourceProblem {
	var out []SourceProblem
	for i, p := range ps {
		j := slices.IndexFunc(missing, func(m reconcile.MissingFile) bool { return m.Module == p.Module && m.Path == p.Path })
		if j < 0 || p.Module == "" {
			continue
		}
		if out == nil {
			out = slices.Clone(ps)
		}
		out[i].Gone, out[i].GoneAtStart = missing[j].Seq, missing[j].AtStart
	}
	if out == nil {
		return ps
	}
	return out
}

// NoProvisioner is the [SourceProblem] State of a knock no provisioner
// answered ([KnockUnanswered]): Module and Path are empty.
const NoProvisioner = "no-provisioner"

// KnockGrace is how long a knock may wait for its provisioner's answer
// before `state` and `fleet` say nobody answered it ([KnockUnanswered]):
// a running provisioner takes a knock within milliseconds of its publish.
// A variable for tests only.
var KnockGrace = 10 * time.Second

// KnockAnswer is what a node's provisioner last answered
// (store.KnockAnswer, as the fill status bucket holds it).
type KnockAnswer struct {
	// Knock is the stream sequence of the newest knock it took (0:
	// none), At when it took it; Account its writer account.
	Knock   uint64
	At      time.Time
	Account string
}

// KnockUnanswered returns node's [NoProvisioner] problem when its newest
// knock (stream sequence knock, caused by cause, stored at knockTime) is
// newer than the newest its provisioner answered (ans; nil: none ever
// recorded) and was stored more than grace before now; ok is false
// otherwise. The problem's Why names the command to look for; Since is
// the knock's time.
func KnockUnanswered(node string, knock, cause uint64, knockTime time.Time, ans *KnockAnswer, now time.Time, grace time.Duration) (p SourceProblem, ok bool) {
	if knock == 0 || (ans != nil && ans.Knock >= knock) || now.Sub(knockTime) <= grace {
		return SourceProblem{}, false
	}
	last := "no provisioner of " + node + " has recorded an answer"
	if ans != nil {
		last = fmt.Sprintf("its provisioner last answered knock #%d %s ago", ans.Knock, Age(now.Sub(ans.At)))
		if ans.Account != "" {
			last += ", as " + events.Text(ans.Account)
		}
	}
	return SourceProblem{State: NoProvisioner, Since: knockTime,
		Why: fmt.Sprintf("no provisioner answered within %s (knock #%d ←#%d); is `meshfold provision %s …` running for %s? (%s)",
			grace, knock, cause, node, node, last)}, true
}

// Untrusted is the [SourceProblem] State of a node whose provisioner
// refuses its plans and knocks for their signer (store.FillUntrusted: a
// key its --trust does not name, one retired past its overlap, or none),
// so that it fills no file and takes no knock: Module and Path are
// empty, and Why names the key and what to do. It says why the node's
// knocks go unanswered ([AddUnanswered]).
const Untrusted = "untrusted"

// AddUnanswered returns ps with p, the node's [NoProvisioner] problem
// (an unanswered knock, [KnockUnanswered]), added, unless ps holds its
// provisioner's [Untrusted] problem: that says why the knock is not
// answered (the provisioner runs, and refuses it), where the unanswered
// knock's line would ask whether one runs (a fresh user's finding G6).
// ps itself is not changed. The one rule of `fleet`, `state` and the
// console.
func AddUnanswered(ps []SourceProblem, p SourceProblem) []SourceProblem {
	if slices.ContainsFunc(ps, func(q SourceProblem) bool { return q.State == Untrusted }) {
		return ps
	}
	return append(slices.Clip(ps), p)
}

// Shadowed is the [SourceProblem] State of a file that is filled, but
// from a source tried before the sealed one, while the sealed secret put
// for it holds other content (store.FillShadowed): the put is not what
// the node holds.
const Shadowed = "shadowed"

// SourcesHeader is the line `meshfold state` and the console print above
// [SourcesText]: what the lines are, shadowed files among them or not.
func SourcesHeader(ps []SourceProblem) string {
	kept := ""
	if slices.ContainsFunc(ps, func(p SourceProblem) bool { return !p.LastFilled.IsZero() && p.Gone == 0 && p.State != Shadowed }) {
		kept = ", or not filled again since last filled"
	}
	for _, p := range ps {
		if p.State == Shadowed {
			return "not filled" + kept + ", or filled from a source that shadows a put, as the provisioner reports it:\n"
		}
	}
	return "not filled" + kept + ", as the provisioner reports it:\n"
}

// SourcesText is what `meshfold state` and the console's node page print
// for one node's source problems, a line each (a long one wraps), each
// why whole; now dates them.
func SourcesText(node string, ps []SourceProblem, now time.Time) string {
	return sourcesText(node, ps, now, false)
}

// sourcesText is [SourcesText], each why cut ([cutWhy]) when cut.
func sourcesText(node string, ps []SourceProblem, now time.Time, cut bool) string {
	var t textWriter
	why := func(s string) string {
		if cut {
			return cutWhy(node, s)
		}
		return events.Plain(s)
	}
	for _, p := range ps {
		if p.State == NoProvisioner {
			t.line(0, "source", fmt.Sprintf("%s %s: %s ago: %s", node, p.State, Age(now.Sub(p.Since)), p.Why))
			continue
		}
		stale := ""
		if p.Stale {
			stale = " (as its provisioner, now down, last saw it)"
		}
		if p.State == Untrusted {
			t.line(0, "source", fmt.Sprintf("%s %s: its provisioner refuses the node's plans and knocks, since %s ago%s: %s", node, p.State,
				Age(now.Sub(p.Since)), stale, events.ErrorText(p.Why)))
			continue
		}
		if p.State == Shadowed {
			t.line(0, "source", fmt.Sprintf("%s %s %s sealed secret shadowed since %s ago%s: %s", node, p.Module, events.Text(p.Path),
				Age(now.Sub(p.Since)), stale, why(p.Why)))
			continue
		}
		if !p.LastFilled.IsZero() && p.Gone != 0 {
			// The node's agent reported it gone: not kept.
			at := ""
			if p.GoneAtStart {
				at = " at its agent's start"
			}
			t.line(0, "source", fmt.Sprintf("%s %s %s gone from the node%s (reported at #%d; last filled at %s); %s: %s since %s ago%s: %s", node, p.Module, events.Text(p.Path),
				at, p.Gone, FormatTime(p.LastFilled), goneWhy(p.State), p.State, Age(now.Sub(p.Since)), stale, why(p.Why)))
			continue
		}
		if !p.LastFilled.IsZero() {
			// The node was last seen holding the file, with what was
			// last filled (a fresh user's finding U10: "not filled:
			// missing" read as a file missing on the node), and its
			// agent has not reported it gone, in its life or at its
			// start (a reboot emptying a tmpfs /run, a re-image: fresh6
			// M4, when agents reported nothing gone at their start).
			t.line(0, "source", fmt.Sprintf("%s %s %s last filled at %s (the node has not reported it gone); %s: %s since %s ago%s: %s", node, p.Module, events.Text(p.Path),
				FormatTime(p.LastFilled), keptWhy(p.State), p.State, Age(now.Sub(p.Since)), stale, why(p.Why)))
			continue
		}
		t.line(0, "source", fmt.Sprintf("%s %s %s not filled: %s since %s ago%s: %s", node, p.Module, events.Text(p.Path), p.State,
			Age(now.Sub(p.Since)), stale, why(p.Why)))
	}
	return t.b.String()
}

// goneWhy says why a file the node reported gone is not filled again,
// by its state (store.FillState), as [keptWhy] does for a kept one.
func goneWhy(state string) string {
	switch state {
	case "refused", "not-sent":
		return "it is not written again"
	}
	return "no source gives it again"
}

// keptWhy says why a file last filled, not reported gone, has no newer
// content, by its state (store.FillState): refused or not sent, a newer
// one was found but not written; else no source gives one.
func keptWhy(state string) string {
	switch state {
	case "refused", "not-sent":
		return "a newer one is not written"
	}
	return "no source gives a newer one"
}

// FleetSourcesText lists the source problems of rows, a line each, each
// why longer than [whyKeep] bytes cut between words ([cutWhy]: `meshfold
// state NODE` prints it whole), after a line for each row whose
// provisioner is down ([ProvisionerDownText]).
func FleetSourcesText(rows []FleetRow, now time.Time) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(ProvisionerDownText(r.Node, r.ProvisionerDown, now))
		b.WriteString(sourcesText(r.Node, r.Sources, now, true))
	}
	return b.String()
}

// ProvisionerDownText is the line `fleet` and `state` print for a node
// whose provisioner client is down (down: reconcile.View.ProvisionerDown;
// nil prints nothing): since when, how its lease ended, and that its
// knocks go unanswered until a provisioner runs again, which answers
// them without a poke.
func ProvisionerDownText(node string, down *reconcile.AgentRecord, now time.Time) string {
	if down == nil {
		return ""
	}
	var t textWriter
	how := strings.TrimPrefix(ProvSummary(&events.Prov{Agent: events.Agent{State: events.AgentDown, Why: down.Why, Host: down.Host, PID: down.PID}}), "DOWN: ")
	t.line(0, "prov", fmt.Sprintf("%s no provisioner answered since %s (%s ago, #%d): %s; its knocks wait, and no file is filled, until `meshfold provision %s …` runs again (it fills everything on start)",
		node, FormatTime(down.Time), Age(now.Sub(down.Time)), down.Seq, how, node))
	return t.b.String()
}

// SetWarningSeqs sets r's journal warnings from their stream sequences:
// a warning at or below the node's ack (r.Ack) was read by an operator and
// counts in AckedWarnings; on a node nothing else flags, a warning older
// than its newest settled plan has cleared (the node converged since:
// issue 25) and counts in ClearedWarnings; neither is a need. The others
// count as [FleetRow.SetWarnings].
func (r *FleetRow) SetWarningSeqs(seqs []uint64) {
	r.ClearedWarnings, r.AckedWarnings = 0, 0
	r.WarningSeqs = r.WarningSeqs[:0]
	if len(seqs) == 0 && r.Warnings <= 0 && r.Attention != nil {
		// Most nodes have none, and had none: no need changes (the
		// journal need is Warnings > 0 either way), so Attention is
		// kept without making it again (issue 27: 3 % of `fleet -o
		// json`'s CPU at 100,000 nodes).
		r.Warnings = 0
		return
	}
	quiet := false
	if len(seqs) > 0 { // most nodes have none: no needs to count (issue 27)
		var buf [16]string
		quiet = len(needsOf(buf[:0], &FleetRow{Node: r.Node, Error: r.Error, Failed: r.Failed, FailedApplies: r.FailedApplies, Stuck: r.Stuck,
			Owed: r.Owed, Pending: r.Pending, Unsettled: r.Unsettled, AccountWarning: r.AccountWarning, StaleHave: r.StaleHave,
			Sources: r.Sources, Retired: r.Retired, ProvisionerDown: r.ProvisionerDown})) == 0
	}
	for _, s := range seqs {
		switch {
		case r.Ack.Acked(s):
			r.AckedWarnings++
		case quiet && s < r.SettledPlan:
			r.ClearedWarnings++
		default:
			r.WarningSeqs = append(r.WarningSeqs, s)
		}
	}
	r.SetWarnings(len(seqs) - r.ClearedWarnings - r.AckedWarnings)
}

// MaxWarningNotes is how many of a node's journal warnings fleet's table
// names after it, the newest first.
const MaxWarningNotes = 3

// noteKeep and noteTail are [WarningNote]'s budget ([cutText]): a journal
// message of at most noteKeep bytes is whole on fleet's line (wrapped); a
// longer one keeps its head, where the reconciler says what happened, and
// its last noteTail bytes, where the remedy is.
const (
	noteKeep = 320
	noteTail = 160
)

// WarningNote tells node's journal entry j at seq for the lines after
// fleet's table: "#seq level: message", the message whole when at most
// noteKeep bytes, else cut between words as [cutWhy] cuts a why, naming
// where it is whole ('meshfold audit NODE --why SEQ'). It was cut to 160
// bytes inside words, after events.ErrorText had cut it in the middle, and
// lost the remedy: "…refused again for its sig…r: the node's agent does
// not trust this reconciler's key (its… (217 bytes)" (a fresh user's
// finding U6).
func WarningNote(node string, seq uint64, j *events.Journal) string {
	return fmt.Sprintf("#%d %s: %s", seq, j.Level, cutText(j.Msg, noteKeep, noteTail, fmt.Sprintf("meshfold audit %s --why %d", node, seq)))
}

// FleetWarningsText names, for each row flagged with journal warnings,
// what they are: a line per WarningNotes entry, then how many more there
// are, and where all of them are (meshfold audit NODE). A row whose notes
// were not read gets the count and that pointer only.
func FleetWarningsText(rows []FleetRow) string {
	var t textWriter
	for _, r := range rows {
		if r.Warnings <= 0 {
			continue
		}
		for _, n := range r.WarningNotes {
			t.line(0, "journal", r.Node+" "+n)
		}
		if more := r.Warnings - len(r.WarningNotes); more > 0 {
			s := plural(more, "journal warning")
			if len(r.WarningNotes) > 0 {
				s = plural(more, "more journal warning")
			}
			t.line(0, "journal", fmt.Sprintf("%s %s: meshfold audit %s shows them", r.Node, s, r.Node))
		}
	}
	return t.b.String()
}

// FleetAckedText lists, a line each, the nodes of rows with acknowledged
// journal warnings: how many, through which sequence, by whom and when.
func FleetAckedText(rows []FleetRow) string {
	var t textWriter
	for _, r := range rows {
		if a := r.Ack; a != nil && r.AckedWarnings > 0 {
			t.line(0, "acked", fmt.Sprintf("%s %s through #%d acknowledged by %s at %s (ack #%d)",
				r.Node, plural(r.AckedWarnings, "journal warning"), a.Upto, events.Text(a.By), FormatTime(a.Time), a.Seq))
		}
	}
	return t.b.String()
}

// SetWarnings sets the count of journal warnings of r and updates what
// needs attention.
func (r *FleetRow) SetWarnings(n int) {
	r.Warnings = n
	r.setAttention()
}

// attention returns what r needs (needsOf) in a slice of its own.
func attention(r *FleetRow) []string {
	// Gathered in an array, then one slice of the right size: appending
	// grew each row's three or four times (issue 27: at 100,000 rows,
	// an eighth of fleet's allocations).
	var buf [16]string
	return sized(needsOf(buf[:0], r))
}

// setAttention sets r.Attention to what r needs, keeping its slice when
// that is unchanged: `fleet` sets each row's warnings and sources after
// making it, which at 100,000 rows allocated the same list again twice.
func (r *FleetRow) setAttention() {
	var buf [16]string
	if a := needsOf(buf[:0], r); r.Attention == nil || !slices.Equal(a, r.Attention) {
		r.Attention = sized(a)
	}
}

// needsOf appends to a what r needs, most pressing first
// ([FleetRow.Attention]).
func needsOf(a []string, r *FleetRow) []string {
	add := func(cond bool, what string) {
		if cond {
			a = append(a, what)
		}
	}
	if r.Retired {
		// Done: nothing of it needs an operator (a want brings it back).
		add(r.Error != "", "error")
		return a
	}
	add(r.Error != "", "error")
	add(r.Noisy != nil, "noisy")
	add(r.Agent == "down", "agent-down")
	add(r.Agent != "down" && !r.FeedLost.IsZero(), "feed-lost")
	add(r.ProvisionerDown != nil, "provisioner-down")
	add(len(r.Failed) > 0, "failed")
	add(len(r.FailedApplies) > 0, "apply-failed")
	add(len(r.Unhealthy) > 0, "unhealthy")
	add(len(r.Flapping) > 0, "flapping")
	add(len(r.Missing) > 0, "missing")
	add(len(r.Stuck.Unfilled) > 0, "unfilled")
	add(len(r.Sources) > 0, "source")
	add(r.Owed > 0, "owed")
	add(len(r.Pending) > 0, "approval")
	add(r.Unsettled > 0, "unsettled")
	add(r.Stuck.Paused != nil, "paused")
	add(r.Stuck.Retiring, "retiring")
	add(r.AccountWarning, "account")
	add(r.StaleHave && !r.Behind, "stale-have")
	add(r.Warnings > 0, "journal")
	return a
}

// sized returns a copy of a of its length: never nil (a row's JSON says
// "attention":[], not null).
func sized(a []string) []string {
	out := make([]string, len(a))
	copy(out, a)
	return out
}

// rank orders what needs an operator: a lower rank comes first
// ([FleetNeeds]' order).
var rank = func() map[string]int {
	m := make(map[string]int, len(FleetNeeds))
	for i, n := range FleetNeeds {
		m[n] = i
	}
	return m
}()

// SortFleet sorts rows so that what needs an operator comes first: rows
// are compared by their most pressing need (an unreadable snapshot, an
// agent down, a failed, unhealthy or flapping module, a failed apply, a
// file never filled, a source problem, owed items, pending approvals,
// unsettled plans, a pause, a retirement under way, the account warning,
// a stale have, journal warnings), then by how many needs they have, then by the
// counts (more owed items, more pending approvals, more unsettled plans,
// an older have first), then by node name. Rows that need nothing come
// last, by node name alone.
func SortFleet(rows []FleetRow) {
	order := FleetOrder(rows)
	sorted := make([]FleetRow, len(rows))
	for k, i := range order {
		sorted[k] = rows[i]
	}
	copy(rows, sorted)
}

// FleetOrder returns the indexes of rows in [SortFleet]'s order, rows
// left as they are: a writer of every row (`fleet -o json`) writes them
// in that order without moving them (at 100,000 rows of 500 B, a copy
// of 50 MB).
func FleetOrder(rows []FleetRow) []int {
	// The keys are made once per row and an index is sorted, then the
	// rows moved once: comparing rows (two map lookups and a sum each
	// time) and swapping them (a few hundred bytes each) was 6 % of
	// `fleet -o json`'s CPU at 10,000 nodes, and grows as n log n.
	keys := make([]FleetKey, len(rows))
	for i := range rows {
		keys[i] = FleetKeyOf(&rows[i])
	}
	order := make([]int, len(rows))
	for k, i := range FleetKeysOrder(keys) {
		order[k] = int(i)
	}
	return order
}

// FleetKeysOrder returns the indexes of keys in [CompareFleetKeys]'
// order, equal keys (rows of one node) in the order given: the order of
// [FleetOrder] for the rows the keys were made of. keys are not moved.
func FleetKeysOrder(keys []FleetKey) []int32 {
	// What most comparisons need, side by side in one array sorted in
	// place: the packed counts, the age as a number that compares as
	// CompareFleetKeys compares ages, and the name; the whole key only
	// for a pair of which one does not pack. Sorting an index that
	// reached each key through the keys' array (90 B apart, in no
	// order) was 8 % of `fleet -o json`'s CPU at 100,000 nodes (issue
	// 27).
	es := make([]keyEntry, len(keys))
	packs := true
	for i := range keys {
		k := &keys[i]
		es[i] = keyEntry{packed: k.packed, age: ageOrder(k.haveAge), node: k.node, i: int32(i), packs: k.packs}
		packs = packs && k.packs
	}
	byName := func(a, b keyEntry) int {
		if c := strings.Compare(a.node, b.node); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	}
	if packs && len(es) >= radixMin {
		// Every key packs: the counts and the age are two numbers, put
		// in order by a stable radix sort (the keys given in order: equal
		// ones stay so), then each run of equal numbers by name. Sorting
		// by comparisons was 6 % of `fleet -o json`'s CPU at 100,000
		// nodes (issue 27).
		radixSortKeys(es)
		for start := 0; start < len(es); {
			end := start + 1
			for end < len(es) && es[end].packed == es[start].packed && es[end].age == es[start].age {
				end++
			}
			if end-start > 1 {
				slices.SortFunc(es[start:end], byName)
			}
			start = end
		}
	} else {
		slices.SortFunc(es, func(a, b keyEntry) int {
			if !a.packs || !b.packs {
				if c := CompareFleetKeys(&keys[a.i], &keys[b.i]); c != 0 {
					return c
				}
				return cmp.Compare(a.i, b.i)
			}
			switch {
			case a.packed != b.packed:
				return cmp.Compare(a.packed, b.packed)
			case a.age != b.age:
				return cmp.Compare(a.age, b.age)
			}
			return byName(a, b)
		})
	}
	order := make([]int32, len(es))
	for k := range es {
		order[k] = es[k].i
	}
	return order
}

// keyEntry is what [FleetKeysOrder] sorts of a key.
type keyEntry struct {
	packed, age uint64
	node        string
	i           int32
	packs       bool
}

// radixMin is how many keys [FleetKeysOrder] needs before it sorts by
// radix: below, comparisons cost less than its passes.
var radixMin = 256

// radixSortKeys sorts es by packed, then age, stably: a byte at a time
// from the least significant, leaving out each byte every entry shares.
func radixSortKeys(es []keyEntry) {
	var counts [16][256]int
	for i := range es {
		e := &es[i]
		for b := range 8 {
			counts[b][byte(e.age>>(8*b))]++
			counts[8+b][byte(e.packed>>(8*b))]++
		}
	}
	tmp := make([]keyEntry, len(es))
	src, dst := es, tmp
	for pass := range 16 {
		c := &counts[pass]
		shift, packed := uint(8*(pass%8)), pass >= 8
		digit := func(e *keyEntry) byte {
			if packed {
				return byte(e.packed >> shift)
			}
			return byte(e.age >> shift)
		}
		if c[digit(&src[0])] == len(src) {
			continue // every entry has this byte
		}
		var at [256]int
		sum := 0
		for d := range 256 {
			at[d] = sum
			sum += c[d]
		}
		for i := range src {
			d := digit(&src[i])
			dst[at[d]] = src[i]
			at[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &es[0] {
		copy(es, src)
	}
}

// ageOrder maps a have's age to a number that orders as
// [CompareFleetKeys] orders ages: the older first (a larger number
// after a smaller), -0 as 0, NaN (which cmp.Compare puts before every
// age) last.
func ageOrder(age float64) uint64 {
	if age != age {
		return math.MaxUint64
	}
	if age == 0 {
		age = 0 // -0 as +0
	}
	u := math.Float64bits(age)
	if u&(1<<63) != 0 { // negative: larger bits are smaller numbers
		u = ^u
	} else {
		u |= 1 << 63
	}
	return ^u // the older first
}

// FleetKey is what [SortFleet] compares of a row ([FleetKeyOf]): a
// writer that keeps a row's key and its encoding, not the row (`fleet
// -o json`), sorts by it as [FleetOrder] does.
type FleetKey struct {
	first, needs, restarts, owed, pending, unsettled int
	// packed holds the six counts above in one number that compares as
	// they do, when each fits its field (packs).
	packed  uint64
	packs   bool
	haveAge float64
	node    string
}

// The bits of each count in [FleetKey.packed], from the most
// significant: first, needs, restarts, owed, pending, unsettled.
var fleetKeyBits = [6]uint{5, 5, 14, 14, 12, 12}

// FleetKeyOf returns r's [FleetKey]. It keeps r.Node, nothing else of r.
func FleetKeyOf(r *FleetRow) FleetKey {
	first := len(rank)
	if len(r.Attention) > 0 {
		first = rank[r.Attention[0]]
	}
	k := FleetKey{first: first, needs: len(r.Attention), restarts: restarts(r.Failed), owed: r.Owed,
		pending: len(r.Pending), unsettled: r.Unsettled, haveAge: r.HaveAge, node: r.Node}
	if len(r.Attention) == 0 {
		// A row that needs nothing is placed by its name alone, as the
		// console's "Every node" table is: its have's age is no need
		// (an old one is, stale-have), and ordering by it left the calm
		// rows in no order a reader sees (fresh12 m3: n05, n07, n06, n02…).
		k.haveAge = 0
	}
	// The first need ascending, the others descending (their
	// complement within the field).
	k.packs = true
	for i, v := range [6]int{k.first, k.needs, k.restarts, k.owed, k.pending, k.unsettled} {
		field := uint64(1)<<fleetKeyBits[i] - 1
		if v < 0 || uint64(v) > field {
			k.packs = false
			break
		}
		if i > 0 {
			v = int(field) - v
		}
		k.packed = k.packed<<fleetKeyBits[i] | uint64(v)
	}
	return k
}

// CompareFleetKeys returns -1 when a's row comes before b's in
// [SortFleet]'s order, +1 when after, 0 when neither (rows of one node
// name: [FleetOrder] then keeps their order).
func CompareFleetKeys(a, b *FleetKey) int {
	// Key by key, stopping at the first that differs (cmp.Or would
	// compare every key, names too: 13 % of fleet's CPU at 100,000); the
	// counts in one comparison when both keys pack them (the sort was
	// 7 % of `fleet -o json`'s CPU at 100,000, issue 27).
	switch {
	case a.packs && b.packs:
		if a.packed != b.packed {
			return cmp.Compare(a.packed, b.packed)
		}
	case a.first != b.first:
		return cmp.Compare(a.first, b.first)
	case a.needs != b.needs:
		return -cmp.Compare(a.needs, b.needs)
	case a.restarts != b.restarts:
		return -cmp.Compare(a.restarts, b.restarts)
	case a.owed != b.owed:
		return -cmp.Compare(a.owed, b.owed)
	case a.pending != b.pending:
		return -cmp.Compare(a.pending, b.pending)
	case a.unsettled != b.unsettled:
		return -cmp.Compare(a.unsettled, b.unsettled)
	}
	if c := cmp.Compare(a.haveAge, b.haveAge); c != 0 {
		return -c
	}
	return cmp.Compare(a.node, b.node)
}

// FleetNeeds are the needs a [FleetRow.Attention] may list, most
// pressing first (the order [SortFleet] ranks them in).
var FleetNeeds = []string{"error", "noisy", "agent-down", "feed-lost", "provisioner-down", "failed", "apply-failed", "unhealthy", "flapping", "missing",
	"unfilled", "source", "owed", "approval", "unsettled", "paused", "retiring", "account",
	"stale-have", "journal"}

// NeedNothing is the name the fleet's summary ([FleetSummaryText], the
// console's) gives the rows needing nothing ([CountNeeds]' calm), and
// the filter that picks them (`fleet --needs nothing`, the console's
// ?need=nothing): no need of [FleetNeeds].
const NeedNothing = "nothing"

// NeedCount is how many rows share one need.
type NeedCount struct {
	Need  string `json:"need"`
	Nodes int    `json:"nodes"`
}

// CountNeeds counts, for each need of [FleetNeeds] at least one row has,
// the rows that have it, most pressing need first (a row counts under
// each of its needs); calm is the number of rows needing nothing.
func CountNeeds(rows []FleetRow) (counts []NeedCount, calm int) {
	n := make([]int, len(FleetNeeds))
	for _, r := range rows {
		if len(r.Attention) == 0 {
			calm++
		}
		for _, a := range r.Attention {
			if i, ok := rank[a]; ok {
				n[i]++
			}
		}
	}
	for i, c := range n {
		if c > 0 {
			counts = append(counts, NeedCount{Need: FleetNeeds[i], Nodes: c})
		}
	}
	return counts, calm
}

// FleetSummaryText is the summary `meshfold fleet` prints above a table
// too long for one page: a line per need of counts (from [CountNeeds])
// with its node count, then the calm nodes.
func FleetSummaryText(counts []NeedCount, calm int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-14s %7s\n", "NEEDS", "NODES")
	for _, c := range counts {
		fmt.Fprintf(&b, "%-14s %7d\n", c.Need, c.Nodes)
	}
	fmt.Fprintf(&b, "%-14s %7d\n", NeedNothing, calm)
	return b.String()
}

// FleetHeader is the header line of [FleetRow.Line].
func FleetHeader(nodeWidth int) string {
	return fmt.Sprintf("%-*s %7s %7s %4s %4s %4s %6s %7s %s", nodeWidth, "NODE", "WANT", "SETTLED", "UNST", "HELD", "OWED", "KNOCK", "HAVE", "NEEDS")
}

// Line returns the row in at most [LineWidth] columns, aligned under
// [FleetHeader]: node, want, settled plan, unsettled plans, held rows, owed
// items, last knock's cause (←#N, as the timeline writes it), the have's age, and what needs attention
// (pending approvals as module→build).
func (r FleetRow) Line(nodeWidth int) string {
	if r.Error != "" {
		return Clip(fmt.Sprintf("%-*s error: %s", nodeWidth, r.Node, r.Error), LineWidth)
	}
	have := "none"
	if r.HaveAge >= 0 {
		have = Age(time.Duration(r.HaveAge * float64(time.Second)))
	}
	needs := make([]string, 0, len(r.Attention))
	for _, a := range r.Attention {
		switch a {
		case "approval":
			for _, p := range r.Pending {
				needs = append(needs, "approve "+p.Module+"→"+p.Pending)
			}
		case "journal":
			needs = append(needs, plural(r.Warnings, "warning"))
		case "noisy":
			needs = append(needs, "noisy "+reconcile.FormatBytes(r.Noisy.Bytes))
		case "failed":
			for _, f := range r.Failed {
				needs = append(needs, failedNeed(f))
			}
		case "apply-failed":
			for _, f := range r.FailedApplies {
				needs = append(needs, "apply failed: "+cmp.Or(f.Module, "the plan"))
			}
		case "unhealthy":
			for _, f := range r.Unhealthy {
				needs = append(needs, f.Module+" unhealthy")
			}
		case "flapping":
			for _, f := range r.Flapping {
				// ×restarts since its apply, or its crashes (of its build)
				// when more: an apply of the same build resets the one,
				// not the other.
				needs = append(needs, fmt.Sprintf("%s flapping ×%d", f.Module, max(f.Restarts, len(f.Crashes))))
			}
		case "missing":
			needs = append(needs, fmt.Sprintf("missing %d", len(r.Missing)))
		case "unfilled":
			needs = append(needs, fmt.Sprintf("unfilled %d", len(r.Stuck.Unfilled)))
		case "owed":
			if n := len(r.Stuck.Owed); n > 0 {
				needs = append(needs, fmt.Sprintf("owed (%d over 1h)", n))
			} else {
				needs = append(needs, a)
			}
		case "paused":
			needs = append(needs, "paused "+Age(time.Duration(r.Stuck.PausedFor*float64(time.Second))))
		case "feed-lost":
			needs = append(needs, "plan feed lost")
		default:
			needs = append(needs, a)
		}
	}
	if r.Retired {
		needs = append(needs, "retired")
	}
	knock := "-"
	if r.LastKnockCause != 0 {
		knock = fmt.Sprintf("←#%d", r.LastKnockCause)
	}
	line := fmt.Sprintf("%-*s %7s %7s %4d %4d %4d %6s %7s %s", nodeWidth, r.Node, seqOrDash(r.Want), seqOrDash(r.SettledPlan),
		r.Unsettled, r.Held, r.Owed, knock, have, strings.Join(needs, ", "))
	return Clip(strings.TrimRight(line, " "), LineWidth)
}

func seqOrDash(s uint64) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprintf("#%d", s)
}

// FleetAppliesText says, one line per node and module, why an apply
// failed (FleetRow.FailedApplies, as [FailedText] tells it), ages
// against now.
func FleetAppliesText(rows []FleetRow, now time.Time) string {
	var t textWriter
	for _, r := range rows {
		for _, f := range r.FailedApplies {
			t.line(0, "apply-failed", r.Node+" "+FailedText(f, r.SettledPlan, now, "ago"))
		}
	}
	return t.b.String()
}

// FleetNoisyText says, one line per noisy row (FleetRow.Noisy), what the
// node published, over which sequences, and what an operator does.
func FleetNoisyText(rows []FleetRow) string {
	var t textWriter
	for _, r := range rows {
		if n := r.Noisy; n != nil {
			t.line(0, "noisy", fmt.Sprintf("%s %s (#%d–#%d), over %d events or %s of its own events in %s: if its agent is not looping, its node credential may be stolen: "+
				"'meshfold auth revoke node-%s' (docs/operations.md, \"A node that floods the stream\"); 'meshfold ack %s' once it is handled",
				r.Node, n, n.Seq, n.LastSeq, reconcile.NoisyEvents, reconcile.FormatBytes(reconcile.NoisyBytes), reconcile.FormatSpan(reconcile.NoisyWindow), r.Node, r.Node))
		}
	}
	return t.b.String()
}

// FleetMissingText says, one line per node and file, the declared files
// the node's agent reported missing on the node and whose refill was
// asked ([MissingText]).
func FleetMissingText(rows []FleetRow) string {
	var t textWriter
	for _, r := range rows {
		for _, m := range r.Missing {
			t.line(0, "missing", r.Node+" "+MissingText(m))
		}
	}
	return t.b.String()
}

// FleetStuckText returns, for the lines after fleet's table, what is stuck
// on each row: who paused a node and since when, a retirement waiting for
// its empty plan to settle, each file never filled since its module was
// placed (and how long ago that plan settled), each owed item older than
// an hour, and what an operator can do about it.
func FleetStuckText(rows []FleetRow) string {
	var t textWriter
	for _, r := range rows {
		k := r.Stuck
		if p := k.Paused; p != nil {
			s := fmt.Sprintf("%s paused by %s since %s (%s): no new plan until 'meshfold resume %s'", r.Node, events.Text(p.By),
				FormatTime(p.Time), Age(time.Duration(k.PausedFor*float64(time.Second))), r.Node)
			if p.Reason != "" {
				s += "; reason: " + events.Text(p.Reason)
			}
			t.line(0, "stuck", s)
		}
		if k.Retiring {
			t.line(0, "stuck", fmt.Sprintf("%s retiring since %s: its empty plan has not settled ('meshfold retire %s --force' if its agent is gone)",
				r.Node, FormatTime(k.Retire.Time), r.Node))
		}
		for _, u := range k.Unfilled {
			since := fmt.Sprintf("since plan #%d placed it, %s ago", u.Plan, Age(time.Duration(u.For*float64(time.Second))))
			if u.Plan == 0 {
				since = "(declared since before placements were recorded)"
			}
			t.line(0, "stuck", fmt.Sprintf("%s %s %s never filled %s (the provisioner's source?)", r.Node, u.Module, u.Path, since))
		}
		for _, o := range k.Owed {
			t.line(0, "stuck", fmt.Sprintf("%s %s %s owed (%s) since %s ago ('meshfold waive %s %s %s' if nobody will fill it)",
				r.Node, o.Module, o.Path, o.Reason, Age(time.Duration(o.For*float64(time.Second))), r.Node, o.Module, o.Path))
		}
	}
	return t.b.String()
}

// restarts sums the restarts of rs.
func restarts(rs []reconcile.ModuleRuntime) int {
	n := 0
	for _, r := range rs {
		n += r.Restarts
	}
	return n
}
