package audit

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/meshfold/meshfold/events"
)

// LineWidth is the most columns a timeline line, a fleet line or a line of
// a why or state text takes.
const LineWidth = 100

// Entry is one event of the timeline. Its JSON field names are stable:
// scripts read them (`meshfold audit --json`).
type Entry struct {
	Seq  uint64      `json:"seq"`
	Time time.Time   `json:"time"` // the stream's time
	Node string      `json:"node"`
	Kind events.Kind `json:"kind"`
	// Cause is the sequence of the event that caused a plan, knock or
	// journal entry; 0 for the other kinds.
	Cause uint64 `json:"cause,omitempty"`
	// Summary is the short, untruncated summary the line shows.
	Summary string `json:"summary"`
	// Error says why the event could not be decoded; Event is then nil.
	Error string `json:"error,omitempty"`
	// Event is the payload as decoded, with the wire's field names.
	Event events.Payload `json:"event,omitempty"`
	// Rollout is the rollout step that published a want; the summary
	// begins with it.
	Rollout *RolloutStep `json:"rollout,omitempty"`
	// ByChecked marks an operator event whose `by` the server checked:
	// a named operator's, published on its named subject
	// (events.Event.Checked); the summary says "by NAME (checked)".
	// Absent: the `by` is self-declared (the shared operator's creds),
	// or the kind has none.
	ByChecked bool `json:"by_checked,omitempty"`
}

// Timeline returns the entries of the events at positions [from, to).
// A want's summary says what changed from the want before it, even when
// that want is before from.
func (h *History) Timeline(from, to int) []Entry {
	var prev *events.Want
	var prevHave *events.Have
	var plan uint64 // the newest plan before the event
	for _, ev := range h.Events[:from] {
		switch p := ev.Payload.(type) {
		case *events.Want:
			prev = p
		case *events.Have:
			prevHave = p
		case *events.Plan:
			plan = ev.Seq
		}
	}
	out := make([]Entry, 0, to-from)
	for _, ev := range h.Events[from:to] {
		e := Entry{Seq: ev.Seq, Time: ev.Time, Node: ev.Node, Kind: ev.Kind, Event: ev.Payload, ByChecked: ev.Checked}
		if ev.Err != nil {
			e.Error = ev.Err.Error()
		}
		e.Cause = causeOf(ev.Payload)
		e.Summary = h.summary(ev, prev)
		if st, ok := h.step(ev); ok {
			e.Rollout = &st
		}
		switch p := ev.Payload.(type) {
		case *events.Want:
			prev = p
		case *events.Have:
			// A have is told against the one before it: running → failed
			// → running is a crash loop's story (DESIGN.md §8).
			if ev.Err == nil {
				e.Summary = haveSummaryAfter(p, prevHave, plan)
			}
			prevHave = p
		case *events.Plan:
			plan = ev.Seq
		}
		out = append(out, e)
	}
	return out
}

func causeOf(p events.Payload) uint64 {
	switch p := p.(type) {
	case *events.Plan:
		return p.Cause
	case *events.Knock:
		return p.Cause
	case *events.Journal:
		return p.Cause
	}
	return 0
}

// Line returns the entry as one line of at most [LineWidth] columns:
// sequence (right-aligned in seqWidth digits), stream time to the second
// (a time bound written that way takes every event of that second), kind,
// and the summary, cut with "…" when too long. The JSON entry has the
// full time and the whole summary.
func (e Entry) Line(seqWidth int) string {
	line := fmt.Sprintf("%*d %s %-7s %s", seqWidth, e.Seq, e.Time.UTC().Format(time.RFC3339), e.Kind, e.Summary)
	return Clip(line, LineWidth)
}

// SeqWidth returns the digits of the largest sequence among entries, for
// [Entry.Line].
func SeqWidth(entries []Entry) int {
	w := 1
	for _, e := range entries {
		w = max(w, len(strconv.FormatUint(e.Seq, 10)))
	}
	return w
}

// Clip cuts s to at most width runes, ending it with "…" when cut.
func Clip(s string, width int) string {
	if utf8.RuneCountInString(s) <= width {
		return s
	}
	r := []rune(s)
	return string(r[:width-1]) + "…"
}

// Summary returns the short summary of ev, most telling part first (a
// line may cut the end); an effect's starts with ←#cause; prev is the node's want before
// it (nil when none), against which a want's changes are told.
func Summary(ev events.Event, prev *events.Want) string {
	if ev.Err != nil {
		return "not folded, cannot be decoded: " + ev.Err.Error() // values inside are events.Short
	}
	// who is an operator's name as the line tells it: "(checked)" when
	// the server checked it (a named operator's subject).
	who := func(by string) string {
		if ev.Checked {
			return by + " (checked)"
		}
		return by
	}
	switch p := ev.Payload.(type) {
	case *events.Want:
		return wantSummary(p, prev)
	case *events.Approve:
		return fmt.Sprintf("%s %s by %s", p.Module, ShortBuild(p.Build), who(p.By))
	case *events.Have:
		return haveSummary(p)
	case *events.Settle:
		return settleSummary(p)
	case *events.Refusal:
		s := fmt.Sprintf("%s %s, plan %s (%s, writer %s)", p.Path, p.Reason, planRef(p.Plan), p.Module, p.Writer)
		if p.Error != "" {
			s += ": " + events.ErrorText(p.Error)
		}
		return s
	case *events.Filled:
		return fmt.Sprintf("%s at plan %s (%s)", p.Path, planRef(p.Plan), p.Module)
	case *events.Plan:
		return planSummary(p)
	case *events.Knock:
		return knockSummary(p)
	case *events.Journal:
		// Whole (quoted only when it holds a control character): `audit
		// --why`, -o json and the console's node page show it so, and
		// fleet's journal line, which may cut it, points there (a fresh
		// user's finding U6); the timeline's one line clips it.
		return fmt.Sprintf("←#%d %s: %s", p.Cause, p.Level, events.Plain(p.Msg))
	case *events.Pause:
		return "by " + who(p.By) + reasonSuffix(p.Reason)
	case *events.Resume:
		return "by " + who(p.By) + reasonSuffix(p.Reason)
	case *events.Poke:
		return "by " + who(p.By) + reasonSuffix(p.Reason)
	case *events.Revoke:
		return fmt.Sprintf("%s %s by %s", p.Module, ShortBuild(p.Build), who(p.By))
	case *events.Waive:
		return fmt.Sprintf("%s (%s) by %s", p.Path, p.Module, who(p.By))
	case *events.Retire:
		if p.Force {
			return "by " + who(p.By) + ", forced" + reasonSuffix(p.Reason)
		}
		return "by " + who(p.By) + reasonSuffix(p.Reason)
	case *events.Agent:
		return AgentSummary(p)
	case *events.Prov:
		return ProvSummary(p)
	case *events.Ack:
		a := *p
		a.By = who(p.By)
		return AckSummary(&a, ev.Seq)
	case *events.Gate:
		if p.Lift {
			return fmt.Sprintf("%s: gate lifted by %s", p.Module, who(p.By)) + reasonSuffix(p.Reason)
		}
		return fmt.Sprintf("%s: gated by %s", p.Module, who(p.By)) + reasonSuffix(p.Reason)
	}
	return string(ev.Kind)
}

// AckSummary tells the ack at seq: "journal warnings through #41 read by
// alice" (an upto of 0, or above seq, is seq: the fold's rule).
func AckSummary(a *events.Ack, seq uint64) string {
	upto := a.Upto
	if upto == 0 || upto > seq {
		upto = seq
	}
	return fmt.Sprintf("journal warnings through #%d acknowledged by %s", upto, a.By) + reasonSuffix(a.Reason)
}

// AgentSummary tells an agent event: "DOWN: lease expired (agent pid 4242
// on web-1)", "up: lease claimed (agent pid 4300 on web-1)".
func AgentSummary(a *events.Agent) string {
	s := "up: lease claimed"
	if a.State == events.AgentDown {
		switch a.Why {
		case events.WhyExpired:
			s = "DOWN: lease expired, not renewed"
		case events.WhyReleased:
			s = "DOWN: agent stopped, lease released"
		case events.WhyReplaced:
			s = "DOWN: lease taken by a new agent"
		default:
			s = "DOWN: " + events.Text(string(a.Why))
		}
	}
	var who []string
	if a.PID > 0 {
		who = append(who, "agent pid "+strconv.Itoa(a.PID))
	}
	if a.Host != "" {
		who = append(who, "on "+events.Text(a.Host))
	}
	if len(who) > 0 {
		s += " (" + strings.Join(who, " ") + ")"
	}
	return s
}

// ProvSummary tells a provisioner's liveness event: "DOWN: lease
// expired, not renewed (provisioner pid 4242 on web-1)", "up: lease
// claimed (provisioner pid 4300 on web-1)".
func ProvSummary(p *events.Prov) string {
	s := AgentSummary(&p.Agent)
	s = strings.Replace(s, "agent pid", "provisioner pid", 1)
	if p.State == events.AgentDown {
		switch p.Why {
		case events.WhyReleased:
			s = strings.Replace(s, "agent stopped", "provisioner stopped", 1)
		case events.WhyReplaced:
			s = strings.Replace(s, "a new agent", "a new provisioner", 1)
		}
	}
	return s
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ": " + events.Text(r)
}

// planRef names a plan sequence: #N, or 0 (the node had settled none).
func planRef(seq uint64) string {
	if seq == 0 {
		return "0"
	}
	return "#" + strconv.FormatUint(seq, 10)
}

func countFiles(ms []events.WantModule) int {
	n := 0
	for _, m := range ms {
		n += len(m.Files)
	}
	return n
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func wantSummary(w, prev *events.Want) string {
	head := plural(len(w.Modules), "module") + ", " + plural(countFiles(w.Modules), "file")
	if prev == nil {
		return "first want, " + head + ": " + wantModules(w)
	}
	changes := WantChanges(prev, w)
	if len(changes) == 0 {
		return head + "; unchanged"
	}
	return head + "; " + strings.Join(changes, "; ")
}

// wantChange is a want's change from prev alone: "web a→b", "first want:
// web b", "unchanged".
func wantChange(w, prev *events.Want) string {
	if prev == nil {
		return "first want: " + wantModules(w)
	}
	changes := WantChanges(prev, w)
	if len(changes) == 0 {
		return "unchanged"
	}
	return strings.Join(changes, "; ")
}

// wantModules lists a want's modules: "web b1, db d1 (requires approval)".
func wantModules(w *events.Want) string {
	parts := make([]string, len(w.Modules))
	for i, m := range w.Modules {
		parts[i] = m.Name + " " + ShortBuild(m.Build) + wantFlags(m)
	}
	return strings.Join(parts, ", ")
}

func wantFlags(m events.WantModule) string {
	var f []string
	if m.Provisioner {
		f = append(f, "provisioner")
	}
	if m.RequiresApproval {
		f = append(f, "requires approval")
	}
	if m.Hold {
		f = append(f, "hold")
	}
	if len(f) == 0 {
		return ""
	}
	return " (" + strings.Join(f, ", ") + ")"
}

// WantChanges lists what changed from want prev to want w, module by
// module in w's order, removals last: "+name build" for an added module,
// "-name" for a removed one, and for a changed one its build (a→b),
// runs_as, files added and removed, and flags set or cleared.
func WantChanges(prev, w *events.Want) []string {
	old := map[string]events.WantModule{}
	for _, m := range prev.Modules {
		old[m.Name] = m
	}
	var out []string
	for _, m := range w.Modules {
		o, ok := old[m.Name]
		if !ok {
			out = append(out, "+"+m.Name+" "+ShortBuild(m.Build)+wantFlags(m))
			continue
		}
		var c []string
		if o.Build != m.Build {
			c = append(c, ShortBuild(o.Build)+"→"+ShortBuild(m.Build))
		}
		if o.RunsAs != m.RunsAs {
			c = append(c, "runs_as "+orNone(o.RunsAs)+"→"+orNone(m.RunsAs))
		}
		for _, f := range m.Files {
			if !slices.ContainsFunc(o.Files, func(g events.File) bool { return g.Path == f.Path }) {
				c = append(c, "+file "+f.Path)
			} else if !slices.Contains(o.Files, f) {
				c = append(c, "mode "+f.Path+" "+string(f.Mode))
			}
		}
		for _, f := range o.Files {
			if !slices.ContainsFunc(m.Files, func(g events.File) bool { return g.Path == f.Path }) {
				c = append(c, "-file "+f.Path)
			}
		}
		c = appendFlag(c, o.Provisioner, m.Provisioner, "provisioner")
		c = appendFlag(c, o.RequiresApproval, m.RequiresApproval, "requires approval")
		c = appendFlag(c, o.Hold, m.Hold, "hold")
		if len(c) > 0 {
			out = append(out, m.Name+" "+strings.Join(c, ", "))
		}
	}
	for _, m := range prev.Modules {
		if !slices.ContainsFunc(w.Modules, func(n events.WantModule) bool { return n.Name == m.Name }) {
			out = append(out, "-"+m.Name)
		}
	}
	return out
}

func appendFlag(c []string, was, is bool, name string) []string {
	switch {
	case is && !was:
		return append(c, "+"+name)
	case was && !is:
		return append(c, "-"+name)
	}
	return c
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func haveSummary(h *events.Have) string {
	if len(h.Modules) == 0 {
		return "nothing runs"
	}
	parts := make([]string, len(h.Modules))
	for i, m := range h.Modules {
		s := m.Name + " " + orNone(ShortBuild(m.Build))
		if m.Account != "" {
			s += "@" + m.Account
		}
		if m.State != events.Running {
			s += " " + string(m.State)
		}
		s += haveDetail(m)
		parts[i] = s
	}
	return strings.Join(parts, ", ")
}

func settleSummary(s *events.Settle) string {
	switch {
	case s.Op == events.OpFailed:
		m := s.Module
		if m == "" {
			m = "(no module)"
		}
		return fmt.Sprintf("plan #%d FAILED for %s: %s", s.Plan, m, events.ErrorText(s.Error))
	case s.Module == "":
		return fmt.Sprintf("plan #%d settled, no module changed", s.Plan)
	case s.Op == events.OpRemove:
		return fmt.Sprintf("plan #%d settled: %s removed", s.Plan, s.Module)
	}
	return fmt.Sprintf("plan #%d settled: %s applied", s.Plan, s.Module)
}

func planSummary(p *events.Plan) string {
	var composed, held []string
	for _, m := range p.Modules {
		if !m.Held {
			composed = append(composed, m.Name+" "+ShortBuild(m.Build))
			continue
		}
		s := m.Name + " (" + string(m.Why)
		if m.Pending != "" {
			s += ", pending " + ShortBuild(m.Pending)
		}
		held = append(held, s+")")
	}
	s := fmt.Sprintf("←#%d account %s", p.Cause, orNone(p.ProvisionerAccount))
	if len(held) > 0 {
		s += "; held " + strings.Join(held, ", ")
	}
	if len(composed) > 0 {
		s += "; composed " + strings.Join(composed, ", ")
	}
	if len(p.Modules) == 0 {
		s += "; no module"
	}
	return s + fmt.Sprintf("; want #%d", p.Want)
}

func knockSummary(k *events.Knock) string {
	rs := make([]string, len(k.Reasons))
	for i, r := range k.Reasons {
		rs[i] = string(r)
	}
	paths := make([]string, 0, len(k.Owed))
	for _, o := range k.Owed {
		if !slices.Contains(paths, o.Path) {
			paths = append(paths, o.Path)
		}
	}
	if len(paths) == 0 {
		// An operator's poke: no owed item, every file filled again.
		return fmt.Sprintf("←#%d %s: fill every file again", k.Cause, strings.Join(rs, ","))
	}
	return fmt.Sprintf("←#%d %s: %s", k.Cause, strings.Join(rs, ","), strings.Join(paths, ", "))
}
