package rollout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
)

// CrashLoopRestarts is how many restarts of a module at its new build
// (the node counts them since the apply, DESIGN.md §8) make it
// crash-looping: its target fails at once, without waiting for its
// healthy_deadline. One failure only breaks its healthy window.
const CrashLoopRestarts = 3

// Fold folds one input into s, in place, and returns the effects to carry
// out, in order (nil when none).
//
// in.Seq must be the input's place in the fleet's one order; an input at
// or below s.Seq was folded already: Fold returns nil and changes nothing.
// A rollout event that could not be decoded (in.Err) is recorded as
// rejected. Node events of nodes the rollout does not own are ignored.
// Every node event judges its node at the event's stream time; a tick
// judges every target in progress (done after min_healthy, failed or
// unreached past its deadline), so the fold's cost per event does not
// grow with the targets in progress. Then it steps as many targets as the
// batch and the budget allow.
func (s *State) Fold(in Input) []Effect {
	if in.Seq <= s.Seq {
		return nil
	}
	s.Seq = in.Seq
	if in.Time.After(s.Now) {
		s.Now = in.Time
	}
	f := &folder{s: s, r: s.Rollout, in: in}
	if in.Err != nil {
		what := "not understood"
		if !errors.Is(in.Err, events.ErrNewerVersion) {
			what = "not folded"
		}
		f.record(0, "", "rejected", events.LevelError, "%s %d %s: %s", in.Kind, in.Seq, what, events.ErrorText(in.Err.Error()))
		return f.out
	}
	switch p := in.Payload.(type) {
	case *Start:
		f.start(p)
	case *Nodes:
		f.page(p)
	case *Published:
		f.published(p)
	case *Refused:
		f.refused(p)
	case *Operator:
		f.operator(p)
	case *Tick:
		// Time passes (below).
	case *Record:
		f.recorded(p)
	case *events.Plan:
		if in.Unverified != "" {
			f.unverified(p)
		} else {
			f.plan(p)
		}
	case *events.Settle:
		f.settle(p)
	case *Have:
		f.have(p)
	case nil:
		switch in.Kind {
		case KindWant:
			f.want()
		case KindDown, KindUp:
			f.liveness(in.Kind == KindUp)
		case KindNodeResume:
			f.nodePause(nil)
		case KindProvDown, KindProvUp:
			f.prov(in.Kind == KindProvDown)
		}
	case *events.Filled:
		f.filled(p)
	case *events.Pause:
		f.nodePause(p)
	case *events.Retire:
		f.nodeRetire(p)
	}
	if _, ok := in.Payload.(*Tick); ok {
		f.judgeAll()
	}
	f.controllerFact()
	f.advance()
	f.advanceBack()
	return f.out
}

// folder carries one Fold call.
type folder struct {
	s   *State
	r   *Rollout
	in  Input
	out []Effect
	n   int // records emitted so far
}

func (f *folder) mark(by, node, reason string) *Mark {
	return &Mark{Seq: f.in.Seq, Time: f.s.Now, By: by, Node: node, Reason: reason, Checked: f.in.Checked && by != ""}
}

// record emits a record of rollout id (0: the current one).
func (f *folder) record(id uint64, node, what string, level events.Level, format string, args ...any) {
	if id == 0 && f.r != nil {
		id = f.r.ID
	}
	rec := Stamp(&Record{Rollout: id, Cause: f.in.Seq, Node: node, What: what, Level: level, Msg: fmt.Sprintf(format, args...)}, f.s.Now)
	f.out = append(f.out, Effect{Fleet: f.s.Fleet, Cause: f.in.Seq, N: f.n, Record: rec})
	f.n++
}

func (f *folder) ignored(format string, args ...any) {
	f.record(0, "", "ignored", events.LevelInfo, "%s %d ignored: %s", f.in.Kind, f.in.Seq, fmt.Sprintf(format, args...))
}

func (f *folder) publish(w *WantEffect) {
	f.out = append(f.out, Effect{Fleet: f.s.Fleet, Cause: f.in.Seq, Want: w})
}

// start begins a rollout; one still active is superseded.
func (f *folder) start(p *Start) {
	if old := f.r; old != nil && old.active() {
		old.Phase = Superseded
		old.End = f.mark(p.By, "", fmt.Sprintf("superseded by rollout %d", f.in.Seq))
		f.record(old.ID, "", string(Superseded), events.LevelWarn, "rollout %d superseded by rollout %d (by %s)", old.ID, f.in.Seq, events.Text(p.By))
	}
	r := &Rollout{ID: f.in.Seq, Time: f.s.Now, By: p.By, Reason: p.Reason, Params: p.Params,
		Wants: cloneWants(p.Wants), NewFiles: p.NewFiles, Pages: p.Pages, Phase: Loading, Nodes: make(map[string]*Node, len(p.Nodes))}
	if p.Supersedes < f.in.Seq {
		// The fleet's newest rollout as apply read it, superseded
		// knowingly (its fence: no start came between). A fold may
		// begin at this start (the controller's, `rollout status`'s)
		// and never see that rollout: the start says it.
		r.Over = p.Supersedes
	}
	f.s.Rollout, f.r = r, r
	f.addNodes(p.Nodes)
	r.Loaded = 1
	if r.Loaded == r.Pages {
		f.load()
	}
}

// page adds one page of the start's nodes.
func (f *folder) page(p *Nodes) {
	r := f.r
	switch {
	case r == nil || p.Rollout != r.ID:
		f.ignored("a page of rollout %d, not the current one", p.Rollout)
	case r.Phase != Loading || p.Page != r.Loaded:
		f.record(0, "", "rejected", events.LevelError, "nodes %d not folded: page %d, expected page %d of %d", f.in.Seq, p.Page, r.Loaded, r.Pages)
	default:
		f.addNodes(p.Nodes)
		r.Loaded++
		if r.Loaded == r.Pages {
			f.load()
		}
	}
}

func (f *folder) addNodes(list []NodeAtStart) {
	r := f.r
	for _, a := range list {
		if r.Nodes[a.Node] != nil || a.Want > len(r.Wants) || a.NewFiles > len(r.NewFiles) || len(r.Nodes) >= MaxNodes {
			f.record(0, a.Node, "rejected", events.LevelError, "node %s of event %d not folded: listed twice, naming no want, or over %d nodes", a.Node, f.in.Seq, MaxNodes)
			continue
		}
		n := &Node{Name: a.Node, Down: a.Down, Unhealthy: slices.Sorted(slices.Values(a.Unhealthy)), NewestWant: a.Prev}
		if len(n.Unhealthy) == 0 {
			n.Unhealthy = nil
		}
		if a.Down {
			// Down since its agent's down event, as apply read it (a
			// fresh user's finding: "agent down since" said the
			// rollout's start); an older apply's start says no time.
			n.DownSince = f.s.Now
			if !a.DownSince.IsZero() && a.DownSince.Before(f.s.Now) {
				n.DownSince = a.DownSince
			}
		}
		if a.PausedBy != "" {
			n.Paused = f.mark(a.PausedBy, "", a.PausedReason)
		}
		if a.Want > 0 {
			n.Want, n.Prev, n.Base, n.Status, n.Order = a.Want, a.Prev, a.Back, Pending, len(r.Targets)
			if a.Had > 0 && a.Had <= len(r.Wants) && a.Back == 0 {
				n.Had, n.HadSeq = a.Had, a.HadSeq
			}
			n.Before = beforeAtStart(a.Restarts, r.Wants[a.Want-1])
			if a.NewFiles > 0 {
				for _, ref := range r.NewFiles[a.NewFiles-1] {
					n.Fresh = append(n.Fresh, Fresh{FileRef: ref})
				}
			}
			r.Targets = append(r.Targets, a.Node)
		}
		r.Nodes[a.Node] = n
		f.update(n)
	}
}

// load resolves the rollout block once every node is known, and starts.
func (f *folder) load() {
	r := f.r
	r.R = r.Params.Resolve(len(r.Targets), len(r.Nodes))
	for _, name := range r.Targets {
		n := r.Nodes[name]
		n.Batch = r.batchOf(n.Order)
	}
	r.Phase = Running
	f.record(0, "", string(Running), events.LevelInfo, "rollout %d by %s: %s of %s in %s (canary %d, batch %d), max_unavailable %d, min_healthy %s, healthy_deadline %s, auto_revert %v",
		r.ID, events.Text(r.By), plural(len(r.Targets), "target"), plural(len(r.Nodes), "node"), plural(r.Batches(), "batch"), r.R.Canary, r.R.Batch, r.R.MaxUnavailable, r.R.MinHealthy, r.R.HealthyDeadline, r.R.AutoRevert)
	// Conflicts found while loading halt it at once.
	for _, name := range r.Targets {
		if n := r.Nodes[name]; n.Status == Conflict {
			f.halt(n)
			return
		}
	}
}

// update refreshes n's cached availability and batch clearance and the
// rollout's counts of both.
func (f *folder) update(n *Node) {
	r := f.r
	if u := n.unavailable(); u != n.Unavail {
		n.Unavail = u
		if u {
			r.Unavailable++
		} else {
			r.Unavailable--
		}
	}
	if n.Want > 0 && r.Phase != Loading {
		if c := r.clear(n); c != n.Clear {
			n.Clear = c
			if n.Batch == r.Batch {
				if c {
					r.Clear++
				} else {
					r.Clear--
				}
			}
		}
	}
}

// node returns the fleet's node of a node event, nil when the rollout
// does not own it.
func (f *folder) node() *Node {
	if f.r == nil {
		return nil
	}
	return f.r.Nodes[f.in.Node]
}

// want notes a want on the node's subject: one the rollout did not
// publish is a conflict.
func (f *folder) want() {
	n := f.node()
	if n == nil || f.in.Seq <= n.NewestWant {
		return
	}
	n.NewestWant, n.NewestID = f.in.Seq, ""
	if fleet, id, node, step, ok := ParseWantID(f.in.ID); ok && node == n.Name {
		if fleet != f.s.Fleet {
			f.moved(n, fleet, id, step)
			return
		}
		n.NewestID = f.in.ID
	}
	if n.Moved != nil {
		return // another fleet's node: none of this rollout's business
	}
	f.checkConflict(n)
}

// moved takes a node whose newest want another fleet's rollout published
// (its message id names that fleet's rollout step: `meshfold apply
// --take-over` moved it) out of this rollout: the node is that fleet's
// now. A target not finished yet gets no new want, nor its previous
// want back from a revert, as one retired; one finished (done, failed,
// unreached) is no conflict: its want was changed by the other fleet's
// rollout, not by hand. Target or not, the node no longer counts in the
// rollout's budget or among its nodes ([Node.unavailable], [View.Nodes]).
// The other fleet's later wants keep it moved by the same take-over; a
// third fleet's moves it on (a fresh user's finding U22: the old fleet's
// status said the node's want was "changed by hand" at the new fleet's
// rollout want, and counted it in its budget).
func (f *folder) moved(n *Node, fleet string, id uint64, step Step) {
	if n.Moved != nil && n.Moved.Fleet == fleet {
		return // that fleet's later want: the take-over stays what moved it
	}
	first := n.Moved == nil
	n.Moved = &Move{Fleet: fleet, Rollout: id, Step: step, Want: f.in.Seq}
	if n.Back != nil && !n.Back.finished() {
		// Its revert waits or runs: the other fleet's want stands.
		n.Back.Status, n.Back.Why = RevertRefused, n.Moved.Text()+": not overwritten"
		f.backFinished(n, events.LevelWarn)
	}
	if n.Want > 0 && n.Status == Moved {
		n.Why = n.Moved.Text() + movedWhy // on to a third fleet
	}
	if n.Want > 0 && n.Status != Moved {
		was := n.Status
		n.Status, n.GoodSince, n.Why = Moved, time.Time{}, n.Moved.Text()+movedWhy
		f.r.Active = remove(f.r.Active, n.Name)
		if n.Finished == nil {
			n.Finished = f.mark("", "", "")
		}
		f.update(n)
		f.record(0, n.Name, string(Moved), events.LevelWarn, "target %s (%s): %s", n.Name, was, n.Why)
		return
	}
	f.update(n)
	if first && n.Want == 0 {
		f.record(0, n.Name, string(Moved), events.LevelInfo, "node %s: %s", n.Name, n.Moved.Text())
	}
}

// changedBy names who published the target's newest want, which is none
// the fold decided for it: "by hand", or, when its message id names a
// rollout's step of the node ([Node.NewestID]), that step. A want of the
// rollouts' own is never called a hand's (a fresh user's finding U11: a
// controller's refold that decided otherwise published a revert, and the
// view blamed a human).
func (r *Rollout) changedBy(n *Node) string {
	_, id, _, step, ok := ParseWantID(n.NewestID)
	switch {
	case !ok:
		return "by hand"
	case id == r.ID:
		return fmt.Sprintf("by rollout %d's own %s (want id %s), which this fold did not decide,", id, step, n.NewestID)
	case id == r.Over:
		return fmt.Sprintf("by rollout %d's %s step (want id %s), the rollout this one superseded,", id, step, n.NewestID)
	}
	return fmt.Sprintf("by rollout %d's %s step (want id %s)", id, step, n.NewestID)
}

// recorded folds a record read back from the fleet's rollout subject.
// The records are the controller's own decisions, carried out: one of the
// current rollout naming a final phase (completed, aborted, reverted) is
// its end. A fold that has not reached that end (a refold that read the
// stream otherwise than the fold that decided it: a fresh user's finding
// U11, the reconciler's plans under a signing key that is no longer its
// own, docs/architecture.md "A recorded end is final") ends the rollout
// there, as recorded, and drops what it decided that the record
// overrules: no revert it decided is published, no target is judged
// again. An ended rollout decides nothing more of its own (only an
// operator's verb moves it, as after any end), so a controller that
// restarts, with any key, publishes nothing for it.
//
// A record of the current rollout's pause on a plan its controller could
// not verify (What "paused", naming the node; folder.unverified) pauses
// a fold that did not pause there itself the same way: a read that
// verifies no plan (`rollout status`, which folds every plan as the
// reconciler's) says what the controller decided, and a controller
// restarted with the key put back stays paused until an operator
// resumes, as the record says.
//
// So is a record of the current rollout's decision read back by a fold
// paused on a plan it cannot verify, which did not decide it itself (a
// controller restarted with a new key refolds what its predecessor
// judged on plans it verified then): a target's outcome (done, failed,
// unreached; its revert's), the halt, the revert. The rollout is as
// recorded, and such a revert gives nothing back until resumed
// (folder.revert; the publications recorded since are what it gave
// back, folder.published). Without it the resume saw the revert's wants
// as changed by hand and halted again, and gave the targets it had not
// seen done their previous want back at once, past the budget (a done
// target is available: it waits for the budget; one being changed is
// not).
func (f *folder) recorded(p *Record) {
	r := f.r
	if r != nil && p.Rollout == r.ID && r.fenced() && p.Node != "" && f.adoptOutcome(p) {
		return
	}
	if r != nil && p.Rollout == r.ID && r.fenced() && r.Phase != Reverting {
		switch {
		case p.What == string(Halted) && r.Phase != Halted:
			// "rollout N halted: WHAT: WHY[; auto_revert reverts
			// nothing…]" (haltWith): the halt's reason is WHY.
			_, why, _ := strings.Cut(p.Msg, string(Halted)+": ")
			if _, w, ok := strings.Cut(why, ": "); ok {
				why = w
			}
			why, _, _ = strings.Cut(why, "; auto_revert reverts nothing")
			r.Phase, r.Halt = Halted, f.mark("", p.Node, why)
			return
		case p.What == string(Reverting):
			by := "the rollout controller"
			if _, after, ok := strings.Cut(p.Msg, "(by "); ok {
				by, _, _ = strings.Cut(after, "): ")
			}
			keep := len(f.out)
			f.revert(f.mark(by, "", "as recorded at #"+fmt.Sprint(f.in.Seq)))
			f.out = f.out[:keep] // the record read is the revert's record
			return
		}
	}
	if r != nil && p.Rollout == r.ID && p.What == "paused" && p.Node != "" {
		if r.Unverified == nil && (r.Phase == Running || r.Phase == WaitingPromote || r.Phase == Halted || r.Phase == Reverting) {
			why, _ := strings.CutPrefix(p.Msg, fmt.Sprintf("rollout %d paused: ", r.ID))
			why, _, _ = strings.Cut(why, pauseGuide)
			f.pauseUnverified(p.Node, why)
		}
		if r.Unverified != nil && r.Unverified.Node == p.Node {
			r.UnverifiedRecord = f.in.Seq
		}
		return
	}
	end := Phase(p.What)
	if r == nil || p.Rollout != r.ID || p.Node != "" || !end.Final() || end == Superseded || r.Phase.Final() {
		return
	}
	was := r.Phase
	r.Phase, r.End = end, f.mark("", "", fmt.Sprintf("%s as recorded at #%d (this fold had it %s)", end, f.in.Seq, was))
	for _, name := range r.Reverting {
		if n := r.Nodes[name]; n.Back != nil && (n.Back.Status == RevertPublishing || n.Back.Status == RevertWaiting) {
			n.Back = nil // decided by this fold alone, never published
			f.update(n)
		}
	}
	r.Reverting = nil
}

// adoptOutcome takes a recorded outcome of a target that the fold,
// paused on a plan it cannot verify, did not decide itself (see
// folder.recorded): a target being changed is done, failed or
// unreached as recorded; a target's revert under way ends as recorded.
// It returns false when the record is no such outcome, or the fold has
// the target there already. It emits nothing: the record read is the
// decision's record.
func (f *folder) adoptOutcome(p *Record) bool {
	r := f.r
	n := r.Nodes[p.Node]
	if n == nil || n.Want == 0 {
		return false
	}
	_, why, _ := strings.Cut(p.Msg, ": ")
	keep := len(f.out)
	defer func() { f.out = f.out[:keep] }()
	switch st := Status(p.What); {
	case (st == Done || st == Failed || st == Unreached) && n.active() && n.Back == nil:
		n.Status, n.Why, n.GoodSince = st, why, time.Time{}
		if st == Done {
			n.Why, n.HealthyFrom = "", f.s.Now
			if _, t, ok := strings.Cut(why, " from "); ok {
				if at, err := time.Parse(time.RFC3339, strings.TrimSpace(strings.SplitN(t, " ", 2)[0])); err == nil {
					n.HealthyFrom = at
				}
			}
		}
		f.finish(n)
		return true
	case strings.HasPrefix(p.What, "revert-") && n.Back != nil && n.Back.Step != nil && !n.Back.finished():
		switch st := Status(strings.TrimPrefix(p.What, "revert-")); st {
		case RevertDone, RevertFailed, RevertUnreached, RevertRefused:
			n.Back.Status, n.Back.Why = st, why
			if st == RevertDone {
				n.Back.Why = ""
			}
			r.Reverting = remove(r.Reverting, n.Name)
			f.update(n)
			f.revertDone()
			return true
		}
	}
	return false
}

// PausedByController is the By of the pause the fold makes itself on a
// plan its controller cannot verify ([Rollout].Unverified).
const PausedByController = "the rollout controller"

// unverified folds a plan of the node that the controller could not
// verify against its keys (Input.Unverified says why, naming the
// signer's key). A plan it cannot verify never moves a rollout, and a
// rollout that goes on without it decides on what it cannot see: the
// reconciler's plans signed with a key it no longer holds (serve
// restarted with a new key and the old one not kept as retired) leave
// every target changed before the restart unsettled to it, its own
// later steps look changed by hand, and a halt's auto_revert gives
// healthy targets their previous want back (a fresh user's finding,
// docs/architecture.md "A rollout in progress when the key changes").
// So a target's plan for a want at or after the rollout's (newer than
// the one it diffed against), unverified, while the rollout runs, waits
// for a promote or is halted, or, reverting, a plan of a target whose
// revert is not finished (a revert judges its previous want's plan: one
// it cannot see it would call failed at the revert's deadline), pauses
// it: the plan is held aside ([Node].Unverified), never taken as the
// node's plan, and until an operator's resume the rollout steps no
// target, judges none (a revert's neither), calls no want a conflict,
// gives no target its previous want back, and keeps a failed settle for
// the resume (Rollout.fenced, folder.holdFailure). The pause's record
// names the node, the plan, the key and what to do. A forged plan
// pauses the rollout the same way, which is the safe side: it stops,
// the reconciler restores the node, and an operator decides.
func (f *folder) unverified(p *events.Plan) {
	n, r := f.node(), f.r
	if n == nil || n.Want == 0 || n.Moved != nil || n.Status == Skipped || p.Want <= n.Prev || (n.Plan != nil && f.in.Seq <= n.Plan.Seq) {
		return
	}
	if !r.fenced() {
		switch r.Phase {
		case Running, WaitingPromote, Halted:
		case Reverting:
			if n.Back == nil || n.Back.finished() {
				return // its revert is decided: nothing rests on its plan
			}
		default:
			return // nothing it would decide on: folded as before, left out
		}
	}
	rows := make([]Row, len(p.Modules))
	for i, m := range p.Modules {
		rows[i] = Row{Name: m.Name, Build: m.Build, Held: m.Held, Why: m.Why, Pending: m.Pending}
	}
	n.Unverified = &PlanSeen{Seq: f.in.Seq, Want: p.Want, Rows: rows, Prov: p.ProvisionerAccount}
	n.HeldFailure = nil // a failure of an older plan
	if r.Unverified != nil {
		return // paused already: held for the resume
	}
	why := fmt.Sprintf("%s's plan #%d (for want #%d) does not verify against the controller's keys (%s)", n.Name, f.in.Seq, p.Want, events.ErrorText(f.in.Unverified))
	f.pauseUnverified(n.Name, why)
	f.record(0, n.Name, "paused", events.LevelError, "%s", pauseRecordText(r, f.s.Fleet))
}

// pauseGuide begins what a pause on an unverified plan's record says
// after its reason.
const pauseGuide = ". No target is stepped, judged or reverted until the rollout is resumed. "

// pauseRecordText is the record of the rollout's pause on a plan its
// controller could not verify: the reason and what to do.
func pauseRecordText(r *Rollout, fleet string) string {
	return fmt.Sprintf("rollout %d paused: %s"+pauseGuide+
		"If that key is the reconciler's old one (serve restarted with a new key, the old one not kept), put it back as retired "+
		"(its public key in reconciler-retired.pub beside the seed, then restart serve; 'meshfold auth rotate-reconciler' changes a key and keeps the old one) and resume; "+
		"or, once you know the plan is the reconciler's, 'meshfold rollout resume %s' takes the held plans as its own",
		r.ID, r.Unverified.Reason, fleet)
}

// UnrecordedPause returns the record of the rollout's pause on a plan
// its controller could not verify ([Rollout].Unverified) when the
// controller must append it itself: the pause was decided at or below
// recorded (the cause of the newest record on the fleet's subject when
// its refold began, whose records at or below it the controller skips)
// and no record of it was folded back. A refold under a new key decides
// that pause where the fold that appended the records had decided
// nothing; without its record, `rollout status` and a controller
// restarted with the old key put back would not know of it. The record
// is caused by the last input folded (State.Seq), so its message id is
// none of the earlier records'. false when there is none to append.
func (s *State) UnrecordedPause(recorded uint64) (Effect, bool) {
	r := s.Rollout
	if !r.fenced() || r.UnverifiedRecord != 0 || r.Unverified.Seq > recorded {
		return Effect{}, false
	}
	rec := Stamp(&Record{Rollout: r.ID, Cause: s.Seq, Node: r.Unverified.Node, What: "paused", Level: events.LevelError, Msg: pauseRecordText(r, s.Fleet)}, s.Now)
	return Effect{Fleet: s.Fleet, Cause: s.Seq, Record: rec}, true
}

// pauseUnverified pauses the rollout on node's plan (see
// folder.unverified); why is the pause's reason.
func (f *folder) pauseUnverified(node, why string) {
	r := f.r
	r.Unverified = f.mark(PausedByController, node, why)
	if r.Paused == nil {
		r.Paused = r.Unverified
	}
}

// resumeUnverified is an operator's resume of a rollout paused on a plan
// its controller could not verify: the operator vouches for the held
// plans, so each target's held plan newer than its plan is taken as its
// plan, each target in progress starts its healthy_deadline again (the
// pause counted none of it), the conflicts not called while paused are
// called now (a target's want that is its own step's, published by a
// fold this one did not follow, is no conflict: its step finds it
// stored), and every target in progress is judged.
func (f *folder) resumeUnverified(by string) {
	r := f.r
	held := r.Unverified
	r.Unverified, r.UnverifiedRecord = nil, 0
	var took []string
	for _, name := range r.Targets {
		n := r.Nodes[name]
		u := n.Unverified
		if u == nil {
			continue
		}
		n.Unverified = nil
		if n.Plan != nil && u.Seq <= n.Plan.Seq {
			continue
		}
		n.Plan = u
		if n.Published > 0 && u.Want == n.Published {
			n.FwdPlan, n.FwdSettledAt = u.Seq, time.Time{}
			if n.Settled >= u.Seq {
				n.FwdSettledAt = n.SettledAt
			}
		}
		took = append(took, fmt.Sprintf("%s #%d", name, u.Seq))
		f.update(n)
	}
	taken := "none newer than a plan it verified since"
	if len(took) > 0 {
		taken = strings.Join(took, ", ")
	}
	f.record(0, "", "resumed", events.LevelWarn, "resumed by %s: the plans held since #%d, which the controller could not verify, are taken as the reconciler's: %s", by, held.Seq, taken)
	for _, name := range r.Targets {
		n := r.Nodes[name]
		if fs := n.HeldFailure; fs != nil {
			n.HeldFailure = nil
			if n.Plan != nil && fs.Plan == n.Plan.Seq {
				f.settleFailed(n, fs)
			}
		}
	}
	for _, name := range r.Targets {
		n := r.Nodes[name]
		if n.Status == Pending && n.NewestID == WantID(f.s.Fleet, r.ID, name, n.forwardStep()) {
			continue
		}
		f.checkConflict(n)
	}
	for _, name := range r.Active {
		r.Nodes[name].DeadlineFrom = f.s.Now
	}
	if r.Phase == Reverting {
		// The revert goes on as revert would have decided it: the
		// reverts published start their deadline again, and a target
		// unavailable already is given its previous want back at once
		// (its forward want's outcome recorded); the others wait for
		// the budget (advanceBack).
		for _, name := range slices.Clone(r.Reverting) {
			n := r.Nodes[name]
			switch b := n.Back; {
			case b.Status == RevertChanging:
				b.From = f.s.Now
			case b.Status == RevertWaiting && n.Published > 0, b.Status == RevertQueued && n.Unavail:
				f.giveBack(n)
			}
		}
	}
	f.judgeAll()
}

// fenced reports whether the rollout is paused on a plan its
// controller could not verify, in a phase it would decide in.
func (r *Rollout) fenced() bool {
	return r != nil && r.Unverified != nil && (r.Phase == Running || r.Phase == WaitingPromote || r.Phase == Halted || r.Phase == Reverting)
}

// overSuperseded takes want seq (message id id), newer than the one a
// target not yet published was diffed against, as the want its step
// expects, and reports true, when it is a step of the rollout this one
// superseded ([Rollout].Over) on the target: that rollout's controller
// stored it after apply read the node and before it folded this
// rollout's start (a fresh user's finding G2: the superseding rollout
// halted at its first step, "changed by hand", on the superseded
// rollout's canary step, and auto-reverted). No hand changed it: the
// operator who applied meant to supersede that rollout, and the new
// want is the fleet file's whatever that step gave. A revert still
// gives back [Node.RevertTo], the want before the unfinished rollouts,
// as [State.RevertBases] decides for a step apply did read. The one
// place that decides it; a want of any other writer, or a second one
// after a forward step was refused for the first, is a conflict.
func (f *folder) overSuperseded(n *Node, seq uint64, id string) bool {
	r := f.r
	fleet, rollout, node, step, ok := ParseWantID(id)
	if !ok || r.Over == 0 || rollout != r.Over || fleet != f.s.Fleet || node != n.Name || n.Again || seq <= n.Expect() {
		return false
	}
	n.Adopted = seq
	n.NewestWant, n.NewestID = max(n.NewestWant, seq), id
	back := fmt.Sprintf("a revert gives back #%d", n.RevertTo())
	if n.HadNone() {
		back = "a revert gives back no want, as the node had none"
	} else if n.RevertTo() == 0 {
		back = fmt.Sprintf("a revert gives back #%d, which the rollout carries", n.HadSeq)
	}
	again := "its step expects it"
	if n.Status == Publishing {
		again = "its new want is published again expecting it (step over)"
	}
	f.record(0, n.Name, "adopted", events.LevelInfo, "target %s: its want #%d is rollout %d's %s step (want id %s), the rollout this one superseded, stored after apply read #%d: no hand change; %s, and %s",
		n.Name, seq, rollout, step, id, n.Prev, again, back)
	return true
}

// checkConflict marks a target whose newest want is none of the
// rollout's: changed by hand (DESIGN.md §11).
func (f *folder) checkConflict(n *Node) {
	if n.Want == 0 || n.Moved != nil || f.r.fenced() {
		return
	}
	switch {
	case n.Status == Conflict || n.Status == Skipped:
	case n.Status == Pending:
		if n.NewestWant > n.Expect() && !f.overSuperseded(n, n.NewestWant, n.NewestID) {
			f.conflict(n, fmt.Sprintf("its want was changed %s at #%d after the rollout diffed against #%d", f.r.changedBy(n), n.NewestWant, n.Prev))
		}
	case n.Published == 0:
		// Decided when the publication is recorded.
	case n.Back != nil:
		b := n.Back
		switch {
		case b.Status == RevertQueued && n.NewestWant > n.Published:
			// Changed by hand while its revert waited for the budget:
			// never overwritten, as revert decides at once.
			b.Status, b.Why = RevertRefused, fmt.Sprintf("its want was changed %s at #%d after the rollout's #%d: not overwritten", f.r.changedBy(n), n.NewestWant, n.Published)
			f.backFinished(n, events.LevelError)
		case b.Want > 0 && n.NewestWant > b.Want && !b.finished():
			b.Status, b.Why = RevertRefused, fmt.Sprintf("its want was changed %s at #%d after the revert's #%d", f.r.changedBy(n), n.NewestWant, b.Want)
			f.backFinished(n, events.LevelError)
		}
	case n.Status == Failed:
		// No want of the rollout's but its previous one, which revert
		// refuses for a changed want. A failed target's revert is
		// checked above, before this: one queued while the rollout was
		// paused on a plan it could not verify is given back at the
		// resume, which must not overwrite a want changed meanwhile.
	case n.NewestWant > n.Published:
		f.conflict(n, fmt.Sprintf("its want was changed %s at #%d after the rollout's #%d", f.r.changedBy(n), n.NewestWant, n.Published))
	}
}

func (f *folder) conflict(n *Node, why string) {
	n.Status, n.Why = Conflict, why
	f.finish(n)
	f.record(0, n.Name, string(Conflict), events.LevelError, "target %s: %s: skipped, never overwritten", n.Name, why)
	f.halt(n)
}

// finish takes a target out of the active ones.
func (f *folder) finish(n *Node) {
	n.Finished = f.mark("", "", "")
	f.r.Active = remove(f.r.Active, n.Name)
	f.update(n)
}

// fail fails a target and halts the rollout.
func (f *folder) fail(n *Node, why string) {
	n.Status, n.Why, n.GoodSince = Failed, why, time.Time{}
	f.finish(n)
	f.record(0, n.Name, string(Failed), events.LevelError, "target %s failed: %s", n.Name, why)
	f.halt(n)
}

// failUntrusted fails a target whose agent refused its plan for the
// reconciler's key (a settle marked Untrusted: its trust file does not
// name the key, or it read it before the key was rotated) and halts the
// rollout WITHOUT auto_revert (docs/architecture.md, "A target that
// refuses the reconciler's key"): the failure is the node's trust, not
// the build; a revert's plan is signed by the same key, which that node
// refuses the same; and every target that took its plan runs the new
// want well. The halt says so; `rollout revert` still reverts on
// demand.
func (f *folder) failUntrusted(n *Node, why string) {
	n.Status, n.Why, n.GoodSince = Failed, why, time.Time{}
	f.finish(n)
	f.record(0, n.Name, string(Failed), events.LevelError, "target %s failed: %s", n.Name, why)
	keep := ""
	if f.r.R.AutoRevert {
		keep = "auto_revert reverts nothing: " + n.Name + "'s agent refuses the reconciler's key, a revert's plan as well, and the targets that took their plans run them; " +
			"restart " + n.Name + "'s agent once its trust file names the key (it takes its plan then), then apply again to go on, or 'meshfold rollout revert " + f.s.Fleet + "'"
	}
	f.haltWith(n.Name, "target "+n.Name+" "+string(n.Status), n.Why, keep)
}

// halt stops a running rollout after a failure; with auto_revert every
// changed target gets its previous want back.
func (f *folder) halt(n *Node) {
	f.haltOn(n.Name, "target "+n.Name+" "+string(n.Status), n.Why)
}

// haltOn halts a running rollout: what (the target and its status, or
// the batch) failed, and why; node names the node the halt is about.
func (f *folder) haltOn(node, what, why string) {
	f.haltWith(node, what, why, "")
}

// haltWith is haltOn; keep, when set, says why auto_revert reverts
// nothing (the halt's record says it, and the rollout stays halted).
func (f *folder) haltWith(node, what, why, keep string) {
	r := f.r
	if r.Phase != Running && r.Phase != WaitingPromote && r.Phase != Loading {
		return
	}
	if r.Phase == Loading {
		return // load halts it once every node is known
	}
	r.Phase = Halted
	r.Halt = f.mark("", node, why)
	if keep == "" && r.R.AutoRevert && r.fenced() {
		keep = fmt.Sprintf("auto_revert reverts nothing while the rollout is paused on a plan its controller cannot verify (%s's, at #%d): 'meshfold rollout revert %s' reverts on demand, giving the targets their previous want back once the rollout is resumed",
			r.Unverified.Node, r.Unverified.Seq, f.s.Fleet)
	}
	if keep != "" {
		f.record(0, node, string(Halted), events.LevelError, "rollout %d halted: %s: %s; %s", r.ID, what, why, keep)
		return
	}
	f.record(0, node, string(Halted), events.LevelError, "rollout %d halted: %s: %s", r.ID, what, why)
	if r.R.AutoRevert {
		f.revert(f.mark("auto_revert", node, what))
	}
}

func (f *folder) plan(p *events.Plan) {
	n := f.node()
	if n == nil || (n.Plan != nil && f.in.Seq <= n.Plan.Seq) {
		return
	}
	rows := make([]Row, len(p.Modules))
	for i, m := range p.Modules {
		rows[i] = Row{Name: m.Name, Build: m.Build, Held: m.Held, Why: m.Why, Pending: m.Pending}
	}
	n.Plan = &PlanSeen{Seq: f.in.Seq, Want: p.Want, Rows: rows, Prov: p.ProvisionerAccount}
	n.Unverified = nil  // a plan it verifies, newer: the held one is superseded
	n.HeldFailure = nil // a failure of an older plan
	if n.Published > 0 && p.Want == n.Published {
		n.FwdPlan, n.FwdSettledAt = f.in.Seq, time.Time{}
	}
	f.update(n) // a failed revert's node runs its previous want after all, or no longer
	f.judge(n)
}

func (f *folder) settle(p *events.Settle) {
	n := f.node()
	if n == nil {
		return
	}
	if p.Op == events.OpFailed {
		fs := &FailedSettle{Seq: f.in.Seq, Plan: p.Plan, Module: p.Module, Error: p.Error, Untrusted: p.Untrusted}
		if f.r.fenced() {
			f.holdFailure(n, fs)
			return
		}
		if n.Plan == nil || p.Plan != n.Plan.Seq {
			return // a failure of a superseded plan: the node tries the newer one
		}
		f.settleFailed(n, fs)
		return
	}
	if p.Plan > n.Settled {
		n.Settled, n.SettledAt = p.Plan, f.s.Now
	}
	if p.Plan == n.FwdPlan && n.FwdSettledAt.IsZero() {
		n.FwdSettledAt = f.s.Now
	}
	f.update(n)
	f.judge(n)
}

// failedWhy says a failed settle as a target's why. A failed settle
// with no module is the plan's as a whole (the agent refused it, or
// failed before any module), worded as the node's journal words it
// (reconcile): no `module ""`. One the agent refused for its signer
// keeps the node's words whole (the key, the trust file), not cut in
// the middle (a fresh user's finding F1).
func failedWhy(fs *FailedSettle) string {
	switch {
	case fs.Untrusted:
		return fmt.Sprintf("its agent refused plan %d for the reconciler's key: %s", fs.Plan, events.Plain(fs.Error))
	case fs.Module == "":
		return fmt.Sprintf("apply of plan %d failed for the plan as a whole: %s", fs.Plan, events.ErrorText(fs.Error))
	}
	return fmt.Sprintf("apply of plan %d failed for module %q: %s", fs.Plan, fs.Module, events.ErrorText(fs.Error))
}

// settleFailed judges a failed settle of the node's plan (n.Plan): its
// revert fails, or, while the rollout watches its new want, the target
// fails and halts the rollout (failUntrusted when its agent refused the
// plan's signer).
func (f *folder) settleFailed(n *Node, fs *FailedSettle) {
	why := failedWhy(fs)
	switch {
	case n.Back != nil && n.Back.Want > 0 && n.Plan.Want == n.Back.Want && !n.Back.finished():
		n.Back.Status, n.Back.Why = RevertFailed, why
		f.backFinished(n, events.LevelError)
	case n.Back == nil && n.Published > 0 && n.Plan.Want == n.Published && (n.Status == Changing || n.Status == WaitingApproval) && f.forwardWatched():
		if fs.Untrusted {
			f.failUntrusted(n, why)
			return
		}
		f.fail(n, why)
	}
}

// holdFailure keeps a target's failed settle folded while the rollout
// is paused on a plan its controller cannot verify (Rollout.fenced),
// which judges nothing: dropped, it was lost, and a node that refused
// its plan (its agent does not trust the reconciler's new key) failed
// only at its deadline after the resume, by a halt whose auto_revert
// gave every changed target its previous want back, where the refusal
// halts without one (failUntrusted). Only a failure of the node's
// newest plan, the one held aside or its plan, is kept (a failure of an
// older one never counts: the node tries the newer one), and a newer
// plan folded while paused drops it the same way. The operator's
// resume judges it (folder.resumeUnverified) as it judges one folded
// then.
func (f *folder) holdFailure(n *Node, fs *FailedSettle) {
	if n.Want == 0 || n.Moved != nil || fs.Plan == 0 || fs.Plan != n.newestPlan() || n.HeldFailure != nil && n.HeldFailure.Plan == fs.Plan {
		return
	}
	n.HeldFailure = fs
	f.record(0, n.Name, "failure-held", events.LevelWarn, "target %s: %s: kept, judged when the rollout is resumed (it is paused on a plan its controller cannot verify)", n.Name, failedWhy(fs))
}

func (f *folder) have(p *Have) {
	n := f.node()
	if n == nil {
		return
	}
	prev := n.Have
	n.Have = &HaveSeen{Seq: f.in.Seq, Time: f.s.Now, Modules: slices.Clone(p.Modules)}
	n.Before = beforeReset(n.Before, p.Modules)
	var bad []string
	for _, m := range p.Modules {
		if m.Health == Unhealthy || m.State == events.Failed {
			bad = append(bad, m.Name)
		}
		// A restart between two haves breaks the healthy window even when
		// the module runs again by the second.
		if prev != nil {
			for _, o := range prev.Modules {
				if o.Name == m.Name && o.Build == m.Build && m.Restarts > o.Restarts {
					n.breakGood(f.s.Now)
				}
			}
		}
	}
	slices.Sort(bad)
	n.Unhealthy = bad
	if n.Down {
		// A restarted agent is up again on its first have.
		f.up(n)
	}
	f.update(n)
	f.judge(n)
}

// filled notes a filled event of a file the target's new want added:
// its module no longer waits for it, and its crash loop counts from the
// restarts its newest have reports at its new build.
func (f *folder) filled(p *events.Filled) {
	n := f.node()
	if n == nil {
		return
	}
	i := slices.IndexFunc(n.Fresh, func(x Fresh) bool { return x.Module == p.Module && x.Path == p.Path && !x.Filled })
	if i < 0 {
		return
	}
	fresh := slices.Clone(n.Fresh) // not in place: a clone of the state may share it
	fresh[i].Filled = true
	if m := haveOf(n, p.Module); m != nil && n.Plan != nil {
		if j := slices.IndexFunc(n.Plan.Rows, func(r Row) bool { return r.Name == p.Module }); j >= 0 && n.Plan.Rows[j].Build == m.Build {
			fresh[i].Restarts = m.Restarts
		}
	}
	n.Fresh = fresh
	f.judge(n)
}

// prov notes the node's provisioner client going down or coming back.
func (f *folder) prov(down bool) {
	n := f.node()
	if n == nil {
		return
	}
	n.ProvSeen = true
	switch {
	case down && !n.ProvDown:
		n.ProvDown, n.ProvDownSince = true, f.s.Now
	case !down:
		n.ProvDown, n.ProvDownSince = false, time.Time{}
	}
}

func (f *folder) liveness(up bool) {
	n := f.node()
	if n == nil {
		return
	}
	if up {
		if n.Down {
			f.up(n)
		}
	} else if !n.Down {
		n.breakGood(f.s.Now)
		n.Down, n.DownSince = true, f.s.Now
		if n.Have != nil {
			h := *n.Have // not in place: a clone of the state may share it
			h.Stale = true
			n.Have = &h
		}
	}
	f.update(n)
	f.judge(n)
}

// up brings a node's agent back; see [folder.back].
func (f *folder) up(n *Node) {
	n.Down, n.DownSince = false, time.Time{}
	f.back(n, "its agent is back")
}

// nodePause notes an operator's pause (p) or resume (nil) of the node.
// A paused target is held as one whose agent is down: it spends no more
// of the budget, holds no batch back and ends unreached at its deadline.
func (f *folder) nodePause(p *events.Pause) {
	n := f.node()
	if n == nil {
		return
	}
	if p != nil {
		n.Paused = f.mark(p.By, "", p.Reason)
		if n.active() && f.forwardWatched() {
			f.record(0, n.Name, "node-paused", events.LevelWarn, "target %s: %s: held until resumed", n.Name, n.awayWhy())
		}
	} else if n.Paused != nil {
		n.Paused = nil
		f.back(n, "resumed")
	}
	f.update(n)
	f.judge(n)
}

// nodeRetire notes an operator's retire of the node. A retire is an
// explicit act a rollout must never undo silently (a want brings a
// retired node back, DESIGN.md §9), so a target the rollout still
// watches and has not finished (pending, being changed, waiting for an
// approval, or unreached) is skipped: it gets no new want, is never
// given its previous want back by a revert, and holds no batch back. A
// want of its publication already decided (publishing) may still land
// and bring the node back: that step was decided before the retire.
func (f *folder) nodeRetire(p *events.Retire) {
	n := f.node()
	if n != nil && n.Back != nil && n.Back.Status == RevertQueued {
		// Its revert waited for the budget: the revert gives it no
		// want either.
		n.Back.Status = RevertRefused
		n.Back.Why = fmt.Sprintf("retired by %s at #%d while its revert waited for the budget: the revert gives it no want (a want brings it back)", events.Text(p.By), f.in.Seq)
		f.backFinished(n, events.LevelWarn)
		return
	}
	if n == nil || n.Want == 0 || n.Back != nil {
		return
	}
	switch f.r.Phase {
	case Loading, Running, WaitingPromote, Halted:
	default:
		return
	}
	switch n.Status {
	case Pending, Publishing, Changing, WaitingApproval, Unreached:
	default:
		return
	}
	was := n.Status
	n.Status, n.GoodSince = Skipped, time.Time{}
	n.Why = fmt.Sprintf("retired by %s at #%d, skipped: the rollout gives it no want, new or previous (a want brings it back)", events.Text(p.By), f.in.Seq)
	f.finish(n)
	f.record(0, n.Name, "retired", events.LevelWarn, "target %s (%s): %s", n.Name, was, n.Why)
}

// back: once a node is neither down nor paused, an unreached target of a
// rollout still watching is being changed again, its deadline counted
// from now.
func (f *folder) back(n *Node, what string) {
	if n.Status == Unreached && !n.away() && f.forwardWatched() && n.Back == nil {
		n.Status, n.Why, n.Finished, n.DeadlineFrom = Changing, "", nil, f.s.Now
		f.r.Active = append(f.r.Active, n.Name)
		f.record(0, n.Name, string(Changing), events.LevelInfo, "target %s: %s: watched again", n.Name, what)
	}
}

// forwardWatched reports whether the rollout still judges its targets'
// new wants: running, waiting for a promote, or halted without revert.
func (f *folder) forwardWatched() bool {
	switch f.r.Phase {
	case Running, WaitingPromote, Halted:
		return true
	}
	return false
}

func (f *folder) published(p *Published) {
	r := f.r
	if r == nil || p.Rollout != r.ID {
		f.ignored("the outcome of a step of rollout %d, not the current one", p.Rollout)
		return
	}
	n := r.Nodes[p.Node]
	if n == nil || n.Want == 0 {
		f.ignored("node %s is no target", p.Node)
		return
	}
	if p.Want >= n.NewestWant {
		n.NewestWant, n.NewestID = p.Want, WantID(f.s.Fleet, p.Rollout, p.Node, p.Step)
	}
	if p.Step == StepRevert {
		if n.Back != nil && n.Back.Status == RevertQueued {
			// Given back by a fold this one did not follow (the
			// controller before a restart, whose plans this one cannot
			// verify: it decided from what it saw): the recorded
			// publication is what happened, never given back again.
			n.Back.Status, n.Back.Step = RevertPublishing, f.mark("", "", r.revertWhy())
		}
		if n.Back == nil || n.Back.Status != RevertPublishing {
			return // recorded already
		}
		n.Back.Want, n.Back.Status, n.Back.From = p.Want, RevertChanging, f.s.Now
		f.update(n)
		f.checkConflict(n)
		f.judgeBack(n)
		return
	}
	if n.Status == Pending && p.Want > n.Prev && r.fenced() && r.Phase != Reverting {
		f.adoptStep(n)
	}
	if n.Status != Publishing {
		return // recorded already
	}
	if p.Want <= n.Expect() {
		f.record(0, n.Name, "rejected", events.LevelError, "published %d not folded: want %d is not after the want the step expected (%d)", f.in.Seq, p.Want, n.Expect())
		return
	}
	n.Published, n.Status, n.DeadlineFrom = p.Want, Changing, f.s.Now
	if n.Plan != nil && n.Plan.Want == p.Want {
		// Its plan was folded before the publication was recorded (the
		// controller records it once acknowledged; the reconciler may
		// plan first): the forward plan the view keeps after a revert
		// (a fresh user's finding: PLAN and SETTLED went blank).
		n.FwdPlan, n.FwdSettledAt = n.Plan.Seq, time.Time{}
		if n.Settled >= n.Plan.Seq {
			n.FwdSettledAt = n.SettledAt
		}
	}
	f.update(n)
	if n.Back != nil && n.Back.Status == RevertWaiting {
		if !r.fenced() {
			f.giveBack(n) // fenced: given back once resumed
		}
		return
	}
	f.checkConflict(n)
	f.judge(n)
}

func (f *folder) refused(p *Refused) {
	r := f.r
	if r == nil || p.Rollout != r.ID {
		f.ignored("the outcome of a step of rollout %d, not the current one", p.Rollout)
		return
	}
	n := r.Nodes[p.Node]
	if n == nil || n.Want == 0 {
		f.ignored("node %s is no target", p.Node)
		return
	}
	why := fmt.Sprintf("its want could not be published: %s", events.ErrorText(p.Error))
	if p.Last > 0 {
		if p.Last > n.NewestWant {
			n.NewestWant, n.NewestID = p.Last, ""
			if _, _, node, _, ok := ParseWantID(p.LastID); ok && node == n.Name {
				n.NewestID = p.LastID // a rollout's step: changedBy names it
			}
		}
		by := "by hand"
		if p.Last == n.NewestWant {
			by = r.changedBy(n)
		}
		why = fmt.Sprintf("its want was changed %s: the newest is #%d", by, p.Last)
	}
	if p.Step == StepRevert {
		if n.Back != nil && n.Back.Status == RevertPublishing {
			n.Back.Status, n.Back.Why = RevertRefused, why
			f.backFinished(n, events.LevelError)
		}
		return
	}
	if n.Status != Publishing || p.Step != n.forwardStep() {
		return // recorded already, or the outcome of its forward step read again after its step over
	}
	if p.Last > 0 && p.Last == n.NewestWant && (r.Phase == Running || r.Phase == WaitingPromote) && !r.fenced() && f.overSuperseded(n, p.Last, n.NewestID) {
		// Refused for a want of the rollout this one superseded, stored
		// after apply read the node: its new want again, expecting it.
		// Only while the rollout steps forward: halted or reverting, no
		// target gets its new want, and this one, never changed by it,
		// keeps the superseded rollout's want as a conflict does (never
		// overwritten, the halt naming that rollout's step).
		n.Again, n.DeadlineFrom = true, f.s.Now
		f.publish(&WantEffect{Rollout: r.ID, Node: n.Name, Step: StepOver, Modules: r.Wants[n.Want-1], Expect: n.Expect(), Why: r.stepWhy(n)})
		return
	}
	if n.Back != nil { // its revert waited for this outcome: nothing to give back
		n.Back = nil
		r.Reverting = remove(r.Reverting, n.Name)
	}
	if p.Last > 0 {
		f.conflict(n, why+fmt.Sprintf(", the rollout diffed against #%d", n.Expect()))
	} else {
		f.fail(n, why)
	}
	f.revertDone()
}

func (f *folder) operator(p *Operator) {
	if r := f.r; p.Kind() == KindPromote && r.fenced() && r.Phase == Running && r.R.Canary > 0 && r.Promoted == nil && (p.Rollout == 0 || p.Rollout == r.ID) {
		// Paused on a plan it cannot verify, this fold may not see the
		// canary done that the operator saw: the promote is taken, and
		// the next batch begins once the canary is done after the resume.
		r.Promoted = f.mark(p.By, "", p.Reason)
		f.record(0, "", "promoted", events.LevelInfo, "canary promoted by %s; the rollout is paused on a plan it cannot verify: the next batch begins once it is resumed and the canary is done", events.Text(p.By))
		return
	}
	if why := f.s.Ignores(p.Kind(), p.Rollout); why != "" {
		f.ignored("%s", why)
		return
	}
	r := f.r
	by := events.Text(p.By)
	switch p.Kind() {
	case KindPromote:
		r.Promoted = f.mark(p.By, "", p.Reason)
		r.Phase = Running
		if r.Paused != nil {
			f.record(0, "", "promoted", events.LevelInfo, "canary promoted by %s; the rollout is paused (by %s): the next batch begins when it is resumed", by, events.Text(r.Paused.By))
		} else {
			f.record(0, "", "promoted", events.LevelInfo, "canary promoted by %s", by)
		}
	case KindPause:
		r.Paused = f.mark(p.By, "", p.Reason)
		f.record(0, "", "paused", events.LevelInfo, "paused by %s: no target gets its new want until resumed", by)
	case KindResume:
		r.Paused = nil
		if r.Unverified != nil {
			f.resumeUnverified(by)
			return
		}
		f.record(0, "", "resumed", events.LevelInfo, "resumed by %s", by)
	case KindAbort:
		queued := f.dropQueued()
		r.Phase, r.End = Aborted, f.mark(p.By, "", p.Reason)
		f.record(0, "", string(Aborted), events.LevelWarn, "rollout %d aborted by %s: no further want; targets keep the want they have%s", r.ID, by, queued)
	case KindRevert:
		f.revert(f.mark(p.By, "", p.Reason))
	}
}

// Ignores says why the operator verb k (promote, pause, resume, abort or
// revert) meant for rollout id (0: whichever is current) would be
// ignored if it were folded now, and "" when it would act. It is the
// fold's own rule, and its reason the one the fold records: `meshfold
// rollout VERB` asks it first, and says why instead of publishing a verb
// that would change nothing (a promote before the canary is done).
func (s *State) Ignores(k Kind, id uint64) string {
	r := s.Rollout
	if r == nil {
		return "no rollout"
	}
	if id != 0 && id != r.ID {
		return fmt.Sprintf("it names rollout %d, the current one is %d", id, r.ID)
	}
	switch k {
	case KindPromote:
		switch {
		case r.Phase == WaitingPromote:
			return ""
		case r.R.Canary > 0 && r.Promoted == nil && (r.Phase == Running || r.Phase == Loading):
			return r.canaryNotDone()
		}
		return fmt.Sprintf("no canary waits for a promote (rollout %s)", r.Phase)
	case KindPause:
		if r.Paused != nil || !(r.Phase == Loading || r.Phase == Running || r.Phase == WaitingPromote) {
			return fmt.Sprintf("rollout %s%s", r.Phase, pausedText(r))
		}
	case KindResume:
		if r.Paused == nil || r.Phase.Final() {
			return fmt.Sprintf("rollout %s%s", r.Phase, map[bool]string{true: ", paused", false: ", not paused"}[r.Paused != nil])
		}
	case KindAbort:
		if r.Phase.Final() {
			return fmt.Sprintf("rollout %s", r.Phase)
		}
	case KindRevert:
		if r.Phase == Reverting || r.Phase == Reverted || r.Phase == Superseded || r.Phase == Loading {
			return fmt.Sprintf("rollout %s", r.Phase)
		}
	}
	return ""
}

// Defers says what of the operator verb k, meant for rollout id (0:
// whichever is current), waits for something else though the rollout
// takes it (Ignores says ""): a promote of a paused rollout is taken at
// once (the canary's watch ends: the operator accepted it), and the
// next batch begins only when the rollout is resumed. "" when nothing
// waits. `meshfold rollout VERB` says it on stderr (a fresh user's
// finding: such a promote was taken silently).
func (s *State) Defers(k Kind, id uint64) string {
	r := s.Rollout
	if r == nil || k != KindPromote || r.Paused == nil || s.Ignores(k, id) != "" {
		return ""
	}
	return fmt.Sprintf("rollout %d is paused (by %s since %s): the promote is taken now (the canary is no longer watched), and the next batch begins only when the rollout is resumed ('meshfold rollout resume %s --by NAME')",
		r.ID, events.Text(r.Paused.By), r.Paused.Time.Format(time.RFC3339), s.Fleet)
}

func pausedText(r *Rollout) string {
	if r.Paused != nil {
		return ", paused already"
	}
	return ""
}

// revert gives every target the rollout changed its previous want back,
// as the rollout's own recorded steps, within the rollout's budget
// (allowsBack): a target already unavailable (failed, being changed, its
// agent down, paused, unhealthy) at once, as it spends nothing more;
// the others queued, in target order, each given back by advanceBack
// once fewer than max_unavailable of the fleet's nodes are unavailable.
// A target in conflict, or whose want was changed by hand after it
// failed, is never overwritten; a target is given its previous want back
// once per rollout.
func (f *folder) revert(m *Mark) {
	r := f.r
	r.Phase, r.Revert = Reverting, m
	// Paused on a plan its controller cannot verify, the fold does not
	// know which targets run their new want (their plans are held): it
	// gives none back until resumed, and every changed target waits
	// (one whose forward want is not recorded published yet, as ever,
	// for that outcome); the resume gives them back as revert would
	// (folder.resumeUnverified).
	fenced := r.fenced()
	var refused, now, queued []*Node
	for _, name := range r.Targets[:r.Next] {
		n := r.Nodes[name]
		switch {
		case n.Status == Conflict || n.Status == Pending || n.Status == Skipped || n.Status == Moved:
		case n.Back != nil:
			// Given back once already (a revert after an abort that
			// stopped a revert): one revert step per target and rollout.
		case n.Published > 0 && n.NewestWant > n.Published:
			// Changed by hand after it failed: never overwritten.
			refused = append(refused, n)
		case n.Published > 0 || n.Status == Publishing:
			if n.Unavail && (!fenced || n.Published == 0) {
				now = append(now, n)
			} else {
				queued = append(queued, n)
			}
		}
	}
	if fenced {
		f.record(0, "", string(Reverting), events.LevelWarn, "rollout %d reverting (by %s): paused on a plan its controller cannot verify (%s's, at #%d): no target is given its previous want back until the rollout is resumed; then every changed target (%d), within max_unavailable %d",
			r.ID, events.Text(m.By), r.Unverified.Node, r.Unverified.Seq, len(now)+len(queued), r.R.MaxUnavailable)
	} else {
		f.record(0, "", string(Reverting), events.LevelWarn, "rollout %d reverting (by %s): every changed target gets its previous want, within max_unavailable %d: %d at once (unavailable already), %d as the budget allows",
			r.ID, events.Text(m.By), r.R.MaxUnavailable, len(now), len(queued))
	}
	for _, n := range refused {
		n.Back = &Back{Status: RevertRefused, Why: fmt.Sprintf("its want was changed %s at #%d after the rollout's #%d: not overwritten", r.changedBy(n), n.NewestWant, n.Published)}
		f.update(n)
		f.record(0, n.Name, "revert-"+string(RevertRefused), events.LevelError, "target %s: %s", n.Name, n.Back.Why)
	}
	for _, n := range now {
		if n.Published > 0 {
			f.giveBack(n)
			continue
		}
		// Publishing (unavailable): given back once its forward want's
		// outcome is recorded.
		n.Back = &Back{Status: RevertWaiting}
		r.Reverting = append(r.Reverting, n.Name)
		f.update(n)
	}
	for _, n := range queued {
		n.Back = &Back{Status: RevertQueued}
		r.Reverting = append(r.Reverting, n.Name)
		r.Queue = append(r.Queue, n.Name)
		f.update(n)
	}
	f.revertDone()
}

// allowsBack reports whether the budget lets a revert give n its
// previous want back now: n is unavailable already (failed, being
// changed, away, unhealthy: its revert spends nothing more, so a
// failed target is never held behind the budget it spends itself), or
// fewer than max_unavailable are spent (Rollout.spent: the targets the
// rollout never stepped that are unavailable only because a module is
// unhealthy or failed do not count, as they did not for the steps the
// revert gives back; counted, they held a revert for good).
func (r *Rollout) allowsBack(n *Node) bool {
	return n.Unavail || r.Unavailable < r.R.MaxUnavailable || r.spent() < r.R.MaxUnavailable
}

// advanceBack gives queued targets their previous want back as the
// budget allows (allowsBack): the input's node at once when it became
// unavailable (its agent down, paused, unhealthy), then the others in
// target order (Queue) while fewer than max_unavailable nodes are
// unavailable.
func (f *folder) advanceBack() {
	r := f.r
	if r == nil || r.Phase != Reverting || r.fenced() {
		return // fenced: the revert gives nothing back until resumed
	}
	if n := f.node(); n != nil && n.Back != nil && n.Back.Status == RevertQueued && r.allowsBack(n) {
		f.giveBack(n)
	}
	for len(r.Queue) > 0 && (r.Unavailable < r.R.MaxUnavailable || r.spent() < r.R.MaxUnavailable) {
		n := r.Nodes[r.Queue[0]]
		r.Queue = r.Queue[1:]
		if n.Back != nil && n.Back.Status == RevertQueued {
			f.giveBack(n)
		}
	}
}

// dropQueued ends the wait of every target queued for its revert, when
// the revert stops (an abort): none was given its previous want, so a
// later revert may still give it back. It says how many, for the
// abort's record ("" when none).
func (f *folder) dropQueued() string {
	r := f.r
	if r.Phase != Reverting {
		return ""
	}
	c := 0
	r.Queue = nil
	r.Reverting = slices.DeleteFunc(r.Reverting, func(name string) bool {
		n := r.Nodes[name]
		if n.Back.Status != RevertQueued {
			return false
		}
		n.Back = nil
		f.update(n)
		c++
		return true
	})
	if c == 0 {
		return ""
	}
	return fmt.Sprintf("; %d waiting for the budget not given back", c)
}

// GivesBack returns the targets to which a revert of the rollout would
// still give their previous want (the want stored at their
// [Node.RevertTo], or the one the rollout carries, [Node.Had]; none for
// a node that had no want before, [Node.HadNone]): while a revert can be asked (Ignores(KindRevert) is
// ""), those revert would give back or wait for; while reverting, those
// whose previous want is not published yet. In target order. What
// `meshfold build rm` must not break: their previous want's builds.
func (s *State) GivesBack() []*Node {
	r := s.Rollout
	if r == nil {
		return nil
	}
	reverting := r.Phase == Reverting
	if !reverting && s.Ignores(KindRevert, 0) != "" {
		return nil
	}
	var out []*Node
	for _, name := range r.Targets[:r.Next] {
		n := r.Nodes[name]
		if n.HadNone() {
			continue
		}
		if reverting {
			if n.Back != nil && (n.Back.Status == RevertWaiting || n.Back.Status == RevertQueued || n.Back.Status == RevertPublishing) {
				out = append(out, n)
			}
			continue
		}
		// revert's cases, in its order: those it gives back or waits for.
		switch {
		case n.Status == Conflict || n.Status == Pending || n.Status == Skipped || n.Status == Moved:
		case n.Back != nil:
		case n.Published > 0 && n.NewestWant > n.Published:
		case n.Published > 0, n.Status == Publishing:
			out = append(out, n)
		}
	}
	return out
}

// giveBack steps a target back to its previous want.
func (f *folder) giveBack(n *Node) {
	r := f.r
	listed := n.Back != nil && !n.Back.finished() // waiting or queued
	n.Back = &Back{Status: RevertPublishing, Step: f.mark("", "", r.revertWhy())}
	if !listed {
		r.Reverting = append(r.Reverting, n.Name)
	}
	f.publish(r.revertWant(n))
	f.update(n)
}

// judgeBack decides a revert: done once the plan of the previous want
// settled and every module of it runs at its build, healthy (as a
// rollout's step, without the min_healthy window: the previous want is
// the one the node ran); until then it spends the budget. Failed or
// unreached past its deadline.
func (f *folder) judgeBack(n *Node) {
	b := n.Back
	if b == nil || b.finished() || b.Step == nil || f.r.fenced() {
		return // fenced: judged once resumed (folder.resumeUnverified)
	}
	if n.backRuns() {
		b.Status = RevertDone
		f.backFinished(n, events.LevelInfo)
		return
	}
	if b.Status == RevertPublishing || f.s.Now.Before(b.deadlineFrom().Add(f.r.R.HealthyDeadline)) {
		return // a revert not yet published fails nothing (judge's Publishing)
	}
	if n.Paused != nil && !n.Down {
		b.Status, b.Why = RevertUnreached, n.awayWhy()+" at the revert's deadline: it takes its previous want when resumed"
		f.backFinished(n, events.LevelWarn)
		return
	}
	if n.Down {
		b.Status, b.Why = RevertUnreached, "its agent was down at the revert's deadline: it takes its previous want when it returns"
		f.backFinished(n, events.LevelWarn)
		return
	}
	b.Status, b.Why = RevertFailed, "its previous want's plan did not settle within healthy_deadline"
	if b.Want > 0 && n.Plan != nil && n.Plan.Want == b.Want && n.Settled >= n.Plan.Seq {
		b.Why = fmt.Sprintf("its previous want's plan #%d settled, but %s at the revert's deadline (healthy_deadline %s)", n.Plan.Seq, mismatch(n), f.r.R.HealthyDeadline)
	}
	f.backFinished(n, events.LevelError)
}

func (f *folder) backFinished(n *Node, level events.Level) {
	r := f.r
	r.Reverting = remove(r.Reverting, n.Name)
	f.update(n)
	msg := fmt.Sprintf("target %s %s", n.Name, n.Back.Status)
	if n.Back.Why != "" {
		msg += ": " + n.Back.Why
	}
	f.record(0, n.Name, "revert-"+string(n.Back.Status), level, "%s", msg)
	f.revertDone()
}

// revertDone ends a revert once no target's revert is in progress.
func (f *folder) revertDone() {
	r := f.r
	if r.Phase != Reverting || len(r.Reverting) > 0 {
		return
	}
	r.Phase, r.Queue = Reverted, nil // what is left in the queue no longer waits
	r.End = f.mark("", "", "")
	counts := map[Status]int{}
	for _, name := range r.Targets {
		if b := r.Nodes[name].Back; b != nil {
			counts[b.Status]++
		}
	}
	f.record(0, "", string(Reverted), events.LevelWarn, "rollout %d reverted: %d given their previous want back, %d failed, %d refused, %d unreached",
		r.ID, counts[RevertDone], counts[RevertFailed], counts[RevertRefused], counts[RevertUnreached])
}

// judgeAll judges, at the input's time, every target whose outcome
// depends on time.
func (f *folder) judgeAll() {
	r := f.r
	if r == nil {
		return
	}
	if f.forwardWatched() {
		for _, name := range slices.Clone(r.Active) {
			f.judge(r.Nodes[name])
		}
	}
	if r.Phase == Reverting {
		for _, name := range slices.Clone(r.Reverting) {
			f.judgeBack(r.Nodes[name])
		}
	}
}

// judge decides a target being changed (DESIGN.md §11): waiting for an
// approval, done once its plan settled and every module ran at its build,
// healthy, for min_healthy without a break; failed on a crash loop or
// past its healthy_deadline; unreached when its agent is down then.
func (f *folder) judge(n *Node) {
	r := f.r
	if r.fenced() {
		return // judged once resumed (folder.resumeUnverified)
	}
	if n.Back != nil {
		f.judgeBack(n)
		return
	}
	if !f.forwardWatched() {
		return
	}
	now := f.s.Now
	switch n.Status {
	case Publishing:
		// Not judged: its want is not on the node yet, and what keeps
		// it off (the controller stopped, or riding out the stream's
		// election) is no failure of the node. Its healthy_deadline
		// counts from the want recorded published (published);
		// docs/architecture.md, "A want not yet published fails
		// nothing".
		return
	case Changing, WaitingApproval:
	case Done:
		// A canary is watched until its promote: done was judged on the
		// reports the fold had, and a down published at the lease's
		// expiry, or a later have, may show the window was not healthy.
		why := f.canaryBroken(n)
		if why == "" {
			return
		}
		n.Status, n.Why, n.Finished, n.DeadlineFrom, n.GoodSince = Changing, "", nil, now, time.Time{}
		r.Active = append(r.Active, n.Name)
		if r.Phase == WaitingPromote {
			r.Phase = Running
		}
		f.update(n)
		f.record(0, n.Name, string(Changing), events.LevelWarn, "target %s: the canary is no longer done before its promote: %s: watched again", n.Name, why)
	default:
		return
	}
	ours := n.Plan != nil && n.Plan.Want == n.Published
	if ours {
		if row := heldForApproval(n.Plan); row != nil {
			if n.Status != WaitingApproval {
				n.Status, n.GoodSince = WaitingApproval, time.Time{}
				n.Why = fmt.Sprintf("module %s waits for an approval of build %s", row.Name, events.Short(row.Pending))
				f.update(n)
				f.record(0, n.Name, string(WaitingApproval), events.LevelWarn, "target %s: %s", n.Name, n.Why)
			}
			return
		}
		if n.Status == WaitingApproval {
			n.Status, n.Why, n.DeadlineFrom = Changing, "", now
			f.update(n)
			f.record(0, n.Name, string(Changing), events.LevelInfo, "target %s: approved, its plan #%d composes every module", n.Name, n.Plan.Seq)
		}
	}
	settled := ours && n.Settled >= n.Plan.Seq
	if settled {
		if why := crashLoop(n); why != "" {
			f.fail(n, why)
			return
		}
	}
	good := settled && !n.Down && mismatch(n) == ""
	switch {
	case !good:
		n.breakGood(now)
	case n.GoodSince.IsZero():
		n.GoodSince = now
	}
	if good && now.Sub(n.GoodSince) >= r.R.MinHealthy {
		n.Status, n.Why, n.HealthyFrom = Done, "", n.GoodSince
		f.finish(n)
		if r.runsNothing(n) {
			f.record(0, n.Name, string(Done), events.LevelInfo, "target %s done: %s (its plan settled at %s)", n.Name, runsNothingWhy(n), n.SettledAt.Format(time.RFC3339))
		} else {
			f.record(0, n.Name, string(Done), events.LevelInfo, "target %s done: every module ran at its build, healthy, from %s for min_healthy %s", n.Name, n.GoodSince.Format(time.RFC3339), r.R.MinHealthy)
		}
		return
	}
	if n.Status == WaitingApproval || now.Before(n.DeadlineFrom.Add(r.R.HealthyDeadline)) {
		return
	}
	if n.away() && r.canary(n) {
		// The canary never ran the new build: it does not pass, and the
		// rollout halts (a failure's halt: auto_revert gives it its
		// previous want back) rather than wait for a promote of an
		// untried build.
		n.Status = Unreached
		n.Why = fmt.Sprintf("canary %s: %s, still at its healthy_deadline %s: it never ran the new build, so the canary batch does not pass",
			n.Name, awayShort(n), now.Format(time.RFC3339))
		f.finish(n)
		f.record(0, n.Name, string(Unreached), events.LevelError, "target %s unreached: %s", n.Name, n.Why)
		f.halt(n)
		return
	}
	if n.Paused != nil && !n.Down {
		n.Status = Unreached
		n.Why = n.awayWhy() + " at its healthy_deadline: it takes its newest want when resumed"
		f.finish(n)
		f.record(0, n.Name, string(Unreached), events.LevelWarn, "target %s unreached: %s", n.Name, n.Why)
		return
	}
	if n.Down {
		n.Status = Unreached
		n.Why = fmt.Sprintf("its agent was down at its healthy_deadline (down since %s): it takes its newest want when it returns", n.DownSince.Format(time.RFC3339))
		f.finish(n)
		f.record(0, n.Name, string(Unreached), events.LevelWarn, "target %s unreached: %s", n.Name, n.Why)
		return
	}
	f.fail(n, stuckWhy(n, ours, settled, now, r.R))
}

// breakGood ends the target's healthy window at now (if one is open),
// keeping it as Broke when it is the longest under its healthy_deadline.
func (n *Node) breakGood(now time.Time) {
	if !n.GoodSince.IsZero() {
		d := now.Sub(n.GoodSince)
		if b := n.Broke; b == nil || !b.Deadline.Equal(n.DeadlineFrom) || d > b.For {
			n.Broke = &Window{Deadline: n.DeadlineFrom, For: d}
		}
	}
	n.GoodSince = time.Time{}
}

// brokeText says, for a why at the deadline, the target's longest healthy
// window under its healthy_deadline when one broke: "; healthy for at
// most 4s in a row, of min_healthy 15s"; "" when none did.
func brokeText(n *Node, r Resolved) string {
	b := n.Broke
	if b == nil || !b.Deadline.Equal(n.DeadlineFrom) || b.For <= 0 {
		return ""
	}
	return fmt.Sprintf("; healthy for at most %s in a row, of min_healthy %s", shown(b.For), r.MinHealthy)
}

// canaryBroken says why a done canary target, its batch not yet
// promoted, no longer counts done: its agent is down, a module restarted
// (its healthy window broke), or a module does not run at its build,
// healthy; "" when none, or when n is no such target.
func (f *folder) canaryBroken(n *Node) string {
	r := f.r
	if r.R.Canary == 0 || n.Batch != 0 || r.Promoted != nil || (r.Phase != Running && r.Phase != WaitingPromote) {
		return ""
	}
	switch {
	case n.Down:
		return "its agent is down since " + n.DownSince.Format(time.RFC3339)
	case n.GoodSince.IsZero():
		return "a module restarted"
	}
	return mismatch(n)
}

// canaryWait says why the canary batch of a running rollout waits on n:
// a canary target being changed while its agent is down or its node
// paused ("canary ivy: agent down since T: …"); "" for any other target,
// or when the rollout is not running.
func (r *Rollout) canaryWait(n *Node) string {
	if r.Phase != Running || !r.canary(n) || !n.active() || !n.away() {
		return ""
	}
	s := fmt.Sprintf("canary %s: %s: the canary batch waits for it", n.Name, awayShort(n))
	if n.Status != WaitingApproval {
		s += fmt.Sprintf("; the rollout halts at its healthy_deadline %s unless it is back and runs the new build healthy by then", n.DeadlineFrom.Add(r.R.HealthyDeadline).Format(time.RFC3339))
	}
	return s
}

// runsNothing reports whether n's new want has no module: once done it
// runs nothing, every module it ran removed. Such a target passes its
// health check with nothing to judge, so the view, the why and the
// canary's promote say so (a fresh user's finding U13: a canary whose
// want a selector typo emptied passed as healthy, "done").
func (r *Rollout) runsNothing(n *Node) bool {
	return n.Want > 0 && n.Want <= len(r.Wants) && len(r.Wants[n.Want-1]) == 0
}

// runsNothingWhy is a done target's why when it runs nothing now.
func runsNothingWhy(n *Node) string {
	return fmt.Sprintf("runs nothing now: its new want #%d has no module, so every module it ran was removed", n.Published)
}

// promoteNote says, while the rollout waits for a promote, which canary
// targets run nothing now and how many more targets a promote would
// give a want of no module; "" when no canary runs nothing.
func (r *Rollout) promoteNote() string {
	if r.Phase != WaitingPromote {
		return ""
	}
	var canaries []string
	more := 0
	for i, name := range r.Targets {
		n := r.Nodes[name]
		switch {
		case !r.runsNothing(n):
		case i < r.batchEnd(0):
			if n.Status == Done {
				canaries = append(canaries, name)
			}
		case n.Status == Pending:
			more++
		}
	}
	if len(canaries) == 0 {
		return ""
	}
	return fmt.Sprintf("canary %s runs nothing now: its new want has no module, so it was done with nothing to judge; a promote gives %s a want of no module",
		strings.Join(canaries, ", "), plural(more, "more target"))
}

// canaryNotDone says why the canary batch of a rollout not yet promoted
// waits: how many of its targets are done, and for up to three that are
// not, where they stand ("canary ivy: agent down since T").
func (r *Rollout) canaryNotDone() string {
	if r.Phase == Loading {
		return fmt.Sprintf("the canary batch is not done (the start's nodes are loading, %d of %d pages)", r.Loaded, r.Pages)
	}
	end := r.batchEnd(0)
	done := 0
	var wait []string
	for _, name := range r.Targets[:end] {
		n := r.Nodes[name]
		switch {
		case n.Status == Done:
			done++
		case n.Status == Skipped, n.Status == Moved:
		case len(wait) == 3:
			wait = append(wait, "…")
		case len(wait) < 3:
			st := string(n.Status)
			switch {
			case n.away():
				st = awayShort(n)
			case n.Why != "":
				st += ": " + n.Why
			case n.Status == Changing:
				st += ": " + progress(n, r.R)
			case n.Status == Pending:
				// What holds it, as its why says (a fresh user's
				// finding U20: "pending", not the budget a down
				// agent spends).
				st += ", waiting: " + r.holding(n)
			}
			wait = append(wait, "canary "+name+": "+st)
		}
	}
	s := fmt.Sprintf("the canary batch is not done (%d of %d done)", done, end)
	if len(wait) > 0 {
		s += ": " + strings.Join(wait, "; ")
	}
	return s
}

// progress says where a target being changed stands: no plan of its new
// want yet, its plan not settled, what does not run healthy, or since
// when it runs healthy.
func progress(n *Node, rs Resolved) string {
	switch {
	case n.Published == 0:
		return "its want not recorded published yet"
	case n.Plan == nil || n.Plan.Want != n.Published:
		return fmt.Sprintf("no plan of its want #%d yet", n.Published)
	case n.Settled < n.Plan.Seq:
		return fmt.Sprintf("its plan #%d not settled yet", n.Plan.Seq)
	case !n.GoodSince.IsZero():
		return fmt.Sprintf("healthy since %s, for min_healthy %s", n.GoodSince.Format(time.RFC3339), rs.MinHealthy)
	}
	if why := mismatch(n); why != "" {
		return why
	}
	return "not healthy yet"
}

// heldForApproval returns the plan's first row held for an approval.
func heldForApproval(p *PlanSeen) *Row {
	for i := range p.Rows {
		if p.Rows[i].Held && p.Rows[i].Why == events.HoldApproval {
			return &p.Rows[i]
		}
	}
	return nil
}

// haveOf returns the have's module name, or nil.
func haveOf(n *Node, name string) *HaveModule {
	if n.Have == nil {
		return nil
	}
	for i := range n.Have.Modules {
		if n.Have.Modules[i].Name == name {
			return &n.Have.Modules[i]
		}
	}
	return nil
}

// mismatch says the first module of the target's plan that does not run
// at its row's build, healthy (a module without a check counts healthy
// while it runs: its window is min_healthy of running); "" when all do.
// A row the want holds that runs nothing is not asked to run. A have from
// before the agent's down tells nothing of now.
func mismatch(n *Node) string {
	if n.Have != nil && n.Have.Stale {
		return "its agent has reported no have since it was down"
	}
	for _, row := range n.Plan.Rows {
		if row.Build == "" {
			continue
		}
		m := haveOf(n, row.Name)
		switch {
		case m == nil:
			return fmt.Sprintf("module %s is not in its have", row.Name)
		case m.Build != row.Build:
			return fmt.Sprintf("module %s runs build %s, not %s", row.Name, events.Short(m.Build), events.Short(row.Build))
		case m.State != events.Running && len(n.waitsFor(row.Name)) > 0:
			return waitText(row.Name, n.waitsFor(row.Name)) + "; it is " + string(m.State) + exitText(m)
		case m.State != events.Running:
			return fmt.Sprintf("module %s is %s%s", row.Name, m.State, exitText(m))
		case m.Health == Unhealthy || m.Health == Starting:
			return fmt.Sprintf("module %s is %s", row.Name, m.Health)
		}
	}
	return ""
}

func exitText(m *HaveModule) string {
	if m.Exit == "" {
		return ""
	}
	return " (last exit: " + events.Text(m.Exit) + ")"
}

// crashLoop says which module of the target's plan crash-loops at its
// new build; "" when none. A module waiting for a file its new want
// added is not crash-looping (a fresh user's finding G4: a credential a
// slow helper gives in 8 s is no bad build): it is judged at its
// healthy_deadline, and its restarts count from the moment its files
// were filled. A module at the build it ran when the target was given
// its new want counts from its restarts then (Node.Before; a fresh
// user's finding G6: 7 restarts an hour earlier halted a rollout that
// left the module as it was).
func crashLoop(n *Node) string {
	for _, row := range n.Plan.Rows {
		m := haveOf(n, row.Name)
		if m == nil || row.Build == "" || m.Build != row.Build || len(n.waitsFor(row.Name)) > 0 {
			continue
		}
		base, since := n.crashBase(row.Name), " since its files were filled"
		if b := n.restartsBefore(row.Name, row.Build); b > base {
			base, since = b, fmt.Sprintf(" since it was given its new want (%d before)", b)
		}
		if got := m.Restarts - base; got >= CrashLoopRestarts {
			if base == 0 {
				since = ""
			}
			return fmt.Sprintf("module %s crash-loops at build %s: %d restarts%s%s", row.Name, events.Short(row.Build), got, since, exitText(m))
		}
	}
	return ""
}

// waitsFor returns the paths of the files n's new want added to module
// that no filled event reported yet, in the want's order.
func (n *Node) waitsFor(module string) []string {
	var out []string
	for _, f := range n.Fresh {
		if f.Module == module && !f.Filled {
			out = append(out, f.Path)
		}
	}
	return out
}

// beforeAtStart is a target's restarts from its start
// ([NodeAtStart].Restarts), each at its module's build in the new want
// ws; a module ws does not hold is left out.
func beforeAtStart(rs []ModuleRestarts, ws []events.WantModule) []ModuleRestarts {
	var out []ModuleRestarts
	for _, r := range rs {
		if i := slices.IndexFunc(ws, func(m events.WantModule) bool { return m.Name == r.Module }); i >= 0 && ws[i].Build != "" {
			out = append(out, ModuleRestarts{Module: r.Module, Build: ws[i].Build, Restarts: r.Restarts})
		}
	}
	return out
}

// beforeReset drops from before the modules that ms reports at the same
// build with fewer restarts: their count started again (the want changed
// their files or account, and the agent applied them anew), so it no
// longer stands on the restarts before the step. It returns before
// itself when nothing is dropped, else a new slice (a clone of the state
// may share before).
func beforeReset(before []ModuleRestarts, ms []HaveModule) []ModuleRestarts {
	for i, b := range before {
		j := slices.IndexFunc(ms, func(m HaveModule) bool { return m.Name == b.Module && m.Build == b.Build && m.Restarts < b.Restarts })
		if j < 0 {
			continue
		}
		out := slices.Clone(before[:i])
		for _, b := range before[i+1:] {
			if !slices.ContainsFunc(ms, func(m HaveModule) bool { return m.Name == b.Module && m.Build == b.Build && m.Restarts < b.Restarts }) {
				out = append(out, b)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return before
}

// restartsBefore is module's restarts at build when the target was given
// its new want (Node.Before); 0 when it had none or ran another build.
func (n *Node) restartsBefore(module, build string) int {
	for _, b := range n.Before {
		if b.Module == module && b.Build == build {
			return b.Restarts
		}
	}
	return 0
}

// crashBase is module's restarts when the last of its new files was
// filled: its crash loop counts from there.
func (n *Node) crashBase(module string) int {
	base := 0
	for _, f := range n.Fresh {
		if f.Module == module && f.Restarts > base {
			base = f.Restarts
		}
	}
	return base
}

// waiting returns the first module of the target's plan that does not
// run healthy at its build while a file its new want added is unfilled,
// and those files; "" when none.
func waiting(n *Node) (string, []string) {
	if n.Plan == nil || len(n.Fresh) == 0 {
		return "", nil
	}
	for _, row := range n.Plan.Rows {
		files := n.waitsFor(row.Name)
		if row.Build == "" || len(files) == 0 {
			continue
		}
		m := haveOf(n, row.Name)
		if m == nil || m.Build != row.Build || m.State != events.Running || m.Health == Unhealthy || m.Health == Starting {
			return row.Name, files
		}
	}
	return "", nil
}

// waitText says what a module waits for: "module M waits for its
// unfilled file P".
func waitText(module string, files []string) string {
	word := "file"
	if len(files) > 1 {
		word = "files"
	}
	return fmt.Sprintf("module %s waits for its unfilled %s %s", module, word, strings.Join(files, ", "))
}

// provText says what the fold knows of the node's provisioner, for a
// target whose file was not filled by its deadline.
func provText(n *Node) string {
	switch {
	case n.Plan != nil && n.Plan.Prov == "":
		return "its plan names no provisioner, so nothing fills it"
	case n.ProvDown:
		return "its provisioner is down since " + n.ProvDownSince.Format(time.RFC3339)
	}
	// The fold sees no fill status nor the node's refusals: the
	// provisioner may have sent it and the node refused the write (a
	// full or read-only disk; a fresh user's finding: this line blamed
	// the provisioner for a node's full /run).
	return "`meshfold state " + n.Name + "` says why: its provisioner's fill status, or the node's refusal of the write"
}

// stuckWhy says why a target is not done at its deadline.
func stuckWhy(n *Node, ours, settled bool, now time.Time, r Resolved) string {
	switch {
	case !ours:
		return fmt.Sprintf("no plan for its want #%d within healthy_deadline %s", n.Published, r.HealthyDeadline)
	case !settled:
		return fmt.Sprintf("its plan #%d did not settle within healthy_deadline %s", n.Plan.Seq, r.HealthyDeadline)
	}
	if n.Have == nil || !n.Have.Stale {
		if module, files := waiting(n); module != "" {
			word := "file"
			if len(files) > 1 {
				word = "files"
			}
			return fmt.Sprintf("unfilled %s %s of module %s: not filled within healthy_deadline %s: %s",
				word, strings.Join(files, ", "), module, r.HealthyDeadline, provText(n))
		}
	}
	if why := mismatch(n); why != "" {
		return why + " at its healthy_deadline " + r.HealthyDeadline.String() + brokeText(n, r)
	}
	return fmt.Sprintf("healthy for %s only, of min_healthy %s, at its healthy_deadline %s", shown(now.Sub(n.GoodSince)), r.MinHealthy, r.HealthyDeadline)
}

// shown is a measured duration as a why says it: to the tenth of a
// second ("19.9s", not "19.932323878s", a fresh user's finding U30).
// Every why and view text of a measured duration goes through it; the
// operator's own durations (min_healthy, healthy_deadline) print as set.
func shown(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }

// advance moves the rollout on: a batch whose targets are all clear ends
// (after the canary, the rollout waits for a promote), the next begins,
// and targets of the current batch get their new want, in order, while
// the budget allows (DESIGN.md §11).
func (f *folder) advance() {
	r := f.r
	if r.fenced() {
		return
	}
	for r != nil && r.Phase == Running {
		nb := r.Batches()
		if r.Batch < nb {
			end := r.batchEnd(r.Batch)
			if r.Next >= end && r.Clear == end-r.batchStart(r.Batch) {
				if r.Batch == 0 && r.R.Canary > 0 && r.Promoted == nil {
					if !r.canaryTried() {
						// Every canary target was retired or moved to
						// another fleet: none ran the new build, so there
						// is nothing to promote.
						f.haltOn(r.Targets[0], "the canary batch", "no canary target ran the new build: every one was retired or moved to another fleet, so there is nothing to promote")
						return
					}
					r.Phase = WaitingPromote
					note := ""
					if s := r.promoteNote(); s != "" {
						note = ": " + s
					}
					f.record(0, "", string(WaitingPromote), events.LevelInfo, "canary batch done (%s): waiting for a promote%s", plural(r.R.Canary, "target"), note)
					return
				}
				r.Batch++
				r.Clear = 0
				for i := r.batchStart(r.Batch); i < r.batchEnd(r.Batch); i++ {
					if r.Nodes[r.Targets[i]].Clear {
						r.Clear++
					}
				}
				if r.Batch < nb {
					f.record(0, "", "batch", events.LevelInfo, "batch %d of %d begins: %s", r.Batch+1, nb, plural(r.batchEnd(r.Batch)-r.batchStart(r.Batch), "target"))
				}
				continue
			}
		}
		if r.Batch >= nb {
			if len(r.Active) == 0 {
				f.complete()
			}
			return
		}
		if r.Paused != nil {
			return
		}
		stepped := false
		for end := r.batchEnd(r.Batch); r.Next < end; {
			n := r.Nodes[r.Targets[r.Next]]
			if n.Status == Pending {
				if !r.allows(n) {
					break
				}
				f.step(n)
				stepped = true
			}
			r.Next++
		}
		if !stepped {
			return
		}
	}
}

// canaryTried reports whether a target of the canary batch is done: ran
// the new build, healthy, for min_healthy.
func (r *Rollout) canaryTried() bool {
	for _, name := range r.Targets[:r.batchEnd(0)] {
		if r.Nodes[name].Status == Done {
			return true
		}
	}
	return false
}

// batchStart returns the index in Targets of batch k's first target.
func (r *Rollout) batchStart(k int) int {
	if k == 0 {
		return 0
	}
	return r.batchEnd(k - 1)
}

// allows reports whether the budget lets n be changed now: fewer than
// max_unavailable spent ([Rollout.spent]), counting n as it will be. A
// node already unavailable does not spend more of it. One unavailable
// only because a module is unhealthy or failed is changed whatever the
// budget, as a revert gives such a target its want back (allowsBack):
// changing it makes no node unavailable that was not, and its new want
// may be the fix (a fresh user's finding G1: a fleet unhealthy on the
// running build could take the fixing rollout only at max_unavailable
// 100%). Its batch still waits for the one before, and the canary for
// its promote. One away (agent down, paused) waits while the budget is
// exceeded: its new want cannot make it available.
func (r *Rollout) allows(n *Node) bool {
	if n.spendsNothing() {
		return true
	}
	if n.Unavail {
		return r.Unavailable <= r.R.MaxUnavailable || r.spent() <= r.R.MaxUnavailable
	}
	return r.Unavailable < r.R.MaxUnavailable || r.spent() < r.R.MaxUnavailable
}

// spendsNothing reports whether a step to n spends none of the budget:
// n is unavailable only because a module of it is unhealthy or failed
// (not away, not being changed by anyone else): its new want makes no
// node unavailable that was not.
func (n *Node) spendsNothing() bool {
	return n.Unavail && !n.away() && len(n.Unhealthy) > 0
}

// awaitsTurn reports whether n is a target the budget of the steps
// before its batch's turn does not count: still pending, and a step to
// it spends nothing (Node.spendsNothing), so it takes its new want in
// its batch's turn whatever the budget.
func (n *Node) awaitsTurn() bool { return n.Want > 0 && n.Status == Pending && n.spendsNothing() }

// spent is how much of max_unavailable a forward step finds spent: the
// fleet's nodes unavailable (Rollout.Unavailable), but for the targets
// that await their batch's turn (Node.awaitsTurn). Counting those held
// an earlier batch, the canary first, for a budget that only their own
// turn, after that batch, frees: a fleet failing on its running build
// stalled for good on the rollout of its fix (a fresh user's finding G1
// of fresh7: 4 of 20 nodes unhealthy on web v1, in batch 3, with
// max_unavailable 3, held the canary of web v3 at "4 of max_unavailable
// 3 unavailable"). Everything else unavailable still counts: a node away
// (agent down, paused), a target being changed, failed, or unhealthy
// once changed, a node no target of the rollout (docs/architecture.md,
// "A step to a target already unhealthy spends nothing").
func (r *Rollout) spent() int {
	c := r.Unavailable
	for _, name := range r.Targets[min(r.Next, len(r.Targets)):] {
		if r.Nodes[name].awaitsTurn() {
			c--
		}
	}
	return c
}

// step gives a target its new want.
func (f *folder) step(n *Node) {
	r := f.r
	f.stepped(n)
	f.publish(&WantEffect{Rollout: r.ID, Node: n.Name, Step: n.forwardStep(), Modules: r.Wants[n.Want-1], Expect: n.Expect(), Why: r.stepWhy(n)})
}

// stepped marks a target given its new want: publishing, in progress.
func (f *folder) stepped(n *Node) {
	n.Status, n.Step, n.DeadlineFrom = Publishing, f.mark("", "", fmt.Sprintf("batch %d", n.Batch+1)), f.s.Now
	if n.Have != nil {
		// Newer than what the start read: the restarts its crash loop
		// counts from (Node.Before).
		n.Before = RestartsOf(n.Have.Modules)
	}
	f.r.Active = append(f.r.Active, n.Name)
	f.update(n)
}

// adoptStep takes the step of a pending target whose new want is
// recorded published by a fold this one did not follow (the controller
// before a restart), while this one is paused on a plan it cannot verify
// and steps nothing itself (advance): the target was stepped, and so was
// every pending target before it (steps go in target order; their
// outcomes recorded, refused, or not yet), in its batch. Without it a
// halt or revert taken from the records (folder.recorded) left it
// pending, never given its previous want back.
func (f *folder) adoptStep(n *Node) {
	r := f.r
	if n.Batch > r.Batch {
		r.Batch, r.Clear = n.Batch, 0
		for i := r.batchStart(r.Batch); i < r.batchEnd(r.Batch); i++ {
			if r.Nodes[r.Targets[i]].Clear {
				r.Clear++
			}
		}
	}
	for ; r.Next <= n.Order; r.Next++ {
		if m := r.Nodes[r.Targets[r.Next]]; m.Status == Pending {
			f.stepped(m)
		}
	}
}

// stepWhy says why a target gets its new want, for its want's
// [HeaderWhy]: its batch, who applied the rollout and why, and who
// promoted the canary. It reads only what is fixed once the target is
// stepped, so [State.Pending] says the same after a restart.
func (r *Rollout) stepWhy(n *Node) string {
	var b strings.Builder
	if r.R.Canary > 0 && n.Batch == 0 {
		b.WriteString("the canary, ")
	}
	fmt.Fprintf(&b, "batch %d of %d; applied by %s", n.Batch+1, r.Batches(), events.Text(r.By))
	if r.Reason != "" {
		fmt.Fprintf(&b, ": %s", events.ErrorText(r.Reason))
	}
	if p := r.Promoted; p != nil && n.Batch > 0 {
		fmt.Fprintf(&b, "; canary promoted by %s", events.Text(p.By))
	}
	return b.String()
}

// revertWhy says why the rollout gives its changed targets their previous
// want back: who reverted and why, or the failure auto_revert answered.
func (r *Rollout) revertWhy() string {
	m := r.Revert
	if m == nil {
		return "revert"
	}
	s := "revert by " + events.Text(m.By)
	if m.Reason != "" {
		s += ": " + events.ErrorText(m.Reason)
	}
	if m.By == "auto_revert" && r.Halt != nil && r.Halt.Reason != "" {
		s += ": " + r.Halt.Reason
	}
	return s
}

func (f *folder) complete() {
	r := f.r
	r.Phase, r.End = Completed, f.mark("", "", "")
	done, unreached, skipped, moved := 0, 0, 0, 0
	for _, name := range r.Targets {
		switch r.Nodes[name].Status {
		case Done:
			done++
		case Unreached:
			unreached++
		case Skipped:
			skipped++
		case Moved:
			moved++
		}
	}
	retired := ""
	if skipped > 0 {
		retired = fmt.Sprintf(", %d retired (skipped)", skipped)
	}
	if moved > 0 {
		retired += fmt.Sprintf(", %d moved to another fleet", moved)
	}
	f.record(0, "", string(Completed), events.LevelInfo, "rollout %d completed: %s done, %d unreached%s", r.ID, plural(done, "target"), unreached, retired)
}

// Pending returns the wants decided and not yet recorded published or
// refused: what a controller that restarted publishes once it has folded
// the stream to its end (see the package doc). Forward wants are left
// out once the rollout ended.
func (s *State) Pending() []Effect {
	r := s.Rollout
	if r == nil || r.Phase == Superseded {
		return nil
	}
	var out []Effect
	for _, name := range r.Targets[:min(r.Next, len(r.Targets))] {
		n := r.Nodes[name]
		switch {
		case n.Back != nil && n.Back.Status == RevertPublishing:
			out = append(out, Effect{Fleet: s.Fleet, Cause: n.Back.Step.Seq, Want: r.revertWant(n)})
		case n.Status == Publishing && !r.Phase.Final():
			out = append(out, Effect{Fleet: s.Fleet, Cause: n.Step.Seq,
				Want: &WantEffect{Rollout: r.ID, Node: n.Name, Step: n.forwardStep(), Modules: r.Wants[n.Want-1], Expect: n.Expect(), Why: r.stepWhy(n)}})
		}
	}
	return out
}

// Idle reports whether only one of the fleet's rollout events (a new
// start, an operator's verb) can make the rollout act again: it is final,
// no target's revert is in progress and no want is pending. Node events
// may still change the state then (a target's want changed by hand after
// the rollout ended is a conflict, recorded), but nothing the rollout
// does: no want is decided, no time passes for it, and the next verb or
// start is folded after every node event before it. The controller stops
// reading the nodes' events while it holds.
func (s *State) Idle() bool {
	r := s.Rollout
	return r == nil || r.Phase.Final() && len(r.Reverting) == 0 && len(s.Pending()) == 0
}

// NextWake returns the earliest stream time at which the fold would
// decide something with no other input (a target's min_healthy window or
// healthy_deadline ending); ok is false when no such time exists. The
// controller publishes a tick once its clock passes it.
func (s *State) NextWake() (t time.Time, ok bool) {
	s.wakes(func(c time.Time, _, _ string) {
		if !ok || c.Before(t) {
			t, ok = c, true
		}
	})
	return t, ok
}

// wakes calls at with each stream time at which the fold would decide
// something with no other input, the target and what ends then (its
// "min_healthy window", "healthy_deadline", "revert's healthy_deadline").
func (s *State) wakes(at func(t time.Time, node, what string)) {
	r := s.Rollout
	if r == nil || r.fenced() {
		return // fenced: nothing is judged until resumed
	}
	if r.Phase == Running || r.Phase == WaitingPromote || r.Phase == Halted {
		for _, name := range r.Active {
			n := r.Nodes[name]
			if n.Status != WaitingApproval && n.Status != Publishing {
				at(n.DeadlineFrom.Add(r.R.HealthyDeadline), name, "healthy_deadline")
			}
			if !n.GoodSince.IsZero() {
				at(n.GoodSince.Add(r.R.MinHealthy), name, "min_healthy window")
			}
		}
	}
	if r.Phase == Reverting {
		for _, name := range r.Reverting {
			if b := r.Nodes[name].Back; b.Step != nil && b.Status != RevertPublishing {
				at(b.deadlineFrom().Add(r.R.HealthyDeadline), name, "revert's healthy_deadline")
			}
		}
	}
}

// plural writes "1 target", "2 targets", "1 batch", "3 batches".
func plural(n int, word string) string {
	switch {
	case n == 1:
		return "1 " + word
	case strings.HasSuffix(word, "ch"):
		return fmt.Sprintf("%d %ses", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// remove deletes name from list, keeping the order. Targets finish in
// about the order they began, so the search stops near the front.
func remove(list []string, name string) []string {
	if i := slices.Index(list, name); i >= 0 {
		return slices.Delete(list, i, i+1)
	}
	return list
}

// cloneWants copies the start's wants: the state keeps them, apart from
// the decoded payload.
func cloneWants(ws [][]events.WantModule) [][]events.WantModule {
	out := make([][]events.WantModule, len(ws))
	for i, w := range ws {
		out[i] = slices.Clone(w)
		for j := range out[i] {
			out[i][j].Files = slices.Clone(out[i][j].Files)
		}
	}
	return out
}
