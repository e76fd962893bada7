package rollout

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
)

// View is the delivery view of a fleet's rollout (DESIGN.md §11): where
// the rollout is, each target's progress and, per build, how many of the
// fleet's nodes run it. Its JSON field names are stable (`meshfold
// rollout status -o json`).
type View struct {
	Fleet   string    `json:"fleet"`
	Rollout uint64    `json:"rollout"`
	Phase   Phase     `json:"phase"`
	By      string    `json:"by"`
	Started time.Time `json:"started"`
	Paused  *Mark     `json:"paused,omitempty"`
	Halt    *Mark     `json:"halt,omitempty"`
	Revert  *Mark     `json:"revert,omitempty"`
	End     *Mark     `json:"end,omitempty"`
	// Batch is the current batch, 1-based, of Batches.
	Batch    int        `json:"batch"`
	Batches  int        `json:"batches"`
	Params   ViewParams `json:"params"`
	Promoted bool       `json:"promoted,omitempty"`
	// Promote is the canary's promote: who and when.
	Promote *Mark `json:"promote,omitempty"`
	// Waiting says, one line each, what holds the rollout that only a
	// node's return can end: a canary target whose agent is down or
	// whose node is paused ("canary ivy: agent down since T: the canary
	// batch waits for it; the rollout halts at its healthy_deadline T2
	// unless …"). Empty otherwise.
	Waiting []string `json:"waiting,omitempty"`
	// Stalled says, in one line, why a running rollout steps no target
	// and nothing of its own moves: its budget is spent by nodes no step
	// of it changes (an agent down, a node paused, a module unhealthy, a
	// target waiting for an approval), so only one of them coming back
	// (or an operator) moves it ("2 targets wait for the budget: 1 of
	// max_unavailable 1 unavailable: dan (agent down); …"). Empty
	// otherwise.
	Stalled string `json:"stalled,omitempty"`
	// PromoteNote, while the rollout waits for a promote, says which
	// canary targets run nothing now (their new want has no module) and
	// how many more targets a promote gives such a want. Empty otherwise.
	PromoteNote string `json:"promote_note,omitempty"`
	// Unavailable counts the fleet's nodes unavailable now, against
	// Params.MaxUnavailable.
	Unavailable int `json:"unavailable"`
	// AwaitTurn counts the targets among Unavailable a forward step's
	// budget does not count: pending, and unavailable only because a
	// module is unhealthy or failed (not away), they take their new want
	// in their batch's turn whatever the budget (DESIGN.md §11), and a
	// revert, which never changes them, does not count them either. The
	// budget spent is Unavailable - AwaitTurn. Zero unless the rollout
	// is running, waits for a promote or reverts.
	AwaitTurn int `json:"await_turn,omitempty"`
	// ChangedUnhealthy counts the targets among the budget's count
	// (Unavailable - AwaitTurn) given their new want and not finished
	// with it (publishing, changing, waiting for an approval) while
	// unavailable only because a module is unhealthy or failed (not
	// away): a step to a target unhealthy already is taken whatever the
	// budget (DESIGN.md §11), so these are what carries the count past
	// max_unavailable in a fixing rollout's later batches ([View.Budget]
	// says so). Zero unless the rollout is running or waits for a
	// promote.
	ChangedUnhealthy int `json:"changed_unhealthy,omitempty"`
	Nodes            int `json:"nodes"`
	// Counts are the targets per status.
	Counts  map[Status]int `json:"counts"`
	Targets []TargetView   `json:"targets"`
	Builds  []BuildCount   `json:"builds"`
	// Controller is the controller's newest fact of the rollout (nil:
	// none since the start). Unattended, which the reader sets from
	// [State.Unattended] with its clock, says no controller acts on a
	// rollout that owes a step.
	Controller *ControllerFact `json:"controller,omitempty"`
	Unattended *Unattended     `json:"unattended,omitempty"`
}

// TargetView is one target's line of the delivery view: want published,
// plan, settled, running at build, healthy since, failed and why.
type TargetView struct {
	Node   string `json:"node"`
	Batch  int    `json:"batch"` // 1-based
	Status Status `json:"status"`
	Why    string `json:"why,omitempty"`
	// Step is when the rollout gave it its new want; Published that
	// want's sequence.
	Step *Mark  `json:"step,omitempty"`
	Prev uint64 `json:"prev,omitempty"`
	// Base, when set, is the want a revert gives back instead of Prev
	// (Prev was an unfinished superseded rollout's want).
	Base      uint64 `json:"base,omitempty"`
	Published uint64 `json:"published,omitempty"`
	// Plan is the newest plan of its want, Settled whether it settled.
	Plan         uint64          `json:"plan,omitempty"`
	Settled      bool            `json:"settled,omitempty"`
	SettledAt    time.Time       `json:"settled_at,omitzero"`
	Running      []ModuleRunning `json:"running,omitempty"`
	HealthySince time.Time       `json:"healthy_since,omitzero"`
	Down         bool            `json:"down,omitempty"`
	// Paused is the operator's pause of the node in force.
	Paused *Mark `json:"paused,omitempty"`
	Revert *Back `json:"revert,omitempty"`
	// Arrived is set on an unreached target that has since taken its
	// new want, after the rollout stopped watching it: the plan of that
	// want settled (SettledAt) and every module runs at its build.
	Arrived bool `json:"arrived,omitempty"`
	// RunsNothing: its new want has no module, so once done it runs
	// nothing (every module it ran removed); a done one's Why says so.
	RunsNothing bool `json:"runs_nothing,omitempty"`
}

// ModuleRunning is a module of a target's newest have.
type ModuleRunning struct {
	Module   string          `json:"module"`
	Build    string          `json:"build"`
	State    events.RunState `json:"state"`
	Health   Health          `json:"health,omitempty"`
	Restarts int             `json:"restarts,omitempty"`
}

// BuildCount is how many of the fleet's nodes run Module at Build, by
// their newest haves: the newest folded since the rollout's start, else
// the one before it ([State.SetEarlierHave]).
type BuildCount struct {
	Module string `json:"module"`
	Build  string `json:"build"`
	// Nodes counts the nodes running it.
	Nodes int `json:"nodes"`
	// NotRunning counts, by state, the nodes whose newest have holds
	// the module at this build not running (failed: a crash loop;
	// stopped); nil when none.
	NotRunning map[events.RunState]int `json:"not_running,omitempty"`
}

// Text says where the build is, as `rollout status` and the console list
// it: "web@B on 5 nodes", and of the nodes where it does not run
// "web@B on 0 nodes, not running on 3: 3 failed".
func (b BuildCount) Text() string {
	s := fmt.Sprintf("%s@%s on %s", b.Module, events.Text(b.Build), plural(b.Nodes, "node"))
	if len(b.NotRunning) == 0 {
		return s
	}
	total := 0
	var parts []string
	for _, st := range slices.Sorted(maps.Keys(b.NotRunning)) {
		total += b.NotRunning[st]
		parts = append(parts, fmt.Sprintf("%d %s", b.NotRunning[st], st))
	}
	return s + fmt.Sprintf(", not running on %d: %s", total, strings.Join(parts, ", "))
}

// PhaseText is the phase as the text views say it: the phase, and
// ", paused" while an operator's pause of a rollout not final holds it
// ("running, paused", "waiting-promote, paused"). A pause is no phase of
// its own: targets already given their want are still judged, only the
// next steps wait for the resume (a fresh user's finding L3: the phase
// said "running" under a pause).
func (v View) PhaseText() string {
	if v.Paused != nil && !v.Phase.Final() {
		return string(v.Phase) + ", paused"
	}
	return string(v.Phase)
}

// View returns the delivery view; the zero View before the first start.
func (s *State) View() View {
	r := s.Rollout
	if r == nil {
		return View{Fleet: s.Fleet}
	}
	v := View{Fleet: s.Fleet, Rollout: r.ID, Phase: r.Phase, By: r.By, Started: r.Time, Paused: r.Paused, Halt: r.Halt,
		Revert: r.Revert, End: r.End, Batch: min(r.Batch, r.Batches()-1) + 1, Batches: r.Batches(), Params: ViewParams(r.R),
		Promoted: r.Promoted != nil, Promote: r.Promoted, Unavailable: r.Unavailable, Nodes: r.owned(), Counts: map[Status]int{}, Stalled: r.stalled(),
		PromoteNote: r.promoteNote(), Controller: r.Controller}
	for _, name := range r.Targets {
		n := r.Nodes[name]
		t := TargetView{Node: name, Batch: n.Batch + 1, Status: n.Status, Why: n.Why, Step: n.Step, Prev: n.Prev, Base: n.Base,
			Published: n.Published, Down: n.Down, Paused: n.Paused, Revert: n.Back, HealthySince: n.GoodSince}
		if n.Status == Done && !n.HealthyFrom.IsZero() {
			// The window that made it done, though a later down or
			// restart ended GoodSince (a fresh user's finding: HEALTHY
			// SINCE went blank after a revert).
			t.HealthySince = n.HealthyFrom
		}
		if w := r.canaryWait(n); w != "" {
			t.Why = w
			v.Waiting = append(v.Waiting, w)
		} else if t.Why == "" && n.away() {
			// A target away (paused, or its agent down: a fresh user's
			// finding, the down one's WHY was empty) says so, canary or
			// not.
			t.Why = n.awayWhy()
		} else if n.Status == Pending && !r.stopped() {
			// What holds it, as `rollout why` says (a fresh user's
			// finding L9: a paused rollout's pending targets had an
			// empty WHY).
			t.Why = r.holding(n)
		} else if w := notHealthyYet(n); w != "" && t.Why == "" && n.Status == Changing {
			// What it waits for, and until when, as `rollout why` says
			// (fresh12 m5: a canary changing with its module unhealthy
			// had an empty WHY).
			t.Why = w
			if !r.fenced() {
				t.Why += "; " + r.deadlineText(n)
			}
		}
		if n.Plan != nil && n.Published > 0 && n.Plan.Want == n.Published {
			t.Plan = n.Plan.Seq
			t.Settled = n.Settled >= n.Plan.Seq
			if t.Settled {
				t.SettledAt = n.SettledAt
			}
		} else if n.FwdPlan > 0 {
			// A revert's plan followed: the view still shows its new
			// want's plan and whether it settled, as the audit does.
			t.Plan, t.Settled, t.SettledAt = n.FwdPlan, !n.FwdSettledAt.IsZero(), n.FwdSettledAt
		}
		if st, why := r.shown(n); st != n.Status {
			t.Status, t.Why = st, why
		}
		if w := r.backWaits(n); w != "" {
			// Waiting for the budget: WHY and -o json's revert say for
			// whom (the fold keeps no why: the budget moves).
			t.Why = strings.TrimPrefix(t.Why+"; "+w, "; ")
			t.Revert = &Back{Status: n.Back.Status, Why: w}
		}
		if t.RunsNothing = r.runsNothing(n); t.RunsNothing && t.Status == Done && t.Why == "" {
			t.Why = runsNothingWhy(n)
		}
		if a := n.arrived(); a != "" && t.Status == Unreached {
			t.Arrived, t.Why = true, t.Why+"; "+a
		}
		if h := n.newestHave(); h != nil {
			for _, m := range h.Modules {
				t.Running = append(t.Running, ModuleRunning{Module: m.Name, Build: m.Build, State: m.State, Health: m.Health, Restarts: m.Restarts})
			}
		}
		v.Counts[t.Status]++
		v.Targets = append(v.Targets, t)
	}
	if r.stopped() && r.Phase != Reverting {
		// No target is being changed by a rollout that stopped judging:
		// the budget counts only the nodes away or unhealthy, and those
		// whose revert goes on (a fresh user's finding: an aborted
		// rollout said "1 of max_unavailable 1 unavailable" forever).
		// While reverting, the fold's own count is the budget the
		// revert spends, which the queued targets' WHY names.
		v.Unavailable = 0
		for _, n := range r.Nodes {
			if n.Moved == nil && (n.away() || len(n.Unhealthy) > 0 || n.givenBack() && !n.Back.finished()) {
				v.Unavailable++
			}
		}
	}
	if r.Phase == Running || r.Phase == WaitingPromote || r.Phase == Reverting {
		v.AwaitTurn = r.Unavailable - r.spent()
	}
	if r.Phase == Running || r.Phase == WaitingPromote {
		for _, name := range r.Targets {
			if n := r.Nodes[name]; n.Unavail && n.active() && n.spendsNothing() {
				v.ChangedUnhealthy++
			}
		}
	}
	builds := map[[2]string]*BuildCount{}
	for _, n := range r.Nodes {
		h := n.newestHave()
		if h == nil || n.Moved != nil {
			continue // a node another fleet took over runs its builds
		}
		for _, m := range h.Modules {
			b := builds[[2]string{m.Name, m.Build}]
			if b == nil {
				b = &BuildCount{Module: m.Name, Build: m.Build}
				builds[[2]string{m.Name, m.Build}] = b
			}
			if m.State == events.Running {
				b.Nodes++
				continue
			}
			// Failed (a crash loop of a bad build) or stopped: listed
			// too (a fresh user's finding fresh12 M2: a build failing
			// on 3 nodes in a halted rollout was counted nowhere).
			if b.NotRunning == nil {
				b.NotRunning = map[events.RunState]int{}
			}
			b.NotRunning[m.State]++
		}
	}
	for _, b := range builds {
		v.Builds = append(v.Builds, *b)
	}
	slices.SortFunc(v.Builds, func(a, b BuildCount) int {
		return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(b.Nodes, a.Nodes), cmp.Compare(a.Build, b.Build))
	})
	return v
}

// stopped reports whether the rollout no longer judges its targets' new
// wants: aborted, superseded, reverting or reverted.
func (r *Rollout) stopped() bool {
	switch r.Phase {
	case Aborted, Superseded, Reverting, Reverted:
		return true
	}
	return false
}

// Budget says the budget as `rollout status` and the console's rollout
// page print it: what it counts against max_unavailable, what it leaves
// out, and, when the count is past max_unavailable, by how much, what
// carried it there and what still waits for it. Within the budget:
// "2 of max_unavailable 3 unavailable (20 nodes)"; with targets
// unhealthy already left out (AwaitTurn) "(20 nodes; not counted: 4
// targets unhealthy already, 6 unavailable in all, that take their want
// in their batch's turn whatever the budget)". Past it, in a fixing
// rollout's batch of such targets (ChangedUnhealthy): "3 of
// max_unavailable 2 unavailable (10 nodes; over by 1: 3 of them are
// targets given their new want while unhealthy, as a step to a target
// unhealthy already is whatever the budget; a step to an available
// target waits until fewer than 2 are unavailable)". A count past it
// with no such target says what waits; a rollout that steps nothing
// more says nothing waits (a fresh user's finding m1: "3 of
// max_unavailable 2 unavailable (10 nodes)" in a fix's last batch read
// as a budget broken).
func (v View) Budget() string {
	spent, most := v.Unavailable-v.AwaitTurn, v.Params.MaxUnavailable
	s := fmt.Sprintf("%d of max_unavailable %d unavailable (%s", spent, most, plural(v.Nodes, "node"))
	if v.AwaitTurn > 0 {
		left := "that take their want in their batch's turn whatever the budget"
		if v.Phase == Reverting {
			left = "that the rollout never changed"
		}
		s += fmt.Sprintf("; not counted: %s unhealthy already, %d unavailable in all, %s", plural(v.AwaitTurn, "target"), v.Unavailable, left)
	}
	if over := spent - most; over > 0 {
		s += fmt.Sprintf("; over by %d", over)
		if c := v.ChangedUnhealthy; c > 0 {
			them := fmt.Sprintf("%d of them are targets given their", c)
			if c == 1 {
				them = "1 of them is a target given its"
			}
			s += fmt.Sprintf(": %s new want while unhealthy, as a step to a target unhealthy already is whatever the budget", them)
		}
		switch {
		case v.Phase == Reverting:
			s += fmt.Sprintf("; the revert of an available target waits until fewer than %d are unavailable", most)
		case (v.Phase == Running || v.Phase == WaitingPromote) && v.Counts[Pending] > 0:
			s += fmt.Sprintf("; a step to an available target waits until fewer than %d are unavailable", most)
		default:
			s += "; no step of the rollout waits for it"
		}
	}
	return s + ")"
}

// owned counts the fleet's nodes that no other fleet's rollout took over
// ([Node.Moved]): the nodes the budget is of.
func (r *Rollout) owned() int {
	n := 0
	for _, node := range r.Nodes {
		if node.Moved == nil {
			n++
		}
	}
	return n
}

// shown returns the status and why the delivery view ([State.View],
// [State.Why]) gives target n: its own, except that a target still
// pending when the rollout stopped is [Skipped] (it never got its new
// want) and one given its new want and not finished then is [Stopped]
// (no longer judged: not "changing" forever).
func (r *Rollout) shown(n *Node) (Status, string) {
	if !r.stopped() {
		return n.Status, n.Why
	}
	switch {
	case n.Status == Pending:
		return Skipped, r.holding(n)
	case n.active():
		how := string(r.Phase)
		switch m := r.End; {
		case r.Phase == Superseded && m != nil:
			how = m.Reason
		case r.Phase == Aborted && m != nil:
			how = fmt.Sprintf("aborted by %s at #%d", events.Text(m.By), m.Seq)
		case r.Revert != nil:
			how = fmt.Sprintf("reverted by %s at #%d", events.Text(r.Revert.By), r.Revert.Seq)
		}
		want := "its new want"
		if n.Published > 0 {
			want = fmt.Sprintf("its new want #%d", n.Published)
		}
		s := fmt.Sprintf("the rollout was %s while it was %s: %s is no longer judged", how, n.Status, want)
		if n.Back == nil {
			s += "; it keeps it ('meshfold state " + n.Name + "' says how it runs)"
		}
		return Stopped, s
	}
	return n.Status, n.Why
}

// arrived says that an unreached target has taken its new want since
// ("it has arrived since: its plan #P settled at T and every module runs
// at its build"): back, the plan of the rollout's want settled, every
// module running healthy at its build, no revert under way. "" otherwise.
// A rollout still watching makes such a target changing again
// ([folder.back]); this says it of one that stopped watching (completed).
func (n *Node) arrived() string {
	if n.Status != Unreached || n.away() || n.Back != nil || n.Plan == nil || n.Published == 0 ||
		n.Plan.Want != n.Published || n.Settled < n.Plan.Seq || mismatch(n) != "" {
		return ""
	}
	return fmt.Sprintf("it has arrived since: its plan #%d settled at %s and every module runs at its build", n.Plan.Seq, n.SettledAt.Format(time.RFC3339))
}

// newestHave returns the newest have the view knows of the node: the
// newest folded, else the newest before the start; nil when neither.
func (n *Node) newestHave() *HaveSeen {
	if n.Have != nil {
		return n.Have
	}
	return n.Earlier
}

// SetEarlierHave gives node its newest have from before the rollout's
// start, stored at seq at stream time t, as the caller read it from the
// stream: the delivery view then counts the builds of a node no have of
// which was folded since the start (a node the rollout did not change,
// or has not changed yet), so that per build it shows every node that
// runs it. It is for the view only: the fold never reads it, so a
// replay decides the same with or without it. It does nothing when the
// rollout does not own the node or seq is not before the start.
func (s *State) SetEarlierHave(node string, seq uint64, t time.Time, h *Have) {
	r := s.Rollout
	if r == nil || h == nil || seq >= r.ID {
		return
	}
	n := r.Nodes[node]
	if n == nil {
		return
	}
	n.Earlier = &HaveSeen{Seq: seq, Time: t, Modules: slices.Clone(h.Modules)}
}

// Why explains, one line each, where a node stands in the rollout and
// why: for a target waiting, what holds it (its batch, the canary's
// promote, a pause, the budget and who spends it, a halt); for one in
// progress, what it waits for; for one finished, how. ok is false when
// the rollout does not own the node.
func (s *State) Why(node string) (lines []string, ok bool) {
	r := s.Rollout
	if r == nil {
		return nil, false
	}
	n := r.Nodes[node]
	if n == nil {
		return nil, false
	}
	say := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	say("rollout %d (%s, by %s, started at %s)", r.ID, r.Phase, events.Text(r.By), r.Time.Format(time.RFC3339))
	if n.Want == 0 {
		say("%s is not a target: its want does not change%s", node, availText(n))
		return lines, true
	}
	st, stoppedWhy := r.shown(n)
	if st != Stopped {
		st = n.Status
	}
	say("%s is target %d of %d, batch %d of %d: %s", node, n.Order+1, len(r.Targets), n.Batch+1, r.Batches(), st)
	if n.Step != nil {
		against := fmt.Sprintf("diffed against want #%d", n.Prev)
		switch {
		case n.Prev == 0 && n.HadSeq != 0:
			// Its want aged out of the stream; apply read it from the
			// reconciler's state (a fresh user's finding F0).
			against = fmt.Sprintf("diffed against want #%d, which the stream no longer holds (--max-age): apply read it from the reconciler's state; a revert gives it back", n.HadSeq)
		case n.Prev == 0:
			against = "the node had no want before" // not "want #0" (a fresh user's finding U5)
		}
		// The step's sequence is the event the rollout decided it at,
		// not the want's, which the next line names: one line named
		// both as "its new want" (a fresh user's finding M4: "given its
		// new want at #6584 … want #6608 published").
		say("its step decided at #%d (%s, %s) gives it a new want, %s", n.Step.Seq, n.Step.Time.Format(time.RFC3339), n.Step.Reason, against)
	}
	if n.Adopted != 0 {
		again := ""
		if n.Again {
			again = ": its forward step was refused for it, and its new want published again expecting it"
		}
		say("want #%d, rollout %d's step stored after apply read the node, is no hand change: this rollout superseded rollout %d, and its step expects #%d%s", n.Adopted, r.Over, r.Over, n.Adopted, again)
	}
	if n.Base != 0 {
		say("a revert gives back want #%d, its want before the rollout this one superseded, which had not finished it (#%d)", n.Base, n.Prev)
	}
	switch {
	case n.HadSeq != 0 && n.Prev != 0 && n.HadSeq != n.Prev:
		say("a revert gives back want #%d, its want before the rollout this one superseded, which had not finished it (#%d): the rollout carries it, whether or not the stream still holds it", n.HadSeq, n.Prev)
	case n.HadSeq != 0 && n.Prev != 0 && n.Step != nil:
		// Carried by the start (NewStart): a revert does not depend
		// on the stream still holding it (--max-age).
		say("a revert gives back want #%d, which the rollout carries: the stream's --max-age may drop it meanwhile", n.HadSeq)
	}
	if n.Published > 0 {
		say("its new want is want #%d, published", n.Published)
	}
	if n.Plan != nil && n.Published > 0 && n.Plan.Want == n.Published {
		if n.Settled >= n.Plan.Seq {
			say("plan #%d of that want settled at %s", n.Plan.Seq, n.SettledAt.Format(time.RFC3339))
		} else {
			say("plan #%d of that want not settled yet", n.Plan.Seq)
		}
	} else if n.FwdPlan > 0 {
		// A revert's plan followed it.
		if !n.FwdSettledAt.IsZero() {
			say("plan #%d of that want settled at %s", n.FwdPlan, n.FwdSettledAt.Format(time.RFC3339))
		} else {
			say("plan #%d of that want did not settle before the revert's", n.FwdPlan)
		}
	}
	switch {
	case st == Stopped:
		say("%s", stoppedWhy)
	case n.Status == Pending:
		say("waiting: %s", r.holding(n))
	case n.Status == Publishing:
		say("waiting for the controller to record its want published")
	case n.Status == Changing:
		switch {
		case r.canaryWait(n) != "":
			say("%s", r.canaryWait(n))
		case n.Paused != nil:
			say("%s: it takes its want when resumed", n.awayWhy())
		case n.Down:
			say("its agent is down since %s: it takes its want when it returns", n.DownSince.Format(time.RFC3339))
		case !n.GoodSince.IsZero():
			say("healthy since %s (%s of min_healthy %s)", n.GoodSince.Format(time.RFC3339), shown(s.Now.Sub(n.GoodSince)), r.R.MinHealthy)
		case notHealthyYet(n) != "":
			say("%s", notHealthyYet(n))
		}
		if r.fenced() {
			// Nothing is judged while paused on an unverified plan: its
			// healthy_deadline counts again from the resume.
			say("not judged while the rollout is paused on a plan its controller cannot verify: its healthy_deadline %s counts from the resume", r.R.HealthyDeadline)
		} else {
			say("%s", r.deadlineText(n))
		}
	case n.Status == WaitingApproval, n.Status == Failed, n.Status == Conflict, n.Status == Unreached, n.Status == Skipped, n.Status == Moved:
		say("%s", n.Why)
		if a := n.arrived(); a != "" && n.Status == Unreached {
			say("%s", a)
		}
	case n.Status == Done:
		say("done at #%d (%s)", n.Finished.Seq, n.Finished.Time.Format(time.RFC3339))
		if r.runsNothing(n) {
			say("%s", runsNothingWhy(n))
		}
	}
	if b := n.Back; b != nil {
		line := fmt.Sprintf("revert: %s", b.Status)
		if b.Want > 0 {
			line += fmt.Sprintf(", previous want published again as #%d", b.Want)
		}
		if b.Why != "" {
			line += ": " + b.Why
		}
		if w := r.backWaits(n); w != "" {
			line += ": " + w
		}
		say("%s", line)
	}
	if s := availText(n); s != "" && !(st == Changing && n.away()) {
		say("%s", strings.TrimPrefix(s, "; "))
	}
	return lines, true
}

func availText(n *Node) string {
	var parts []string
	if s := awayShort(n); s != "" {
		parts = append(parts, s)
	}
	if len(n.Unhealthy) > 0 {
		parts = append(parts, "unhealthy or failed: "+strings.Join(n.Unhealthy, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, "; ")
}

// notHealthyYet says what a changing target whose plan of its new want
// settled, and which is not counting min_healthy, waits for: "not healthy
// yet: module web is unhealthy"; "" otherwise (a target that runs its plan
// healthy, not judged yet). `rollout why` and the
// delivery view's WHY both read it.
func notHealthyYet(n *Node) string {
	if !n.GoodSince.IsZero() || n.Plan == nil || n.Plan.Want != n.Published || n.Settled < n.Plan.Seq {
		return ""
	}
	if m := mismatch(n); m != "" {
		return "not healthy yet: " + m
	}
	return "" // it runs its plan healthy: a tick or a have judges it
}

// deadlineText is when a changing target's healthy_deadline ends:
// "healthy_deadline at 2026-12-05T17:19:22Z".
func (r *Rollout) deadlineText(n *Node) string {
	return "healthy_deadline at " + n.DeadlineFrom.Add(r.R.HealthyDeadline).Format(time.RFC3339)
}

// holding says what keeps a pending target from its new want: the
// start loading, a halt, the rollout's end; else the rollout's pause
// first (nothing moves until the resume, whatever else waits), then the
// canary's promote, its batch, or the budget and who spends it. `rollout
// why` and the delivery view's WHY of a pending target both read it.
func (r *Rollout) holding(n *Node) string {
	switch {
	case r.Phase == Loading:
		return fmt.Sprintf("the start's nodes are loading (%d of %d pages)", r.Loaded, r.Pages)
	case r.Phase == Halted:
		return fmt.Sprintf("the rollout halted (target %s: %s)", r.Halt.Node, r.Halt.Reason)
	case r.Phase.Final() || r.Phase == Reverting:
		return fmt.Sprintf("the rollout is %s: it never got its new want", r.Phase)
	}
	var then string
	switch {
	case r.Phase == WaitingPromote:
		then = "the canary batch is done and waits for a promote"
	case n.Batch == r.Batch+1:
		then = fmt.Sprintf("its batch %d begins after batch %d is done", n.Batch+1, r.Batch+1)
	case n.Batch > r.Batch:
		// Name the batch just before it, and the one running now: "after
		// batch 1" read as if batch 3 could start right after batch 1 (a
		// fresh user's finding V10).
		then = fmt.Sprintf("its batch %d begins after batch %d is done (batch %d runs now)", n.Batch+1, n.Batch, r.Batch+1)
	case r.Paused == nil:
		return r.budget()
	}
	p := r.Paused
	if p == nil {
		return then
	}
	s := fmt.Sprintf("the rollout is paused by %s since %s", events.Text(p.By), p.Time.Format(time.RFC3339))
	if p.Reason != "" {
		s += ": " + events.ErrorText(p.Reason)
	}
	if r.fenced() {
		s += ": no target is stepped, judged or reverted until it is resumed (put that key back as the reconciler's retired one, " +
			"or resume once you know the plan is the reconciler's: its held plans are taken as its own)"
	} else {
		s += ": no target gets its new want until it is resumed"
	}
	if then != "" {
		s += "; then " + then
	}
	return s
}

// budget says who spends the budget of a forward step: "the budget: N
// of max_unavailable M unavailable: dan (agent down), …" (five named at
// most), counting and naming what [Rollout.spent] counts; the targets
// awaiting their batch's turn, unhealthy already, follow it: "; not
// counted: 2 targets unhealthy already that take their want in their
// batch's turn whatever the budget: dan, eve".
func (r *Rollout) budget() string {
	return r.budgetText("that take their want in their batch's turn whatever the budget")
}

// budgetBack says who spends the budget of a revert, as budget does; the
// targets it does not count are ones the revert does not change.
func (r *Rollout) budgetBack() string {
	return r.budgetText("that the rollout never changed")
}

func (r *Rollout) budgetText(left string) string {
	s := fmt.Sprintf("the budget: %d of max_unavailable %d unavailable: %s", r.spent(), r.R.MaxUnavailable,
		r.unavailNames(func(o *Node) bool { return !o.awaitsTurn() }, true))
	if c := r.Unavailable - r.spent(); c > 0 {
		s += fmt.Sprintf("; not counted: %s unhealthy already %s: %s", plural(c, "target"), left, r.unavailNames((*Node).awaitsTurn, false))
	}
	return s
}

// unavailNames names the unavailable nodes that match, sorted, five at
// most, each with why when asked: "dan (agent down), eve (changing), …".
func (r *Rollout) unavailNames(match func(*Node) bool, why bool) string {
	var who []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k, o := range r.Nodes {
			if o.Unavail && match(o) && !yield(k) {
				return
			}
		}
	}) {
		if len(who) == 5 {
			who = append(who, "…")
			break
		}
		if why {
			name += " (" + unavailWhy(r.Nodes[name]) + ")"
		}
		who = append(who, name)
	}
	return strings.Join(who, ", ")
}

func unavailWhy(n *Node) string {
	switch {
	case n.Down:
		return "agent down"
	case n.Paused != nil:
		return "paused by " + events.Text(n.Paused.By)
	case len(n.Unhealthy) > 0:
		return "unhealthy: " + strings.Join(n.Unhealthy, ",")
	case n.givenBack() && !n.Back.finished():
		return "reverting"
	case n.givenBack() && n.Back.Status == RevertFailed:
		return "its revert failed"
	}
	return string(n.Status)
}

// backWaits says why a target queued for its revert waits: "its previous
// want waits for the budget: N of max_unavailable M unavailable: …";
// "" for any other target.
func (r *Rollout) backWaits(n *Node) string {
	if n.Back == nil || n.Back.Status != RevertQueued {
		return ""
	}
	if r.fenced() {
		return fmt.Sprintf("its previous want waits until the rollout is resumed (paused by %s since %s: %s)",
			events.Text(r.Paused.By), r.Paused.Time.Format(time.RFC3339), events.ErrorText(r.Unverified.Reason))
	}
	return "its previous want waits for " + r.budgetBack()
}

// stalled says why a running rollout is stalled by its budget (see
// [View].Stalled): the next target of its batch waits for the budget,
// and no node spending it is one of the rollout's own steps under way
// (being changed, with a deadline, or being reverted); "" otherwise.
func (r *Rollout) stalled() string {
	if r.Phase == Reverting {
		return r.revertStalled()
	}
	if r.Phase != Running || r.Paused != nil || r.Batch >= r.Batches() {
		return ""
	}
	end := r.batchEnd(r.Batch)
	if r.Next >= end {
		return ""
	}
	if n := r.Nodes[r.Targets[r.Next]]; n.Status != Pending || r.allows(n) {
		return ""
	}
	for _, o := range r.Nodes {
		if !o.Unavail {
			continue
		}
		if o.Back != nil && !o.Back.finished() || o.active() && !o.away() && o.Status != WaitingApproval {
			return "" // a step under way frees the budget by itself
		}
	}
	waiting := 0
	for _, name := range r.Targets[r.Next:end] {
		if r.Nodes[name].Status == Pending {
			waiting++
		}
	}
	verb := "waits"
	if waiting > 1 {
		verb = "wait"
	}
	return fmt.Sprintf("%s of batch %d %s for %s; no step of the rollout is under way: it moves on when one of them is available again (or %sabort, or apply again with a larger max_unavailable)",
		plural(waiting, "target"), r.Batch+1, verb, r.budget(), r.approveRemedy())
}

// approveRemedy names, for a stalled line, the approvals the unavailable
// targets waiting for one wait for, each as the command that gives it
// ("approve db at sha256:38f1c2d4e5f6 for n101, n102, …: 'meshfold
// approve NODE... db sha256:38f1c2d4e5f6 --by NAME', --ahead for the
// targets whose want does not name db yet; or "); "" when none waits. A
// target waiting for an approval spends the budget until an operator
// gives it, which the line's other remedies did not say (a fresh user's
// finding M3 of fresh10: 20 such targets stalled 100 more).
func (r *Rollout) approveRemedy() string {
	type wait struct {
		module, build string
		nodes         []string
	}
	var waits []*wait
	for _, name := range slices.Sorted(maps.Keys(r.Nodes)) {
		o := r.Nodes[name]
		if !o.Unavail || o.Status != WaitingApproval || o.Plan == nil {
			continue
		}
		row := heldForApproval(o.Plan)
		if row == nil {
			continue
		}
		i := slices.IndexFunc(waits, func(w *wait) bool { return w.module == row.Name && w.build == row.Pending })
		if i < 0 {
			waits = append(waits, &wait{module: row.Name, build: row.Pending})
			i = len(waits) - 1
		}
		waits[i].nodes = append(waits[i].nodes, name)
	}
	var b strings.Builder
	for _, w := range waits {
		nodes := w.nodes
		if len(nodes) > 5 {
			nodes = append(nodes[:5:5], "…")
		}
		build := approveBuild(w.build)
		fmt.Fprintf(&b, "approve %s at %s for %s: 'meshfold approve NODE... %s %s --by NAME', --ahead for the targets whose want does not name %s yet; or ",
			events.Text(w.module), build, strings.Join(nodes, ", "), events.Text(w.module), build, events.Text(w.module))
	}
	return b.String()
}

// approveBuild is build as 'meshfold approve' takes it in a line: a
// sha256 build as its short form (sha256: and 12 hex digits, which
// approve resolves to the one stored build it begins), another whole.
func approveBuild(build string) string {
	if h, ok := strings.CutPrefix(build, "sha256:"); ok && len(h) > 12 {
		return "sha256:" + h[:12]
	}
	return events.Text(build)
}

// revertStalled says why a revert is stalled by its budget: targets wait
// for it (queued) and no node spending it is a revert under way on a
// node that is not away (its plan settling, its modules starting), so
// only a node's return or health, or an operator, moves it; "" otherwise.
func (r *Rollout) revertStalled() string {
	if r.fenced() {
		return "" // paused: its resume moves it, not the budget
	}
	waiting := 0
	for _, name := range r.Reverting {
		o := r.Nodes[name]
		switch {
		case o.Back.Status == RevertQueued:
			waiting++
		case !o.away():
			return "" // a revert under way frees the budget by itself
		}
	}
	if waiting == 0 {
		return ""
	}
	verb := "waits"
	if waiting > 1 {
		verb = "wait"
	}
	return fmt.Sprintf("%s of the revert %s for %s; no revert step is under way: it moves on when one of them is available again (or abort: the targets not given back keep the want they have)",
		plural(waiting, "target"), verb, r.budgetBack())
}
