package audit

import (
	"cmp"
	"fmt"
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
		t.line(0, "", fmt.Sprintf("%s as of %s: %d events folded, the last #%d at %s", a.Node, a.Bound, a.Events, a.Seq, FormatTime(a.Time)))
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
	acct := fmt.Sprintf("plan names %s, what runs names %s", orNone(v.ProvisionerAccount), orNone(v.RunningAccount))
	if v.AccountWarning {
		acct += " (WARNING: the node refuses every filled write)"
	}
	t.line(1, "account", acct)
	t.line(1, "counts", fmt.Sprintf("%s, %s, %d held", plural(v.Modules, "module"), plural(v.Files, "declared file"), v.Held))
	for _, r := range c.Modules {
		if r.Held {
			s := fmt.Sprintf("%s (%s) carries %s", r.Name, r.Why, orNone(r.Build))
			if r.Pending != "" {
				s += ", pending " + r.Pending
			}
			t.line(1, "held", s)
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
	for _, r := range v.Runtime {
		t.line(1, "runs", runtimeText(r, now, suffix))
	}
	if len(v.Owed) == 0 {
		t.line(1, "owed", "nothing")
	}
	for _, o := range v.Owed {
		t.line(1, "owed", fmt.Sprintf("%s %s (%s, plan %s, writer %s)", o.Module, o.Path, o.Reason, planRef(o.Plan), o.Writer))
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
		t.line(1, "knock", fmt.Sprintf("last caused by #%d: %s; %s", k.Cause, strings.Join(rs, ","), strings.Join(paths, ", ")))
	} else {
		t.line(1, "knock", "none")
	}
	if v.HaveSeq == 0 {
		t.line(1, "have", "none yet")
	} else {
		t.line(1, "have", fmt.Sprintf("#%d at %s, %s %s", v.HaveSeq, FormatTime(v.HaveTime), Age(now.Sub(v.HaveTime)), suffix))
	}
}

// Age formats a duration for an operator: 45s, 12m, 3h10m, 2d4h.
func Age(d time.Duration) string {
	if d < 0 {
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
	Node        string `json:"node"`
	Seq         uint64 `json:"seq"`
	Want        uint64 `json:"want"`
	SettledPlan uint64 `json:"settled_plan"`
	EmittedPlan uint64 `json:"emitted_plan"`
	Unsettled   int    `json:"unsettled"`
	Modules     int    `json:"modules"`
	Held        int    `json:"held"`
	// Pending are the rows held for an approval, with the build waiting.
	Pending   []reconcile.Held `json:"pending,omitempty"`
	Owed      int              `json:"owed"`
	LastKnock uint64           `json:"last_knock,omitempty"`
	// HaveTime is the last have's stream time; HaveAge its age in
	// seconds at the time the row was made (-1: no have yet).
	HaveTime       time.Time `json:"have_time,omitzero"`
	HaveAge        float64   `json:"have_age_s"`
	StaleHave      bool      `json:"stale_have"`
	AccountWarning bool      `json:"account_warning"`
	// Failed are the modules the newest have reports failed (a crash
	// loop), with the files they wait for.
	Failed []reconcile.ModuleRuntime `json:"failed,omitempty"`
	// Warnings counts journal entries of level warn or error in the
	// window asked for (-1: not counted).
	Warnings int `json:"journal_warnings"`
	// Attention lists what needs an operator, most pressing first:
	// "error", "failed", "owed", "approval", "unsettled", "account", "stale-have",
	// "journal".
	Attention []string `json:"attention"`
	// Error says why the node's snapshot could not be read.
	Error string `json:"error,omitempty"`
}

// FleetRowOf returns the fleet row of s at now; a have older than stale
// (or none at all) is stale.
func FleetRowOf(s *reconcile.State, now time.Time, stale time.Duration) FleetRow {
	return FleetRowOfView(s.View(), now, stale)
}

// FleetRowOfView returns the fleet row of a node's view at now, as
// [FleetRowOf] makes it from the state: for a view the reconciler's state
// service answered (the web console's live rows).
func FleetRowOfView(v reconcile.View, now time.Time, stale time.Duration) FleetRow {
	r := FleetRow{Node: v.Node, Seq: v.Seq, Want: v.Want, SettledPlan: v.SettledPlan, EmittedPlan: v.EmittedPlan,
		Unsettled: v.Unsettled, Modules: v.Modules, Held: v.Held, Owed: len(v.Owed),
		AccountWarning: v.AccountWarning, HaveTime: v.HaveTime, HaveAge: -1, Warnings: -1,
		Failed: failing(v.Runtime)}
	for _, h := range v.Holds {
		if h.Why == events.HoldApproval && h.Pending != "" {
			r.Pending = append(r.Pending, h)
		}
	}
	if v.LastKnock != nil {
		r.LastKnock = v.LastKnock.Cause
	}
	if v.HaveSeq != 0 {
		age := now.Sub(v.HaveTime)
		r.HaveAge = age.Seconds()
		r.StaleHave = age > stale
	} else {
		r.StaleHave = true
	}
	r.Attention = attention(r)
	return r
}

// FleetErrorRow is the row of a node whose snapshot cannot be read.
func FleetErrorRow(node string, err error) FleetRow {
	r := FleetRow{Node: node, HaveAge: -1, Warnings: -1, Error: err.Error()}
	r.Attention = attention(r)
	return r
}

// SetWarnings sets the count of journal warnings of r and updates what
// needs attention.
func (r *FleetRow) SetWarnings(n int) {
	r.Warnings = n
	r.Attention = attention(*r)
}

func attention(r FleetRow) []string {
	a := []string{}
	add := func(cond bool, what string) {
		if cond {
			a = append(a, what)
		}
	}
	add(r.Error != "", "error")
	add(len(r.Failed) > 0, "failed")
	add(r.Owed > 0, "owed")
	add(len(r.Pending) > 0, "approval")
	add(r.Unsettled > 0, "unsettled")
	add(r.AccountWarning, "account")
	add(r.StaleHave, "stale-have")
	add(r.Warnings > 0, "journal")
	return a
}

// rank orders what needs an operator: a lower rank comes first.
var rank = map[string]int{"error": 0, "failed": 1, "owed": 2, "approval": 3, "unsettled": 4, "account": 5, "stale-have": 6, "journal": 7}

// SortFleet sorts rows so that what needs an operator comes first: rows
// are compared by their most pressing need (an unreadable snapshot, a
// failed module, owed items, pending approvals, unsettled plans, the account warning, a stale
// have, journal warnings), then by how many needs they have, then by the
// counts (more owed items, more pending approvals, more unsettled plans,
// an older have first), then by node name.
func SortFleet(rows []FleetRow) {
	first := func(r FleetRow) int {
		if len(r.Attention) == 0 {
			return len(rank)
		}
		return rank[r.Attention[0]]
	}
	slices.SortFunc(rows, func(a, b FleetRow) int {
		return cmp.Or(
			cmp.Compare(first(a), first(b)),
			-cmp.Compare(len(a.Attention), len(b.Attention)),
			-cmp.Compare(restarts(a.Failed), restarts(b.Failed)),
			-cmp.Compare(a.Owed, b.Owed),
			-cmp.Compare(len(a.Pending), len(b.Pending)),
			-cmp.Compare(a.Unsettled, b.Unsettled),
			-cmp.Compare(a.HaveAge, b.HaveAge),
			cmp.Compare(a.Node, b.Node),
		)
	})
}

// FleetHeader is the header line of [FleetRow.Line].
func FleetHeader(nodeWidth int) string {
	return fmt.Sprintf("%-*s %7s %7s %4s %4s %4s %6s %7s %s", nodeWidth, "NODE", "WANT", "SETTLED", "UNST", "HELD", "OWED", "KNOCK", "HAVE", "NEEDS")
}

// Line returns the row in at most [LineWidth] columns, aligned under
// [FleetHeader]: node, want, settled plan, unsettled plans, held rows, owed
// items, last knock's cause, the have's age, and what needs attention
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
			needs = append(needs, fmt.Sprintf("%d warnings", r.Warnings))
		case "failed":
			for _, f := range r.Failed {
				needs = append(needs, failedNeed(f))
			}
		default:
			needs = append(needs, a)
		}
	}
	knock := "-"
	if r.LastKnock != 0 {
		knock = fmt.Sprintf("#%d", r.LastKnock)
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

// restarts sums the restarts of rs.
func restarts(rs []reconcile.ModuleRuntime) int {
	n := 0
	for _, r := range rs {
		n += r.Restarts
	}
	return n
}
