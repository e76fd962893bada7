package reconcile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	// encoding/json's semantics, faster: a restart decodes every state.
	"github.com/segmentio/encoding/json"

	"github.com/meshfold/meshfold/events"
)

// State is one node's folded state. It holds only what DESIGN.md §4 lists,
// and what the operator events of §9 need (the pause, the retirement, the
// waivers, and where each running module was placed, for `state`). Each
// kind of record it keeps across events has a cap (limits.go), and a
// record is dropped only past it, oldest first, never because a want
// stopped naming its module or file (DESIGN.md §4, "Bounded by counts"):
// the state is bounded by those caps, never by the count of events.
//
// A State is not safe for concurrent use. Its JSON form (encoding/json),
// with a format version ([MarshalState], [SnapshotFormat]), is the
// snapshot format; decoding a snapshot and folding the rest gives the
// same state and effects as folding everything (DESIGN.md §5.1).
type State struct {
	Node string `json:"node"`
	// Seq is the last stream sequence folded.
	// Invariant: every sequence recorded in the state is ≤ Seq.
	Seq uint64 `json:"seq"`
	// Want is the newest want; nil before the first.
	Want *WantRecord `json:"want,omitempty"`
	// Have is the newest have; nil before the first.
	Have *HaveRecord `json:"have,omitempty"`
	// Settled is the newest settled plan: the settled plan with the highest
	// sequence; nil while none has settled.
	Settled *PlanRecord `json:"settled,omitempty"`
	// Unsettled are the plans emitted after Settled, in emission order.
	// The last of them, or Settled when there is none, is the last plan
	// emitted.
	// Invariant: bound records (Seq > 0) come first, with increasing
	// sequences above Settled.Seq; unbound ones (Seq == 0) follow; at
	// most MaxUnsettled.
	Unsettled []*PlanRecord `json:"unsettled,omitempty"`
	// Dropped holds the sequences of the newest plan events (at most
	// MaxDroppedPlans) whose unsettled records the cap dropped after the
	// events were read, above the newest plan the node settled: a settle
	// naming one is of a plan the node applied before a newer one, which
	// it applies next (issue 25).
	// Invariant: sorted, unique; each above Settled.Seq and at most
	// NewestPlan; at most MaxDroppedPlans.
	Dropped []uint64 `json:"dropped,omitempty"`
	// NewestPlan is the sequence of the newest plan event folded. A settle,
	// refusal or filled that names a newer plan names one that does not
	// exist yet and is not folded (DESIGN.md §3).
	// Invariant: NewestPlan ≥ Settled.Seq.
	NewestPlan uint64 `json:"newest_plan,omitempty"`
	// Accepting holds, for each (module, path, account), the newest settled
	// plan that accepts such a write under the judge rule.
	// Invariant: sorted by module, path, account; unique; at most
	// MaxAccepting.
	Accepting []Accepting `json:"accepting,omitempty"`
	// Filled holds the newest filled plan per (module, path).
	// Invariant: sorted by module, path; unique; at most MaxFilled.
	Filled []FilledMark `json:"filled,omitempty"`
	// Approvals are kept per (module, build) whenever they arrive and are
	// never used up; only past MaxModuleApprovals or MaxApprovals is the
	// oldest dropped.
	// Invariant: sorted by module, build; unique; at most MaxApprovals.
	Approvals []Approval `json:"approvals,omitempty"`
	// Gates are the modules that move to a new build on this node only
	// with an operator's approval, whatever the newest want says
	// (DESIGN.md §4, "the gate"): each set by the first want of this
	// build's writers (events.Want.Gates) that marked the module
	// requires_approval, or by an operator's gate, and lifted
	// only by an operator's gate with lift. A want without the flag, a
	// want that drops the module, a retire: none lifts it (a fresh user's
	// finding M7: the controller, which writes the want, could lift it).
	// Past MaxGates a new gate is not kept; none is ever dropped.
	// Invariant: sorted by module; unique; at most MaxGates.
	Gates []GateRecord `json:"gates,omitempty"`
	// GatesFull, set when a gate was not kept for want of room (a want's
	// first requires_approval of a module, or an operator's gate, while
	// the node had MaxGates gates), holds every module of the node for
	// an approval of its build, gated or not (Hold, composeRow): fail
	// closed, since the module whose gate was not kept would otherwise
	// move without one as soon as a want left its flag out (a
	// controller that filled the gates with modules of no use could do
	// just that). It ends once every module whose gate was not kept is
	// gated after all (room made with an operator's ungate) or ungated by
	// an operator (GatesFull.Modules); past the list's bound, only with
	// an operator's gate kept. Nil otherwise.
	GatesFull *GatesFull `json:"gates_full,omitempty"`
	// Owed are the unpaid owed items.
	// Invariant: sorted by module, path, plan, writer; unique by those;
	// at most MaxOwed.
	Owed []Item `json:"owed,omitempty"`
	// AccountJournaled is set while the "plan names no provisioner account
	// while what runs names one" condition holds and has been journaled
	// (incident 3); it clears with the condition.
	AccountJournaled bool `json:"account_journaled,omitempty"`
	// LastKnock describes the last knock emitted; introspection only.
	LastKnock *KnockRecord `json:"last_knock,omitempty"`

	// The operator events of DESIGN.md §9.

	// Paused is the pause in force, nil when none: no plan is emitted
	// while it holds (wants and approvals still fold; knocks still flow).
	Paused *PauseRecord `json:"paused,omitempty"`
	// Retire is the node's retirement, nil when it is not retiring: its
	// plan is empty; Retired once that plan settled (or at once when
	// forced). A later want clears it.
	// Invariant: while set, nothing is owed and the last plan emitted, if
	// any, has no row.
	Retire *RetireRecord `json:"retire,omitempty"`
	// Waivers record, per (module, path), the newest plan a waive covered:
	// a refusal of that file judged by that plan or an older one is owed
	// nothing. A module removed from the want drops its waivers.
	// Invariant: sorted by module, path; unique.
	Waivers []Waiver `json:"waivers,omitempty"`
	// Placed records, for each file the newest settled plan declares for a
	// module it runs, the settled plan since which it has been declared so
	// (its module placed, or the file added) and when that plan settled
	// (stream time): what `meshfold state` needs to tell a file never
	// filled since.
	// Invariant: sorted by module, path; unique; every plan ≤ Settled.Seq.
	Placed []Placement `json:"placed,omitempty"`
	// Failed holds, per module ("" for a whole plan an agent refused),
	// the newest failed settle of a plan newer than the settled one, or
	// of the settled plan itself (an agent that lost its state re-applied
	// it and failed: what runs does not hold it): why the node is
	// unsettled or not running what it settled, for `state`, `fleet` and
	// the console. A settle of its plan or a newer one clears it, and so
	// does a want that no longer names its module.
	// Invariant: sorted by module; unique; at most MaxFailed; every plan
	// at or above Settled.Seq.
	Failed []FailedApply `json:"failed,omitempty"`

	// Missing records the declared files the node's agent reported
	// missing on the node (events.Have.Missing: in place before, gone
	// now), each with the have that first reported it since it was last
	// in place: a file newly reported knocks once (folder.missing), and
	// `state` and `fleet` say a refill was asked until it is back. A
	// filled of it, a have that no longer reports it, a settled plan that
	// no longer declares it, and a retire clear it.
	// Invariant: sorted by module, path; unique; each a file of the
	// settled plan; Seq ≤ Seq. Bounded by the settled plan's files.
	Missing []MissingFile `json:"missing,omitempty"`

	// Noisy is the node's newest noisy episode (noisy.go; a tester's
	// finding M6): nil before the first, kept until a later one replaces
	// it; `fleet` flags it for NoisyShow after its last event.
	// Invariant: every sequence ≤ Seq.
	Noisy *NoisyRecord `json:"noisy,omitempty"`

	// Crashes records, per module of the newest have, the stream times
	// of its last FlapRestarts crashes after running at the build that
	// have runs it at (a have saying it failed, or running with more
	// restarts, after one saying it ran at the same build): what tells a
	// module that flaps from one that recovered (DESIGN.md §11). Another
	// build starts with none.
	// Invariant: sorted by module; unique; each at most FlapRestarts
	// times, oldest first; only modules of the newest have, each at its
	// build there (or "").
	Crashes []Crashes `json:"crashes,omitempty"`

	// Agent is what is known of the node's agent (DESIGN.md §11
	// "Liveness"): the newest agent event, or the first have after a
	// down (a restarted agent is up on its first have); nil before
	// either.
	// Invariant: Agent.Seq ≤ Seq.
	Agent *AgentRecord `json:"agent,omitempty"`

	// AgentWas is the claim of the agent recorded down before a have
	// brought the agent back (Agent up with no claim yet), until the up
	// that names the new claim: the agent back knocks then only if that
	// claim is another one (folder.agentBack). Empty otherwise, and in a
	// state of a build that knocked at that have already.
	AgentWas string `json:"agent_was,omitempty"`

	// StartKnocked is the claim of the agent whose start knocked
	// already: at its up (agentBack) or at its first have that reported
	// a file gone at its start (events.MissingFile.AtStart), whichever
	// was folded first; the other knocks nothing (folder.startKnock).
	// Empty before the first such knock.
	StartKnocked string `json:"start_knocked,omitempty"`

	// Provisioner is what is known of the node's provisioner client: the
	// newest prov event (its lease claimed, ended or taken over, as the
	// reconciler records it); nil before the first. Unlike the agent, no
	// other event brings it back up: only its lease says it is alive.
	// Invariant: Provisioner.Seq ≤ Seq.
	Provisioner *AgentRecord `json:"provisioner,omitempty"`

	// Ack is the operator's acknowledgement of the node's journal
	// warnings that covers the most (issue 25): entries stored at or
	// before Ack.Upto were read and no longer flag the node; `fleet`
	// and the console count them apart. One record, whatever the count of
	// acks; nil before the first.
	// Invariant: Ack.Upto ≤ Ack.Seq ≤ Seq.
	Ack *AckRecord `json:"ack,omitempty"`

	// caps are the state's caps; nil is the constants of limits.go. Only
	// a test sets them (an unbounded fold to compare with); a snapshot
	// does not carry them.
	caps *caps
	// traffic counts the node's own events of the current window of
	// stream time (noisy.go). It is not part of the state's JSON, so not
	// of its snapshot nor of its equality: a state folded from a stream
	// written before the rule existed is the same state, and counting an
	// event changes nothing stored but the episode it may start. A state
	// decoded from a snapshot starts with an empty window
	// (docs/architecture.md, "The noisy rule's window is not in the
	// snapshot").
	traffic trafficWindow
}

// PauseRecord is the pause in force: the pause event's sequence, stream
// time, who paused and why.
type PauseRecord struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
}

// RetireRecord is a node's retirement: the retire event (sequence, stream
// time, who, forced or not), and, once Retired, the event that completed it
// (the settle of the empty plan, or the retire itself when forced or when
// nothing was ever planned).
type RetireRecord struct {
	Seq         uint64    `json:"seq"`
	Time        time.Time `json:"time"`
	By          string    `json:"by"`
	Force       bool      `json:"force,omitempty"`
	Retired     bool      `json:"retired,omitempty"`
	RetiredSeq  uint64    `json:"retired_seq,omitempty"`
	RetiredTime time.Time `json:"retired_time,omitzero"`
}

// GateRecord is the gate of Module: the event that set it (a want, or an
// operator's gate) and, for an operator's, who. By is empty when a want
// set it. An operator's reason stays in the stream, for the audit.
type GateRecord struct {
	Module string `json:"module"`
	Seq    uint64 `json:"seq"`
	By     string `json:"by,omitempty"`
	// Dropped is the want that dropped the gated module (the want
	// before it named the module), while no want since names it again;
	// 0 otherwise. While a gate is dropped, every module of the node is
	// held for an approval of a new build (composeRow): the gate holds
	// the workload, not only its name, or a want could ship it unapproved
	// under another name (a fresh user's finding M2).
	Dropped uint64 `json:"dropped,omitempty"`
}

// droppedGate returns the first gate whose module a want dropped
// (GateRecord.Dropped), and false when none is.
func (s *State) droppedGate() (GateRecord, bool) {
	for _, g := range s.Gates {
		if g.Dropped != 0 {
			return g, true
		}
	}
	return GateRecord{}, false
}

// DroppedGate is droppedGate, for the audit: the gate whose module a
// want dropped, which holds every module of the node.
func (s *State) DroppedGate() (GateRecord, bool) { return s.droppedGate() }

// GatesFull records the gates a node could not keep (State.GatesFull):
// since event Seq (the first gate not kept; an operator's when By is
// set, else a want's), Modules are the modules whose gate was not kept
// and that are neither gated since nor ungated by an operator, sorted,
// at most MaxModules; Unnamed counts those past that bound, whose names
// only the journal's warnings keep.
type GatesFull struct {
	Seq     uint64   `json:"seq"`
	By      string   `json:"by,omitempty"`
	Modules []string `json:"modules,omitempty"`
	Unnamed int      `json:"unnamed,omitempty"`
}

// Waiver records a waive of Module's file at Path: refusals of it judged by
// Plan or an older plan are owed nothing. Seq and By are the newest waive's.
type Waiver struct {
	Module string `json:"module"`
	Path   string `json:"path"`
	Plan   uint64 `json:"plan"`
	By     string `json:"by"`
	Seq    uint64 `json:"seq"`
}

// Placement is the settled plan since which Module's file Path has been
// declared for it running, and the sequence and stream time of that plan's
// first settle; all zero when it was declared before the state recorded
// placements (a snapshot older than the field).
type Placement struct {
	Module string    `json:"module"`
	Path   string    `json:"path"`
	Plan   uint64    `json:"plan"`
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
}

// FailedApply is the newest failed settle of Module: the plan whose apply
// failed, the settle's sequence and stream time, and its error as
// events.ErrorText tells it, safe to print (DESIGN.md §10: never quoted at
// full length, control characters escaped; the whole error stays in the
// stream for audit).
type FailedApply struct {
	Module string    `json:"module"`
	Plan   uint64    `json:"plan"`
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Error  string    `json:"error,omitempty"`
}

func compareFailed(a, b FailedApply) int { return cmp.Compare(a.Module, b.Module) }

// MissingFile is a declared file of Module at Path that the node's agent
// reported missing on the node: Seq and Time are the have that first
// reported it since it was last in place, the one whose knock asked for
// its refill (none for a retiring node, or when that have knocked for
// owed items already: that knock's fill covers it).
// AtStart: the first report said the file was gone at the start of the
// agent (events.MissingFile.AtStart): a reboot or re-image emptied /run.
type MissingFile struct {
	Module  string    `json:"module"`
	Path    string    `json:"path"`
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	AtStart bool      `json:"at_start,omitempty"`
}

func compareMissing(a, b MissingFile) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path))
}

// Crashes are the stream times of Module's last crashes after running,
// at Build: the build the newest have runs it at, the one that crashed
// ("" in a snapshot written before the field: of the have's build).
type Crashes struct {
	Module string      `json:"module"`
	Build  string      `json:"build,omitempty"`
	Times  []time.Time `json:"times"`
}

// AgentRecord is the node's agent as the newest agent event (or the
// first have after a down) says: up or down since the event at Seq, at
// stream time Time. Claim, Host and PID are the lease claim the agent
// event named (a have names none); Why says how a down claim ended.
type AgentRecord struct {
	Up    bool            `json:"up"`
	Seq   uint64          `json:"seq"`
	Time  time.Time       `json:"time"`
	Claim string          `json:"claim,omitempty"`
	Host  string          `json:"host,omitempty"`
	PID   int             `json:"pid,omitempty"`
	Why   events.AgentWhy `json:"why,omitempty"`
}

// AckRecord is the ack event at Seq (stream time Time) by By: the
// node's journal warnings stored at or before stream sequence Upto are
// acknowledged.
type AckRecord struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	By   string    `json:"by"`
	Upto uint64    `json:"upto"`
}

// Acked reports whether the journal entry at stream sequence seq is
// acknowledged by a (false for a nil a).
func (a *AckRecord) Acked(seq uint64) bool { return a != nil && seq <= a.Upto }

// WantRecord is a folded want.
type WantRecord struct {
	Seq     uint64              `json:"seq"`
	Modules []events.WantModule `json:"modules"`
}

// HaveRecord is a folded have.
type HaveRecord struct {
	Seq uint64 `json:"seq"`
	// Time is the stream's time of the have, for staleness.
	Time    time.Time           `json:"time"`
	Modules []events.HaveModule `json:"modules"`
	// HealthSince[i] is the stream time of the first have since which
	// Modules[i]'s health has said what it says (zero: no health, or
	// unknown in a snapshot older than the field); empty when no module
	// reports health.
	// Invariant: empty or as long as Modules.
	HealthSince []time.Time `json:"health_since,omitempty"`
}

// PlanRecord is a plan this reconciler emitted.
type PlanRecord struct {
	// Seq is the plan event's stream sequence; 0 until that event is folded.
	Seq uint64 `json:"seq"`
	// Cause and Want are as in events.Plan.
	Cause   uint64              `json:"cause"`
	Want    uint64              `json:"want"`
	Account string              `json:"account,omitempty"`
	Modules []events.PlanModule `json:"modules"`
	// Again marks a plan published again because the node's agent refused
	// the one before it for its signer ([folder.resign]), or started
	// holding no plan ([folder.planAgain]): a refusal of this one is not
	// answered again, nor another have of no plan while it is unsettled. Unknown to older builds, which have no
	// such answer (no new snapshot format).
	Again bool `json:"again,omitempty"`
}

// Row returns the plan's row for module name, or nil.
func (p *PlanRecord) Row(name string) *events.PlanModule {
	for i := range p.Modules {
		if p.Modules[i].Name == name {
			return &p.Modules[i]
		}
	}
	return nil
}

// Accepting records the newest settled plan that accepts writes of Path
// for Module from Account.
type Accepting struct {
	Module  string `json:"module"`
	Path    string `json:"path"`
	Account string `json:"account"`
	Plan    uint64 `json:"plan"`
}

// FilledMark records the newest plan a file was filled under, and Claim,
// the claim of the agent that wrote the newest filled of it folded
// (events.Filled.Claim; empty from older agents): a report of the file
// gone at that agent's start came from a look before that write
// (folder.missing).
type FilledMark struct {
	Module string `json:"module"`
	Path   string `json:"path"`
	Plan   uint64 `json:"plan"`
	Claim  string `json:"claim,omitempty"`
}

// Approval is an operator's yes for Module at Build; Seq and By are the
// first approval's.
type Approval struct {
	Module string `json:"module"`
	Build  string `json:"build"`
	By     string `json:"by"`
	Seq    uint64 `json:"seq"`
}

// Item is an owed item, and the sequence and stream time of the refusal
// that made it (Time is zero in a snapshot older than the field).
type Item struct {
	events.Owed
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time,omitzero"`
	// Why is the refusal's error (a write-failed's cause: a symlink
	// escaping the root, a read-only file system) as events.ErrorText
	// tells it, safe to print; empty when the node gave none.
	Why string `json:"why,omitempty"`
}

// KnockRecord describes a knock the fold emitted.
type KnockRecord struct {
	Cause   uint64               `json:"cause"`
	Reasons []events.KnockReason `json:"reasons"`
	Owed    []events.Owed        `json:"owed"`
}

// NewState returns the empty state of node.
func NewState(node string) *State { return &State{Node: node} }

// Emitted returns the last plan emitted, or nil before the first.
func (s *State) Emitted() *PlanRecord {
	if n := len(s.Unsettled); n > 0 {
		return s.Unsettled[n-1]
	}
	return s.Settled
}

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
	c.caps = s.caps
	c.traffic = s.traffic
	return c
}

// SnapshotFormat is the format of the snapshots this build writes
// ([MarshalState]) and the newest it reads: a snapshot is a State's JSON
// with a "format" field. A snapshot of an older format is migrated as
// [UnmarshalState] reads it; one of a newer format is refused, so that a
// reconciler rolled back behind its snapshots refolds those nodes from the
// stream instead of folding on from a state it half understands
// (docs/operations.md, "Upgrading").
//
// Formats: 0, every snapshot written before the field existed (issue
// 28); 1, format 0's fields with "format": 1; 2, format 1's fields, whose
// Failed may hold a failed apply of the settled plan itself (a failed
// re-apply), which a format-1 reader's invariants refused ("not above the
// settled plan"): a rolled-back reconciler's session failed on it. A
// change to State's JSON that an older build would read wrongly (a field
// renamed, retyped or given a new meaning) is a new format with a
// migration in snapshotMigrations; a field added with omitempty that
// older builds may ignore is not.
//
// A state is written in the oldest format that holds it (stateFormat):
// format 1 unless it holds what format 2 added, so that a build rolled
// back refolds from the stream only the nodes it would misread, and reads
// every other snapshot as before.
const SnapshotFormat = 2

// ErrSnapshotNewer: a snapshot's format is newer than this build's
// [SnapshotFormat]; a newer build wrote it.
var ErrSnapshotNewer = errors.New("reconcile: snapshot written by a newer build")

// snapshotMigrations[v] turns a state decoded from a format-v snapshot into
// one of format v+1.
var snapshotMigrations = [SnapshotFormat]func(*State) error{
	// 0 → 1: the same fields; only the format field is new.
	0: func(*State) error { return nil },
	// 1 → 2: the same fields; a format-1 state holds no failed apply of
	// its settled plan.
	1: func(*State) error { return nil },
}

// stateFormat is the format s is written in ([MarshalState], its
// summary): the oldest that holds it. 2 when s holds a failed apply of
// its settled plan (the one thing format 2 added), else 1. The one place
// that decides which snapshots an older build refuses (ErrSnapshotNewer)
// rather than misreads.
func stateFormat(s *State) int {
	if s.Settled != nil {
		for _, fa := range s.Failed {
			if fa.Plan == s.Settled.Seq {
				return 2
			}
		}
	}
	return 1
}

// formatPrefix starts every snapshot [MarshalState] writes; the format's
// digits follow.
const formatPrefix = `{"format":`

// AppendState is [MarshalState] appending to dst: the same bytes, without
// a buffer of their own (a checkpoint encodes every changed node's state
// into one). On error it returns dst unchanged.
func AppendState(dst []byte, s *State) ([]byte, error) {
	start := len(dst)
	dst = append(dst, formatPrefix...)
	dst = strconv.AppendInt(dst, int64(stateFormat(s)), 10)
	dst = append(dst, ',')
	mark := len(dst)
	out, err := json.Append(dst, s, json.EscapeHTML|json.SortMapKeys) // json.Marshal's flags
	if err != nil {
		return dst[:start], err
	}
	// A State encodes as an object whose first field is its node: its
	// opening brace goes, the format field has opened the object.
	return append(out[:mark], out[mark+1:]...), nil
}

// MarshalState encodes s as a snapshot: its JSON form with "format"
// first, the oldest format that holds s (at most [SnapshotFormat]).
func MarshalState(s *State) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	// A State encodes as an object whose first field is its node.
	out := make([]byte, 0, len(b)+len(formatPrefix)+4)
	out = append(out, formatPrefix...)
	out = strconv.AppendInt(out, int64(stateFormat(s)), 10)
	out = append(out, ',')
	return append(out, b[1:]...), nil
}

// snapshotFormat returns data's format: read from the prefix MarshalState
// writes, otherwise from a "format" field anywhere (0 when there is none).
func snapshotFormat(data []byte) (int, error) {
	if rest, ok := bytes.CutPrefix(data, []byte(formatPrefix)); ok {
		if i := bytes.IndexByte(rest, ','); i > 0 {
			if v, err := strconv.Atoi(string(rest[:i])); err == nil {
				return v, nil
			}
		}
	}
	var f struct {
		Format int `json:"format"`
	}
	err := json.Unmarshal(data, &f)
	return f.Format, err
}

// UnmarshalState decodes a snapshot, migrating it from an older format
// (format 0: no format field), and checks its invariants.
//
// Errors: one wrapping [ErrSnapshotNewer], naming both formats, for a
// snapshot of a format newer than [SnapshotFormat]; a decode or
// invariant error otherwise.
func UnmarshalState(data []byte) (*State, error) {
	return decodeState(data, false)
}

// decodeState is [UnmarshalState]; shared: strings share data's memory
// ([UnmarshalStateShared]).
func decodeState(data []byte, shared bool) (*State, error) {
	format, ferr := snapshotFormat(data)
	switch {
	case format > SnapshotFormat:
		// Before decoding: a newer format may have changed a field's
		// shape.
		return nil, newerSnapshot(format)
	case format < 0:
		return nil, fmt.Errorf("reconcile: decode state: snapshot format %d", format)
	}
	s := new(State)
	var err error
	if shared {
		_, err = json.Parse(data, s, json.ZeroCopy)
	} else {
		err = json.Unmarshal(data, s)
	}
	if err != nil {
		return nil, fmt.Errorf("reconcile: decode state: %w", err)
	}
	if ferr != nil {
		return nil, fmt.Errorf("reconcile: decode state: format: %w", ferr)
	}
	for v := format; v < SnapshotFormat; v++ {
		if err := snapshotMigrations[v](s); err != nil {
			return nil, fmt.Errorf("reconcile: migrate snapshot of %s from format %d to %d: %w", s.Node, v, v+1, err)
		}
	}
	if err := s.CheckInvariants(); err != nil {
		return nil, fmt.Errorf("reconcile: decode state: %w", err)
	}
	return s, nil
}

func newerSnapshot(format int) error {
	return fmt.Errorf("%w: snapshot format %d, this build reads formats 0 to %d", ErrSnapshotNewer, format, SnapshotFormat)
}

// UnmarshalStateShared is [UnmarshalState] for a reader that reads many
// states once and keeps the bytes anyway (`meshfold fleet`): the state's
// strings share data's memory instead of copying it (a quarter of the
// allocations), so data must not change while the state is in use.
//
// Errors: as [UnmarshalState].
func UnmarshalStateShared(data []byte) (*State, error) {
	return decodeState(data, true)
}

// CheckInvariants returns an error describing the first invariant of the
// state that does not hold. Tests call it after every step.
func (s *State) CheckInvariants() error {
	maxSeq := func(name string, seq uint64) error {
		if seq > s.Seq {
			return fmt.Errorf("%s sequence %d above the folded sequence %d", name, seq, s.Seq)
		}
		return nil
	}
	if s.Want != nil {
		if err := maxSeq("want", s.Want.Seq); err != nil {
			return err
		}
	}
	if s.Have != nil {
		if err := maxSeq("have", s.Have.Seq); err != nil {
			return err
		}
		if n := len(s.Have.HealthSince); n != 0 && n != len(s.Have.Modules) {
			return fmt.Errorf("have health_since: %d times for %d modules", n, len(s.Have.Modules))
		}
	}
	if s.Agent != nil {
		if err := maxSeq("agent", s.Agent.Seq); err != nil {
			return err
		}
	}
	if s.Provisioner != nil {
		if err := maxSeq("provisioner", s.Provisioner.Seq); err != nil {
			return err
		}
	}
	if a := s.Ack; a != nil {
		if err := maxSeq("ack", a.Seq); err != nil {
			return err
		}
		if a.Upto > a.Seq {
			return fmt.Errorf("ack %d acknowledges up to %d, above itself", a.Seq, a.Upto)
		}
	}
	for i, c := range s.Crashes {
		if len(c.Times) == 0 || len(c.Times) > FlapRestarts || i > 0 && s.Crashes[i-1].Module >= c.Module {
			return fmt.Errorf("crashes of %q: %d times, or not sorted and unique", c.Module, len(c.Times))
		}
		if c.Build != "" && (s.Have == nil || !slices.ContainsFunc(s.Have.Modules, func(m events.HaveModule) bool {
			return m.Name == c.Module && m.Build == c.Build
		})) {
			return fmt.Errorf("crashes of %q at build %s: the newest have does not run it at that build", c.Module, c.Build)
		}
	}
	if !sortedUnique(s.Missing, compareMissing) {
		return fmt.Errorf("missing files not sorted and unique")
	}
	for _, m := range s.Missing {
		if err := maxSeq("missing file", m.Seq); err != nil {
			return err
		}
		if !s.settledDeclares(m.Module, m.Path) {
			return fmt.Errorf("missing file %s of %q: not a file of the settled plan", m.Path, m.Module)
		}
	}
	if err := maxSeq("newest plan", s.NewestPlan); err != nil {
		return err
	}
	var floor uint64
	if s.Settled != nil {
		if s.Settled.Seq == 0 {
			return fmt.Errorf("settled plan has no sequence")
		}
		if s.NewestPlan < s.Settled.Seq {
			return fmt.Errorf("newest plan %d below settled plan %d", s.NewestPlan, s.Settled.Seq)
		}
		floor = s.Settled.Seq
	}
	lim := s.limits()
	for _, c := range []struct {
		what   string
		n, max int
	}{
		{"unsettled plans", len(s.Unsettled), lim.unsettled},
		{"owed items", len(s.Owed), lim.owed},
		{"approvals", len(s.Approvals), lim.approvals},
		{"accepting records", len(s.Accepting), lim.accepting},
		{"filled marks", len(s.Filled), lim.filled},
	} {
		if c.n > c.max {
			return fmt.Errorf("%d %s, above the cap of %d", c.n, c.what, c.max)
		}
	}
	unbound := false
	for _, p := range s.Unsettled {
		switch {
		case p.Seq == 0:
			unbound = true
		case unbound:
			return fmt.Errorf("bound plan %d after an unbound one", p.Seq)
		case p.Seq <= floor:
			return fmt.Errorf("unsettled plan %d not above %d", p.Seq, floor)
		case p.Seq > s.NewestPlan:
			return fmt.Errorf("unsettled plan %d above the newest plan event %d", p.Seq, s.NewestPlan)
		default:
			floor = p.Seq
		}
	}
	if len(s.Dropped) > MaxDroppedPlans || !sortedUnique(s.Dropped, cmp.Compare[uint64]) {
		return fmt.Errorf("dropped plans %v: not sorted and unique, or more than %d", s.Dropped, MaxDroppedPlans)
	}
	for _, seq := range s.Dropped {
		if seq > s.NewestPlan || s.Settled != nil && seq <= s.Settled.Seq {
			return fmt.Errorf("dropped plan %d not above the settled plan, or above the newest plan event %d", seq, s.NewestPlan)
		}
	}
	if !sortedUnique(s.Accepting, compareAccepting) {
		return fmt.Errorf("accepting not sorted and unique")
	}
	for _, a := range s.Accepting {
		if s.Settled == nil || a.Plan > s.Settled.Seq {
			return fmt.Errorf("accepting plan %d above the settled plan", a.Plan)
		}
	}
	if !sortedUnique(s.Filled, compareFilled) {
		return fmt.Errorf("filled marks not sorted and unique")
	}
	if !sortedUnique(s.Approvals, compareApproval) {
		return fmt.Errorf("approvals not sorted and unique")
	}
	if !sortedUnique(s.Owed, compareItem) {
		return fmt.Errorf("owed items not sorted and unique")
	}
	for _, it := range s.Owed {
		if err := maxSeq("owed item", it.Seq); err != nil {
			return err
		}
	}
	if s.Paused != nil {
		if err := maxSeq("pause", s.Paused.Seq); err != nil {
			return err
		}
	}
	if r := s.Retire; r != nil {
		if err := maxSeq("retire", max(r.Seq, r.RetiredSeq)); err != nil {
			return err
		}
		if len(s.Owed) > 0 {
			return fmt.Errorf("retiring node owes %d items", len(s.Owed))
		}
		if e := s.Emitted(); e != nil && len(e.Modules) > 0 {
			return fmt.Errorf("retiring node's last plan has %d rows", len(e.Modules))
		}
		if r.Retired != (r.RetiredSeq != 0) {
			return fmt.Errorf("retirement done=%v at sequence %d", r.Retired, r.RetiredSeq)
		}
	}
	if !sortedUnique(s.Waivers, compareWaiver) {
		return fmt.Errorf("waivers not sorted and unique")
	}
	if !sortedUnique(s.Gates, compareGate) || len(s.Gates) > MaxGates {
		return fmt.Errorf("gates not sorted and unique, or more than %d", MaxGates)
	}
	for _, g := range s.Gates {
		if err := maxSeq("gate", g.Seq); err != nil {
			return err
		}
	}
	if g := s.GatesFull; g != nil {
		if err := maxSeq("gates full", g.Seq); err != nil {
			return err
		}
		if !slices.IsSorted(g.Modules) || len(slices.Compact(slices.Clone(g.Modules))) != len(g.Modules) || len(g.Modules) > events.MaxModules || len(g.Modules)+g.Unnamed == 0 {
			return fmt.Errorf("gates full: modules %v not sorted and unique, or more than %d, or none lost (%d unnamed)", g.Modules, events.MaxModules, g.Unnamed)
		}
	}
	for _, w := range s.Waivers {
		if err := maxSeq("waiver", w.Seq); err != nil {
			return err
		}
	}
	if !sortedUnique(s.Failed, compareFailed) || len(s.Failed) > MaxFailed {
		return fmt.Errorf("failed applies not sorted and unique, or more than %d", MaxFailed)
	}
	for _, fa := range s.Failed {
		if s.Settled != nil && fa.Plan < s.Settled.Seq {
			return fmt.Errorf("failed apply of %q at plan %d below the settled plan", fa.Module, fa.Plan)
		}
		if err := maxSeq("failed apply", fa.Seq); err != nil {
			return err
		}
	}
	if !sortedUnique(s.Placed, comparePlacement) {
		return fmt.Errorf("placements not sorted and unique")
	}
	for _, p := range s.Placed {
		if s.Settled == nil || p.Plan > s.Settled.Seq {
			return fmt.Errorf("placement of %s %s at plan %d above the settled plan", p.Module, p.Path, p.Plan)
		}
		if err := maxSeq("placement", p.Seq); err != nil {
			return err
		}
	}
	if n := s.Noisy; n != nil {
		if n.SinceSeq > n.Seq || n.Seq > n.LastSeq || n.Last.Before(n.Since) {
			return fmt.Errorf("noisy episode from #%d (window from #%d) through #%d out of order", n.Seq, n.SinceSeq, n.LastSeq)
		}
		if err := maxSeq("noisy episode", n.LastSeq); err != nil {
			return err
		}
	}
	return nil
}

func compareGate(a, b GateRecord) int { return cmp.Compare(a.Module, b.Module) }

func compareWaiver(a, b Waiver) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path))
}

func comparePlacement(a, b Placement) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path))
}

func sortedUnique[T any](xs []T, c func(a, b T) int) bool {
	for i := 1; i < len(xs); i++ {
		if c(xs[i-1], xs[i]) >= 0 {
			return false
		}
	}
	return true
}

func compareOwed(a, b events.Owed) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path),
		cmp.Compare(a.Plan, b.Plan), cmp.Compare(a.Writer, b.Writer))
}

func compareItem(a, b Item) int { return compareOwed(a.Owed, b.Owed) }

func compareAccepting(a, b Accepting) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path), cmp.Compare(a.Account, b.Account))
}

func compareFilled(a, b FilledMark) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Path, b.Path))
}

func compareApproval(a, b Approval) int {
	return cmp.Or(cmp.Compare(a.Module, b.Module), cmp.Compare(a.Build, b.Build))
}

// upsert inserts x into the sorted slice xs, or, when an element compares
// equal, lets keep decide whether to replace it. It returns the new slice.
func upsert[T any](xs []T, x T, c func(a, b T) int, replace func(old T) bool) []T {
	i, found := slices.BinarySearchFunc(xs, x, c)
	if found {
		if replace(xs[i]) {
			xs[i] = x
		}
		return xs
	}
	return slices.Insert(xs, i, x)
}

// declares reports whether files holds path.
func declares(files []events.File, path string) bool {
	return slices.ContainsFunc(files, func(f events.File) bool { return f.Path == path })
}
