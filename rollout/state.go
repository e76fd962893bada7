package rollout

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
)

// Phase is where a rollout is.
type Phase string

// Phases. Loading waits for the start's pages; running, waiting-promote,
// halted and reverting are active; completed, aborted, reverted and
// superseded are final.
const (
	Loading        Phase = "loading"
	Running        Phase = "running"
	WaitingPromote Phase = "waiting-promote"
	Halted         Phase = "halted"
	Reverting      Phase = "reverting"
	Completed      Phase = "completed"
	Aborted        Phase = "aborted"
	Reverted       Phase = "reverted"
	Superseded     Phase = "superseded"
)

// Final reports whether nothing more happens in the phase.
func (p Phase) Final() bool {
	switch p {
	case Completed, Aborted, Reverted, Superseded:
		return true
	}
	return false
}

// Status is a target's progress.
type Status string

// Target statuses (DESIGN.md §11).
const (
	// Pending: not given its new want yet.
	Pending Status = "pending"
	// Publishing: the step is decided; the controller has not recorded
	// the want's publication yet.
	Publishing Status = "publishing"
	// Changing: its want is published; its plan has not settled, or its
	// modules have not run healthy for min_healthy yet.
	Changing Status = "changing"
	// WaitingApproval: its plan holds a module for an operator's approval
	// (incident 4): it neither fails nor completes.
	WaitingApproval Status = "waiting-approval"
	Done            Status = "done"
	Failed          Status = "failed"
	// Conflict: its want was changed by hand; the rollout never
	// overwrites it, not even to revert it.
	Conflict Status = "conflict"
	// Unreached: its agent was down when its deadline passed; it takes its
	// newest want when it returns.
	Unreached Status = "unreached"
	// Skipped is the delivery view's word for a target still pending when
	// the rollout was reverted, aborted or superseded: it never got its
	// new want. The fold keeps such a target pending. The fold itself
	// skips a target an operator retired while the rollout watched it
	// (not finished yet): retire is an explicit act the rollout never
	// undoes, so it gets no new want and no previous want back; its Why
	// says "retired by WHO at #SEQ, skipped".
	Skipped Status = "skipped"
	// Stopped is the delivery view's word for a target given its new
	// want (publishing, changing or waiting for an approval) when the
	// rollout stopped judging it: aborted, superseded or reverted before
	// it was done. The fold keeps its last status; the view no longer
	// calls it changing (a fresh user's finding: an aborted rollout's
	// target stayed "changing" forever), and it spends none of the
	// view's budget.
	Stopped Status = "stopped"
	// Moved: another fleet's rollout gave the node its want (`meshfold
	// apply --take-over`): the node is that fleet's now. The rollout
	// gives it nothing more, new or previous, never calls its want
	// changed by hand, and no longer counts it in its budget or among its
	// nodes ([Node.Moved]; a fresh user's finding U22).
	Moved Status = "moved"
)

// Revert statuses of a target given its previous want back.
const (
	RevertWaiting Status = "waiting" // its forward want's outcome is not known yet
	// RevertQueued: it waits for the budget. A revert gives a target its
	// previous want back only while fewer than max_unavailable of the
	// fleet's nodes are unavailable, as a rollout's step ([Rollout]'s
	// allowsBack); one already unavailable (failed, being changed, its
	// agent down, paused, unhealthy) spends nothing more and is never
	// queued.
	RevertQueued     Status = "queued"
	RevertPublishing Status = "publishing" // decided, not recorded published
	RevertChanging   Status = "reverting"  // published, its plan not settled
	RevertDone       Status = "reverted"
	RevertFailed     Status = "failed"    // its apply failed, or its plan did not settle in time
	RevertRefused    Status = "refused"   // not published (changed by hand, or the previous want unreadable)
	RevertUnreached  Status = "unreached" // its agent was down
)

// State is one fleet's rollout state: the pure fold of the fleet's
// rollout events and of its nodes' events since the current rollout's
// start. It is not safe for concurrent use. Its JSON form is its
// snapshot; [UnmarshalState] reads it back.
type State struct {
	Fleet string `json:"fleet"`
	// Seq is the last sequence folded.
	Seq uint64 `json:"seq"`
	// Now is the newest stream time folded: the fold's clock.
	Now time.Time `json:"now,omitzero"`
	// Rollout is the current (or last) rollout; nil before the first
	// start.
	Rollout *Rollout `json:"rollout,omitempty"`
}

// Mark is who did something, when (stream sequence and time) and why.
type Mark struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	By     string    `json:"by,omitempty"`
	Node   string    `json:"node,omitempty"`
	Reason string    `json:"reason,omitempty"`
	// Checked: the server checked By (a named operator's subject,
	// [Input.Checked]); false when By is self-declared or empty.
	Checked bool `json:"by_checked,omitempty"`
}

// Rollout is one rollout: its start, its phase, its fleet's nodes and its
// progress.
type Rollout struct {
	// ID is the start's stream sequence.
	ID     uint64    `json:"id"`
	Time   time.Time `json:"time"`
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	Params Params    `json:"params"`
	// R is Params resolved against the targets and nodes, once loaded.
	R     Resolved              `json:"resolved"`
	Wants [][]events.WantModule `json:"wants"`
	// NewFiles are the start's lists of files new to a target's want.
	NewFiles [][]FileRef `json:"new_files,omitempty"`
	// Pages is the start's page count; Loaded how many were folded.
	Pages  int   `json:"pages"`
	Loaded int   `json:"loaded"`
	Phase  Phase `json:"phase"`
	// Paused is the pause in force; Promoted the promote of the canary;
	// Halt the failure that halted it (Node, Reason); End the event that
	// ended it (abort, revert, a new start, the last target done).
	Paused *Mark `json:"paused,omitempty"`
	// Unverified, set with Paused, is the fold's own pause on a target's
	// plan that the controller could not verify against its keys (Node
	// and Reason: whose, and why, naming the key): until an operator's
	// resume, the rollout decides nothing of its own (no step, no target
	// judged, no conflict, no revert of a halt, no target given its
	// previous want back, no revert judged; a failed settle is kept,
	// Node.HeldFailure), and takes its controller's records of what it
	// did not decide itself. See folder.unverified, folder.recorded.
	Unverified *Mark `json:"unverified,omitempty"`
	// UnverifiedRecord is the sequence of that pause's record folded
	// back; 0 while none was ([State.UnrecordedPause]).
	UnverifiedRecord uint64 `json:"unverified_record,omitempty"`
	Promoted         *Mark  `json:"promoted,omitempty"`
	Halt             *Mark  `json:"halt,omitempty"`
	Revert           *Mark  `json:"revert,omitempty"`
	End              *Mark  `json:"end,omitempty"`
	// Nodes are the fleet's nodes, by name.
	Nodes map[string]*Node `json:"nodes"`
	// Targets are the targets' names in rollout order.
	Targets []string `json:"targets"`
	// Batch is the current batch (0-based; the canary is batch 0 when
	// there is one); Next the index in Targets of the next target to
	// step.
	Batch int `json:"batch"`
	Next  int `json:"next"`
	// Unavailable counts the fleet's nodes that are unavailable now;
	// Clear the targets of the current batch that no longer hold it back
	// (done, unreached, or given their want with their agent down).
	// Invariant: both equal their count over Nodes.
	Unavailable int `json:"unavailable"`
	Clear       int `json:"clear"`
	// Active are the targets stepped and not finished, in step order;
	// Reverting the targets whose revert is not finished.
	Active    []string `json:"active,omitempty"`
	Reverting []string `json:"reverting,omitempty"`
	// Queue are the targets whose revert waits for the budget
	// ([RevertQueued]), in target order: the next given back is the
	// first. An entry whose revert no longer waits (given back when its
	// node became unavailable, or refused) is dropped when reached.
	Queue []string `json:"queue,omitempty"`
	// Controller is the controller's newest fact of this rollout folded
	// (its tick, a step's outcome, a record): nil while none was.
	// [State.Unattended] reads it.
	Controller *ControllerFact `json:"controller,omitempty"`
	// Over is the fleet's newest rollout when apply read the fleet, as
	// its start names it ([Start].Supersedes); 0 for none, or an older
	// apply's start. A want that rollout stored on a target after apply
	// read the target is no hand change (folder.overSuperseded).
	Over uint64 `json:"over,omitempty"`
}

// Node is one of the fleet's nodes: its availability, and, for a target,
// its progress.
type Node struct {
	Name string `json:"name"`
	// Down: its agent is down (since DownSince).
	Down      bool      `json:"down,omitempty"`
	DownSince time.Time `json:"down_since,omitzero"`
	// Paused is an operator's pause of the node (`meshfold pause`) in
	// force: it emits no plan, so the rollout holds it as it holds a node
	// whose agent is down.
	Paused *Mark `json:"paused,omitempty"`
	// Unhealthy are its modules the newest have reports unhealthy or
	// failed, sorted.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// Have is the newest have folded.
	Have *HaveSeen `json:"have,omitempty"`
	// Earlier is its newest have from before the rollout's start, as the
	// caller read it ([State.SetEarlierHave]): the delivery view's
	// builds count it while no have of the node is folded. The fold
	// never reads it.
	Earlier *HaveSeen `json:"earlier,omitempty"`
	// NewestWant is the sequence of the newest want on its subject known
	// to the rollout.
	NewestWant uint64 `json:"newest_want,omitempty"`
	// NewestID is the message id of that want when it names a rollout's
	// step of this node ([WantID]), empty when it was published by hand
	// (or is not known): what [Rollout.changedBy] names.
	NewestID string `json:"newest_id,omitempty"`
	// Unavail caches [Node.unavailable] for the rollout's count.
	Unavail bool `json:"unavail,omitempty"`
	// Moved, when set, is the other fleet's rollout step whose want took
	// the node over (its message id named that fleet's rollout): the
	// node is that fleet's since, target or not ([Moved]).
	Moved *Move `json:"moved,omitempty"`

	// A target's fields; Want is 0 for a node that is not one.
	Want  int    `json:"want,omitempty"` // 1 + index in Rollout.Wants
	Order int    `json:"order,omitempty"`
	Batch int    `json:"batch,omitempty"`
	Prev  uint64 `json:"prev,omitempty"`
	// Base, when set, is the want a revert gives back instead of Prev
	// (the start's Back: Prev is an unfinished superseded rollout's).
	Base uint64 `json:"base,omitempty"`
	// Adopted, when set, is a want the superseded rollout
	// ([Rollout].Over) stored on the target after apply read it (Prev):
	// the target's step expects it instead of Prev ([Node.Expect]), as
	// [StepOver] when its forward step was refused for it. A revert
	// still gives back [Node.RevertTo]: the want before the unfinished
	// rollouts.
	Adopted uint64 `json:"adopted,omitempty"`
	// Again: its forward step was refused for Adopted, and it is given
	// its new want again as [StepOver].
	Again bool `json:"again,omitempty"`
	// Had, when set, is 1 + the index in Rollout.Wants of the want a
	// revert gives back, which the stream no longer holds (the start's
	// Had; HadSeq its sequence): apply read it from the reconciler's
	// state.
	Had    int    `json:"had,omitempty"`
	HadSeq uint64 `json:"had_seq,omitempty"`
	Status Status `json:"status,omitempty"`
	// Why says why it failed, is in conflict, is unreached, or waits.
	Why  string `json:"why,omitempty"`
	Step *Mark  `json:"step,omitempty"`
	// Published is the sequence of its new want, once recorded.
	Published uint64 `json:"published,omitempty"`
	// Plan is the newest plan folded; Settled the newest plan that
	// settled (SettledAt its first settle's time).
	Plan *PlanSeen `json:"plan,omitempty"`
	// Unverified is its newest plan the controller could not verify
	// (newer than Plan), held aside: never taken as its plan unless an
	// operator resumes the rollout it paused ([Rollout].Unverified).
	Unverified *PlanSeen `json:"unverified,omitempty"`
	// HeldFailure is a failed settle of its newest plan (Unverified when
	// set, else Plan) folded while the rollout was paused on a plan its
	// controller could not verify: the pause judges nothing, so it is
	// kept, and the operator's resume judges it (folder.holdFailure).
	HeldFailure *FailedSettle `json:"held_failure,omitempty"`
	Settled     uint64        `json:"settled,omitempty"`
	SettledAt   time.Time     `json:"settled_at,omitzero"`
	// FwdPlan is the newest plan of its new want (Published) and
	// FwdSettledAt when that plan settled (zero: not yet): what the
	// delivery view shows once a revert's plan followed it.
	FwdPlan      uint64    `json:"fwd_plan,omitempty"`
	FwdSettledAt time.Time `json:"fwd_settled_at,omitzero"`
	// GoodSince is when every module of its plan began to run at its
	// build, healthy, without a break since; zero while not.
	GoodSince time.Time `json:"good_since,omitzero"`
	// Broke is its longest healthy window (GoodSince to the break: a
	// module unhealthy or off its build, a restart, its agent down) that
	// ended before min_healthy, under the healthy_deadline that began at
	// Broke.Deadline (one of an earlier DeadlineFrom tells nothing of
	// this one); nil when none broke. A why at the deadline says it: a
	// flapping module was healthy, only never for min_healthy in a row.
	// Replaced, never changed in place: a clone of the state may share it.
	Broke *Window `json:"broke,omitempty"`
	// HealthyFrom is when the healthy window that made it done began
	// (GoodSince then): the delivery view's "healthy since" of a done
	// target, kept when a later down or restart ends GoodSince.
	HealthyFrom time.Time `json:"healthy_from,omitzero"`
	// DeadlineFrom is when its healthy_deadline began: its step, or when
	// it stopped waiting for an approval or came back, or the resume of
	// a rollout paused on a plan its controller could not verify.
	DeadlineFrom time.Time `json:"deadline_from,omitzero"`
	// Finished is when it became done, failed, in conflict or unreached.
	Finished *Mark `json:"finished,omitempty"`
	// Clear caches whether it no longer holds its batch back.
	Clear bool `json:"clear,omitempty"`
	// Back is its revert, when the rollout gives it its previous want.
	Back *Back `json:"back,omitempty"`
	// Before are its modules' restarts when it was given its new want
	// (its newest have folded since the start, else the start's
	// Restarts): a module at the same build counts its crash loop from
	// there, so a module that crash-looped before the rollout and runs
	// again does not fail a rollout that leaves it as it is (a fresh
	// user's finding G6).
	Before []ModuleRestarts `json:"before,omitempty"`
	// Fresh are the files its new want adds (the start's NewFiles): a
	// module whose fresh file is not filled yet waits for it, and its
	// restarts meanwhile are no crash loop (a fresh user's finding G4).
	Fresh []Fresh `json:"fresh,omitempty"`
	// ProvDown: its provisioner client is down since ProvDownSince (a
	// prov event folded since the start); ProvSeen: any was.
	ProvDown      bool      `json:"prov_down,omitempty"`
	ProvSeen      bool      `json:"prov_seen,omitempty"`
	ProvDownSince time.Time `json:"prov_down_since,omitzero"`
}

// Fresh is one file a target's new want adds: filled once a filled event
// of it was folded; Restarts is then its module's restarts at its new
// build in the newest have (the count its crash loop is judged from).
type Fresh struct {
	FileRef
	Filled   bool `json:"filled,omitempty"`
	Restarts int  `json:"restarts,omitempty"`
}

// FailedSettle is what the fold keeps of a failed settle: its stream
// sequence, and the settle's plan, module (empty: the plan as a whole),
// error and whether the agent refused the plan for its signer.
type FailedSettle struct {
	Seq       uint64 `json:"seq"`
	Plan      uint64 `json:"plan"`
	Module    string `json:"module,omitempty"`
	Error     string `json:"error,omitempty"`
	Untrusted bool   `json:"untrusted,omitempty"`
}

// newestPlan is the sequence of the node's newest plan folded: the one
// held aside when there is one (it is newer than Plan), else Plan; 0
// when none.
func (n *Node) newestPlan() uint64 {
	switch {
	case n.Unverified != nil:
		return n.Unverified.Seq
	case n.Plan != nil:
		return n.Plan.Seq
	}
	return 0
}

// Back is a target's revert.
type Back struct {
	Status Status `json:"status"`
	Step   *Mark  `json:"step,omitempty"`
	// Want is the sequence of the previous want given back, once
	// recorded.
	Want uint64 `json:"want,omitempty"`
	Why  string `json:"why,omitempty"`
	// From is when its previous want was recorded published: its
	// healthy_deadline counts from then (zero: not yet).
	From time.Time `json:"from,omitzero"`
}

// deadlineFrom is when b's healthy_deadline began: its want recorded
// published, or its step for a revert recorded before From was kept.
func (b *Back) deadlineFrom() time.Time {
	if !b.From.IsZero() {
		return b.From
	}
	return b.Step.Time
}

// Text says b's status for a target's status column, after a "; ":
// "reverted", "reverting", else "revert " and the status ("revert
// queued", "revert failed"). It read "failed, revert reverted", a stutter
// (a fresh user's finding U5).
func (b *Back) Text() string {
	switch b.Status {
	case RevertDone, RevertChanging:
		return string(b.Status)
	}
	return "revert " + string(b.Status)
}

// Window is a healthy window of a target that broke (Node.Broke).
type Window struct {
	// Deadline is the target's DeadlineFrom when the window broke.
	Deadline time.Time `json:"deadline"`
	// For is how long the window lasted.
	For time.Duration `json:"for"`
}

// HaveSeen is the newest have of a node.
type HaveSeen struct {
	Seq     uint64       `json:"seq"`
	Time    time.Time    `json:"time"`
	Modules []HaveModule `json:"modules"`
	// Stale: the node's agent went down after this have; it tells
	// nothing of the node since, and starts no healthy window.
	Stale bool `json:"stale,omitempty"`
}

// PlanSeen is what the fold keeps of a plan: its sequence, its want and
// its rows' names, builds and holds.
type PlanSeen struct {
	Seq  uint64 `json:"seq"`
	Want uint64 `json:"want"`
	Rows []Row  `json:"rows"`
	// Prov is the plan's provisioner account (empty: it names no
	// provisioner, so nothing can fill its files).
	Prov string `json:"prov,omitempty"`
}

// Row is one row of a plan, without its files and account.
type Row struct {
	Name    string            `json:"name"`
	Build   string            `json:"build,omitempty"`
	Held    bool              `json:"held,omitempty"`
	Why     events.HoldReason `json:"why,omitempty"`
	Pending string            `json:"pending,omitempty"`
}

// NewState returns the empty state of fleet.
func NewState(fleet string) *State { return &State{Fleet: fleet} }

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a State always encodes
	}
	c := new(State)
	if err := json.Unmarshal(b, c); err != nil {
		panic(err)
	}
	return c
}

// UnmarshalState decodes a snapshot and checks its invariants.
func UnmarshalState(data []byte) (*State, error) {
	s := new(State)
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("rollout: decode state: %w", err)
	}
	if err := s.CheckInvariants(); err != nil {
		return nil, fmt.Errorf("rollout: decode state: %w", err)
	}
	return s, nil
}

// CheckInvariants returns an error naming the first invariant of the
// state that does not hold. Tests call it after every step.
func (s *State) CheckInvariants() error {
	r := s.Rollout
	if r == nil {
		return nil
	}
	if r.ID > s.Seq {
		return fmt.Errorf("rollout %d above the folded sequence %d", r.ID, s.Seq)
	}
	if r.Loaded > r.Pages {
		return fmt.Errorf("%d pages loaded of %d", r.Loaded, r.Pages)
	}
	if r.fenced() && r.Paused == nil {
		return fmt.Errorf("paused on an unverified plan (#%d) and not paused", r.Unverified.Seq)
	}
	unavail, clear := 0, 0
	for name, n := range r.Nodes {
		if n.Name != name {
			return fmt.Errorf("node %q filed as %q", n.Name, name)
		}
		if n.Unverified != nil && n.Plan != nil && n.Unverified.Seq <= n.Plan.Seq {
			return fmt.Errorf("node %s: its held unverified plan #%d is not newer than its plan #%d", name, n.Unverified.Seq, n.Plan.Seq)
		}
		if hf := n.HeldFailure; hf != nil && (r.Unverified == nil || hf.Plan != n.newestPlan()) {
			return fmt.Errorf("node %s: its failed settle of plan #%d is held, its newest plan #%d, paused on an unverified plan %v", name, hf.Plan, n.newestPlan(), r.Unverified != nil)
		}
		if n.Earlier != nil && n.Earlier.Seq >= r.ID {
			return fmt.Errorf("node %s: its have before the start is #%d, not before %d", name, n.Earlier.Seq, r.ID)
		}
		if n.Unavail != n.unavailable() {
			return fmt.Errorf("node %s: cached unavailable %v, is %v", name, n.Unavail, n.unavailable())
		}
		if n.Unavail {
			unavail++
		}
		if n.Want > 0 {
			if n.Want > len(r.Wants) {
				return fmt.Errorf("target %s names want %d of %d", name, n.Want, len(r.Wants))
			}
			if n.Had > len(r.Wants) || (n.Had > 0) != (n.HadSeq > 0) || (n.Had > 0 && n.Base != 0) {
				return fmt.Errorf("target %s: had %d (#%d) of %d wants, base #%d", name, n.Had, n.HadSeq, len(r.Wants), n.Base)
			}
			if n.Order >= len(r.Targets) || r.Targets[n.Order] != name {
				return fmt.Errorf("target %s not at its order %d", name, n.Order)
			}
			if n.Clear != r.clear(n) {
				return fmt.Errorf("target %s: cached clear %v, is %v", name, n.Clear, r.clear(n))
			}
			if r.Phase != Loading && n.Clear && n.Batch == r.Batch {
				clear++
			}
			if (n.Status == Pending) != (n.Order >= r.Next) && n.Status != Conflict && n.Status != Skipped && n.Status != Moved {
				return fmt.Errorf("target %s is %s at order %d, next %d", name, n.Status, n.Order, r.Next)
			}
			if n.Published != 0 && n.Published <= n.Prev {
				return fmt.Errorf("target %s published at %d, not after %d", name, n.Published, n.Prev)
			}
		}
	}
	if unavail != r.Unavailable {
		return fmt.Errorf("%d nodes unavailable, counted %d", unavail, r.Unavailable)
	}
	if r.Phase != Loading && clear != r.Clear {
		return fmt.Errorf("%d targets of batch %d clear, counted %d", clear, r.Batch, r.Clear)
	}
	for _, name := range r.Active {
		n := r.Nodes[name]
		if n == nil || !n.active() {
			return fmt.Errorf("active target %s is not active", name)
		}
	}
	if len(r.Active) != len(slices.Compact(slices.Sorted(slices.Values(r.Active)))) {
		return fmt.Errorf("active targets repeated")
	}
	queue := make(map[string]bool, len(r.Queue))
	for _, name := range r.Queue {
		queue[name] = true
	}
	for _, name := range r.Reverting {
		n := r.Nodes[name]
		if n == nil || n.Back == nil || n.Back.finished() {
			return fmt.Errorf("reverting target %s is not reverting", name)
		}
		if n.Back.Status == RevertQueued && !queue[name] {
			return fmt.Errorf("target %s queued for its revert is not in the queue", name)
		}
		// A target waits for the budget only while it is spent, and
		// never when it is unavailable itself (it spends nothing more).
		// While paused on a plan its controller cannot verify, every
		// target of the revert waits (folder.revert).
		if n.Back.Status == RevertQueued && (r.Phase != Reverting || !r.fenced() && (n.Unavail || r.spent() < r.R.MaxUnavailable)) {
			return fmt.Errorf("target %s queued for its revert (rollout %s, unavailable %v, %d of max_unavailable %d)", name, r.Phase, n.Unavail, r.spent(), r.R.MaxUnavailable)
		}
	}
	if r.Phase != Loading && r.Phase != Completed && r.Phase != Superseded {
		if r.Next > len(r.Targets) {
			return fmt.Errorf("next target %d of %d", r.Next, len(r.Targets))
		}
	}
	return nil
}

// Expect is the want the target's step expects on its subject: Adopted
// when set, else Prev.
func (n *Node) Expect() uint64 {
	if n.Adopted != 0 {
		return n.Adopted
	}
	return n.Prev
}

// forwardStep is the step that gives the target its new want: StepOver
// once its forward step was refused for a want of the superseded
// rollout, else StepForward.
func (n *Node) forwardStep() Step {
	if n.Again {
		return StepOver
	}
	return StepForward
}

// RevertTo is the sequence of the want a revert gives the target back
// by copy: Base when set, else Prev; 0 when the rollout carries it (Had)
// or there is none (an empty want: [Node.HadNone]).
func (n *Node) RevertTo() uint64 {
	if n.Base != 0 {
		return n.Base
	}
	if n.Had != 0 {
		return 0
	}
	return n.Prev
}

// HadNone reports whether a revert gives the target an empty want: it
// had no want before the rollout, neither in the stream nor aged out of
// it.
func (n *Node) HadNone() bool {
	return n.RevertTo() == 0 && n.Had == 0
}

// revertWant is the want a revert of target n publishes: a copy of the
// want at RevertTo, else the want the rollout carries (Had), else, for
// a node that had no want before, an empty one (every module removed).
// The one place that decides it.
func (r *Rollout) revertWant(n *Node) *WantEffect {
	w := &WantEffect{Rollout: r.ID, Node: n.Name, Step: StepRevert, CopyOf: n.RevertTo(), Expect: n.Published}
	switch {
	case w.CopyOf != 0:
	case n.Had > 0 && n.Had <= len(r.Wants):
		w.Modules = cloneWants(r.Wants[n.Had-1 : n.Had])[0]
		if w.Modules == nil {
			w.Modules = []events.WantModule{}
		}
	default:
		w.Modules = []events.WantModule{}
	}
	if n.Back != nil && n.Back.Step != nil {
		w.Why = n.Back.Step.Reason
	}
	return w
}

// RevertBases sets each candidate's Back from s, the fleet's newest
// rollout as it stands now, when a start of the candidates would
// supersede it (it is active): a target whose newest want (Prev) is that
// rollout's forward want for it, which that rollout had not made done
// (changing, waiting for an approval, failed, unreached), gets back,
// on a revert of the new rollout, the want that rollout would have given
// back (its own Back, or the want it diffed against): the last want the
// node had before the unfinished rollouts, not the unfinished one's (a
// fresh user's finding: a revert after a superseding apply gave back a
// build held for an approval that never ran). A target whose forward
// want was done, or that was given its previous want back, changed by
// hand, or never stepped, keeps Prev. Candidates of a rollout that has
// ended (completed, aborted, reverted) are left as they are: its targets
// keep the want they have.
func (s *State) RevertBases(cands []Candidate) {
	r := s.Rollout
	if r == nil || !r.active() {
		return
	}
	for i := range cands {
		c := &cands[i]
		n := r.Nodes[c.Node]
		if n == nil || n.Want == 0 || n.Published == 0 || c.Prev != n.Published || n.Status == Done || n.givenBack() {
			continue
		}
		if base := n.RevertTo(); base != 0 && base < c.Prev {
			c.Back = base
		} else if n.Had > 0 && n.Had <= len(r.Wants) {
			// The want it had before that rollout aged out of the
			// stream: the new start carries it on.
			c.HadSeq, c.Had = n.HadSeq, r.Wants[n.Had-1]
		}
	}
}

// unavailable reports whether the node counts against max_unavailable
// (DESIGN.md §11): its agent is down, it is paused, a module is unhealthy
// or failed, or it is a target being changed (by the rollout's step or
// its revert) or failed.
func (n *Node) unavailable() bool {
	if n.Moved != nil {
		return false // another fleet's: its budget, not this one's
	}
	if n.away() || len(n.Unhealthy) > 0 {
		return true
	}
	if n.givenBack() {
		// Given its previous want back: being changed until that ends;
		// one whose revert failed stays unavailable, as a failed target,
		// until its previous want runs after all.
		if n.Back.Status == RevertFailed {
			return !n.backRuns()
		}
		return !n.Back.finished()
	}
	switch n.Status {
	case Publishing, Changing, WaitingApproval, Failed:
		return true
	}
	return false
}

// clear reports whether a target no longer holds its batch back: done,
// unreached, skipped (retired), or given its want while its agent is
// down or it is paused
// (it takes it when it returns or is resumed; DESIGN.md §11: it does not
// stop the others). A canary target is clear only when done or skipped:
// the canary batch exists to try the new build, so one that is away or
// unreached never ran it and holds the batch (it halts the rollout at
// its deadline instead; docs/architecture.md, "A canary passes only
// once it ran the new build").
func (r *Rollout) clear(n *Node) bool {
	switch n.Status {
	case Done, Skipped, Moved:
		return true
	case Unreached:
		return !r.canary(n)
	case Publishing, Changing, WaitingApproval:
		return n.away() && !r.canary(n)
	}
	return false
}

// canary reports whether n is a target of the canary batch.
func (r *Rollout) canary(n *Node) bool { return r.R.Canary > 0 && n.Want > 0 && n.Batch == 0 }

// Move is a take-over of a node by another fleet's rollout: the fleet,
// the rollout (its start's sequence), the step and the want (its stream
// sequence) that moved it. By is who applied the take-over, as the caller
// read it from that rollout's start ([State.SetMovedBy]); the fold never
// reads it (it reads the fleet's own events only).
type Move struct {
	Fleet   string `json:"fleet"`
	Rollout uint64 `json:"rollout"`
	Step    Step   `json:"step"`
	Want    uint64 `json:"want"`
	By      string `json:"by,omitempty"`
}

// movedWhy follows a moved target's [Move.Text] in its why.
const movedWhy = ": the rollout gives it no want, new or previous"

// Text says the move: "moved to fleet api (rollout 535, --take-over by
// alice at #535)" (without "by alice" when the start was not read).
func (m *Move) Text() string {
	by := ""
	if m.By != "" {
		by = " by " + events.Text(m.By)
	}
	return fmt.Sprintf("moved to fleet %s (rollout %d, --take-over%s at #%d)", m.Fleet, m.Rollout, by, m.Rollout)
}

// SetMovedBy sets who applied the take-over that moved node, as the
// caller read it from the other fleet's rollout start (the fold never
// reads another fleet's events): the delivery view says it.
func (s *State) SetMovedBy(node, by string) {
	if r := s.Rollout; r != nil {
		if n := r.Nodes[node]; n != nil && n.Moved != nil {
			n.Moved.By = by
			if n.Status == Moved {
				n.Why = n.Moved.Text() + movedWhy
			}
		}
	}
}

// away reports whether the node cannot take a want now: its agent is
// down or an operator paused it.
func (n *Node) away() bool { return n.Down || n.Paused != nil }

// awayWhy says why the node is away: "its agent is down since T" and/or
// "paused by WHO since T: REASON"; "" when it is not.
func (n *Node) awayWhy() string {
	var parts []string
	if n.Down {
		parts = append(parts, "its agent is down since "+n.DownSince.Format(time.RFC3339))
	}
	if p := n.Paused; p != nil {
		s := "paused by " + events.Text(p.By) + " since " + p.Time.Format(time.RFC3339)
		if p.Reason != "" {
			s += ": " + events.ErrorText(p.Reason)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// awayShort says why the node is away, as status and records word it:
// "agent down since T" and/or "paused by WHO since T: REASON"; "" when
// it is not.
func awayShort(n *Node) string {
	var parts []string
	if n.Down {
		parts = append(parts, "agent down since "+n.DownSince.Format(time.RFC3339))
	}
	if p := n.Paused; p != nil {
		s := "paused by " + events.Text(p.By) + " since " + p.Time.Format(time.RFC3339)
		if p.Reason != "" {
			s += ": " + events.ErrorText(p.Reason)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// active reports whether a target was stepped and is not finished.
func (n *Node) active() bool {
	switch n.Status {
	case Publishing, Changing, WaitingApproval:
		return true
	}
	return false
}

// backRuns reports whether the target runs the previous want its revert
// gave back: that want's plan settled, its agent is up, and every module
// of the plan runs at its build, healthy ([mismatch]).
func (n *Node) backRuns() bool {
	b := n.Back
	return b != nil && b.Want > 0 && n.Plan != nil && n.Plan.Want == b.Want && n.Settled >= n.Plan.Seq && !n.Down && mismatch(n) == ""
}

// givenBack reports whether a revert gave the target its previous want
// back or decided on it (a revert waiting for the budget has not).
func (n *Node) givenBack() bool { return n.Back != nil && n.Back.Status != RevertQueued }

func (b *Back) finished() bool {
	switch b.Status {
	case RevertDone, RevertFailed, RevertRefused, RevertUnreached:
		return true
	}
	return false
}

// batchEnd returns the index in Targets past the last target of batch k.
func (r *Rollout) batchEnd(k int) int {
	n := len(r.Targets)
	if r.R.Canary > 0 {
		if k == 0 {
			return r.R.Canary
		}
		return min(n, r.R.Canary+k*r.R.Batch)
	}
	return min(n, (k+1)*r.R.Batch)
}

// Batches returns the count of batches, the canary included.
func (r *Rollout) Batches() int {
	n := len(r.Targets)
	if n == 0 {
		return 0
	}
	if r.R.Canary > 0 {
		return 1 + (n-r.R.Canary+r.R.Batch-1)/r.R.Batch
	}
	return (n + r.R.Batch - 1) / r.R.Batch
}

// batchOf returns the batch of the target at index i of Targets.
func (r *Rollout) batchOf(i int) int {
	if r.R.Canary > 0 {
		if i < r.R.Canary {
			return 0
		}
		return 1 + (i-r.R.Canary)/r.R.Batch
	}
	return i / r.R.Batch
}

// Active reports whether the rollout still acts: loading, running,
// waiting for a promote, halted or reverting.
func (r *Rollout) active() bool { return !r.Phase.Final() }

// HandWant says what a want published by hand now on node would do to
// the rollout (DESIGN.md §11: a target's want changed by hand is a
// conflict, never overwritten): "" when nothing (node is no target, the
// rollout has ended, the target has failed or is already in conflict),
// else what would happen, as one clause naming the fleet, the rollout
// and its phase. A paused rollout halts on it too: a pause stops steps,
// not the fold. What `meshfold want` refuses without --force.
func (s *State) HandWant(node string) string {
	r := s.Rollout
	if r == nil {
		return ""
	}
	n := r.Nodes[node]
	if n == nil || n.Want == 0 {
		return ""
	}
	where := fmt.Sprintf("node %s is a target of fleet %s's rollout %d (%s)", node, s.Fleet, r.ID, r.Phase)
	switch r.Phase {
	case Loading, Running, WaitingPromote:
		switch n.Status {
		case Failed, Conflict, Skipped, Moved:
			return ""
		}
		then := ""
		if r.R.AutoRevert {
			then = ", and auto_revert gives every changed target its previous want back"
		}
		return where + ": a want published by hand halts the rollout as a conflict" + then
	case Reverting:
		if n.Back != nil && !n.Back.finished() {
			return where + ": a want published by hand refuses the node's revert"
		}
	}
	return ""
}
