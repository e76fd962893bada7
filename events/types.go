package events

import (
	"slices"
	"time"
)

// Version is the schema version this build writes and the newest it
// understands. An event with a larger `v` is reported with [ErrNewerVersion]
// and never guessed at.
const Version = 1

// Kind names an event kind; it is the last token of the event's subject.
type Kind string

// The event kinds of DESIGN.md §3.
const (
	KindWant    Kind = "want"    // controller: what the node should run
	KindApprove Kind = "approve" // operator: yes for one module at one build
	KindHave    Kind = "have"    // node: what runs
	KindSettle  Kind = "settle"  // node: an apply or removal settled (or failed)
	KindRefusal Kind = "refusal" // node: a filled-file write it refused or failed
	KindFilled  Kind = "filled"  // node: a filled-file write it made
	KindPlan    Kind = "plan"    // reconciler: the node's composition
	KindKnock   Kind = "knock"   // reconciler: fill this node again
	KindJournal Kind = "journal" // reconciler: a note about the node

	// Operator events (DESIGN.md §9).
	KindPause  Kind = "pause"  // operator: emit no new plan for the node
	KindResume Kind = "resume" // operator: end a pause
	KindPoke   Kind = "poke"   // operator: knock, so the provisioner fills again
	KindRevoke Kind = "revoke" // operator: take an approval back
	KindWaive  Kind = "waive"  // operator: pay a file's owed items without a knock
	KindRetire Kind = "retire" // operator: remove every module, then forget the node
	KindAck    Kind = "ack"    // operator: the node's warnings up to a sequence were read
	KindGate   Kind = "gate"   // operator: a module needs (or, lifted, no longer needs) an approval

	// KindAgent (agent.go): reconciler: the node's agent went down or came
	// back (DESIGN.md §11).
	// KindProv (agent.go): reconciler: the node's provisioner client went
	// down or came back.
)

// Kinds lists every event kind in a fixed order. Fill requests travel on a
// subject of their own (see [Subjects.Fill]) and are not an event kind: no
// stream ever captures them.
var Kinds = []Kind{KindWant, KindApprove, KindHave, KindSettle, KindRefusal, KindFilled, KindPlan, KindKnock, KindJournal,
	KindPause, KindResume, KindPoke, KindRevoke, KindWaive, KindRetire, KindAgent, KindAck, KindProv, KindGate}

// InputKinds are the kinds the reconciler folds: everything published by
// controllers, operators and nodes, its own plans (DESIGN.md §3: it folds
// its plan events to learn each plan's sequence) and the agent and
// provisioner transitions it records (DESIGN.md §11).
var InputKinds = []Kind{KindWant, KindApprove, KindHave, KindSettle, KindRefusal, KindFilled, KindPlan,
	KindPause, KindResume, KindPoke, KindRevoke, KindWaive, KindRetire, KindAgent, KindAck, KindProv, KindGate}

// OperatorKinds are the kinds only an operator publishes: the approval,
// the operator events of DESIGN.md §9 and the acknowledgement of a
// node's warnings (issue 25), and the gate of a module (a fresh user's
// finding M7: only an operator lifts an approval gate).
var OperatorKinds = []Kind{KindApprove, KindPause, KindResume, KindPoke, KindRevoke, KindWaive, KindRetire, KindAck, KindGate}

// Known reports whether k is one of [Kinds].
func (k Kind) Known() bool { return slices.Contains(Kinds, k) }

// Header is embedded in every payload.
type Header struct {
	// V is the schema version; required, 1 today.
	V int `json:"v"`
	// At is the publisher's clock in UTC: informational only. Order and
	// audit times come from the stream. An effect copies the At of the
	// event that caused it.
	At time.Time `json:"at"`
}

func (h *Header) header() *Header { return h }

// Payload is implemented by the pointer of every event type of this
// package: *Want, *Approve, *Have, *Settle, *Refusal, *Filled, *Plan,
// *Knock, *Journal, the operator events *Pause, *Resume, *Poke,
// *Revoke, *Waive, *Retire and *Gate, *Agent, *Ack and *Prov.
type Payload interface {
	// Kind is the payload's event kind.
	Kind() Kind
	// Validate checks the payload against DESIGN.md §3. It returns nil or
	// a *FieldError naming the field that failed; errors.Is(err,
	// ErrInvalid) holds for all of them.
	Validate() error
	header() *Header
}

// HeaderOf returns the payload's header, for reading or setting v and at.
func HeaderOf(p Payload) *Header { return p.header() }

// Mode is a file mode as a string of 3 or 4 octal digits ("0600").
type Mode string

// File is a filled file the plan names: its absolute, clean path and mode.
type File struct {
	Path string `json:"path"`
	Mode Mode   `json:"mode"`
}

// WantModule is one module of a want.
type WantModule struct {
	Name  string `json:"name"`
	Build string `json:"build"`
	// RunsAs is the account the module's process runs as.
	RunsAs string `json:"runs_as,omitempty"`
	// Files are filled by the provisioner client, never by the controller.
	Files []File `json:"files,omitempty"`
	// Provisioner marks the provisioner client; at most one per want. Its
	// account decides which writer the node accepts (DESIGN.md §4).
	Provisioner bool `json:"provisioner,omitempty"`
	// RequiresApproval: the module moves to a new build only with an
	// operator's approval of that build (incident 4).
	RequiresApproval bool `json:"requires_approval,omitempty"`
	// Hold keeps the module as it runs.
	Hold bool `json:"hold,omitempty"`
}

// Want is the controller's full declaration for one node. A new want
// replaces the old one; a module absent from it is to be removed.
type Want struct {
	Header
	Modules []WantModule `json:"modules"`
	// Gates marks a want written by a build with approval gates
	// (DESIGN.md §4, "the gate"): each module it marks requires_approval
	// is gated on the node from then on, and a later want without the
	// flag does not lift the gate; only an operator's [Gate] with Lift
	// does. [Stamp] sets it, so every want this build writes carries it.
	// A want without it (every want a build before the gate wrote) holds
	// a flagged module only while the newest want carries the flag, as
	// those builds did: a stream written before the upgrade folds as it
	// always did (docs/architecture.md, "The gate is set only by a want
	// that says so"). The controller writes it, so it decides whether its
	// own wants set gates; it never lifts one.
	Gates bool `json:"gates,omitempty"`
}

// Approve is an operator's yes for one module at one build. Approvals are
// never used up.
type Approve struct {
	Header
	Module string `json:"module"`
	Build  string `json:"build"`
	By     string `json:"by"`
}

// RunState is what a have says of a module's process.
type RunState string

// Run states of a have's module.
const (
	Running RunState = "running"
	Stopped RunState = "stopped"
	Failed  RunState = "failed"
)

// HaveModule is one module of a have.
type HaveModule struct {
	Name  string   `json:"name"`
	Build string   `json:"build"`
	State RunState `json:"state"`
	// Account is the account the module's process runs as.
	Account string `json:"account,omitempty"`
	// Restarts counts the module's restarts since its last apply
	// (DESIGN.md §8), after an exit or a lost shim; optional, not
	// negative. A restart that is the module's on_fill action is not one
	// (FillRestarts): a rotated credential is not a crash.
	Restarts int `json:"restarts,omitempty"`
	// FillRestarts counts the module's restarts since its last apply that
	// were its on_fill action (a filled file written, DESIGN.md §8, §12);
	// optional, not negative.
	FillRestarts int `json:"fill_restarts,omitempty"`
	// Exit is the last exit of the module's process: "status N",
	// "signal NAME" or why it could not start; optional.
	Exit string `json:"exit,omitempty"`
	// Since is when State last changed, or when a running module was
	// started again for a fill (on_fill: restart); optional.
	Since *time.Time `json:"since,omitempty"`
	// Health is what the module's check says (DESIGN.md §11 "Health");
	// absent when its bundle declares no check. A check that fell
	// unhealthy is reported healthy again only once it has passed for the
	// agent's hold (docs/architecture.md, "A flapping check's recoveries
	// are held"): a have never says healthy longer than the check did.
	Health Health `json:"health,omitempty"`
}

// Health is what a module's check says of it (DESIGN.md §11).
type Health string

// Health states of a have's module.
const (
	// HealthStarting: alive, no passing check yet.
	HealthStarting Health = "starting"
	Healthy        Health = "healthy"
	Unhealthy      Health = "unhealthy"
)

// Have is the node's full report of what runs.
type Have struct {
	Header
	Modules []HaveModule `json:"modules"`
	// NoPlan: the agent holds no plan: it found none in the stream at its
	// start and has taken none to apply since (optional; absent from older
	// agents; an agent older than this rule still says it while it applies
	// its first plan, until that plan settles). The reconciler answers it with the node's last plan
	// published again when it emitted one (docs/architecture.md, "A plan
	// the stream's max-age removed"): the stream's max-age can have
	// removed the node's plan while the node still needs it.
	NoPlan bool `json:"no_plan,omitempty"`
	// LookedBefore, with NoPlan: the agent's look for the node's plan,
	// which found none, covered the stream's sequences before this one
	// (the stream's last sequence then, plus one: 1 for an empty
	// stream). Optional: 0 from older agents, not known. A plan at or
	// after it was published after the agent looked: one the agent gets
	// from its follow, not one it lost, and the reconciler publishes
	// again only a plan before it (a fresh user's finding V1: the have
	// sent while the first plan was applied got it published twice).
	LookedBefore uint64 `json:"looked_before,omitempty"`
	// Missing are the declared files of the agent's settled plan that
	// were in place on the node in the agent's life (a fill wrote or
	// found them, or they were there at its start) and are gone now
	// (deleted there: a crash, an rm), as the agent found them when a
	// module exited, and since (optional; absent from older agents), sorted by module and path
	// (the agent's order; the fold does not depend on it), unique. The reconciler knocks once for each file newly reported
	// (docs/architecture.md, "A file deleted on the node is refilled").
	Missing []MissingFile `json:"missing,omitempty"`
	// Started is the claim of the agent (its lease's token, as its
	// Agent event's Claim) whose start the files of Missing marked
	// AtStart were gone at: set on every have that lists one, required
	// then. Optional: absent from older agents, and from a have that
	// lists none. The reconciler knocks once for an agent's start, at
	// its up or at the first have reporting such a file, whichever it
	// folds first (docs/architecture.md, "Files gone at the agent's
	// start").
	Started string `json:"started,omitempty"`
}

// MissingFile is a declared file of Module at Path that is missing on the
// node (Have.Missing).
//
// AtStart: the file was gone at the first look of the agent (Have.Started
// names it) at the declared files of its settled plan, and no fill of
// that agent wrote it before that look: a reboot or a re-image emptied
// /run, or the node never held it. The agent reports it so in every have
// until the file is back. Optional: false from older agents, and for a
// file deleted in the agent's life.
type MissingFile struct {
	Module  string `json:"module"`
	Path    string `json:"path"`
	AtStart bool   `json:"at_start,omitempty"`
}

// SettleOp says how an apply ended.
type SettleOp string

// Settle operations.
const (
	OpApply  SettleOp = "apply"
	OpRemove SettleOp = "remove"
	// OpFailed: the apply failed; the node keeps judging by its previous
	// plan and this plan does not count as settled.
	OpFailed SettleOp = "failed"
)

// Settle reports that the node's apply of a plan settled for one module
// (Module empty: the plan changed no module).
type Settle struct {
	Header
	Module string   `json:"module"`
	Op     SettleOp `json:"op"`
	// Plan is the stream sequence of the plan event; required (non-zero).
	Plan  uint64 `json:"plan"`
	Error string `json:"error,omitempty"`
	// Untrusted, on a failed settle of a plan as a whole (Module empty),
	// says the agent refused the plan for its signer: a key it does not
	// trust, or a retired key whose overlap has ended (store.ErrUntrusted,
	// store.ErrRetired). The reconciler answers it by publishing the same
	// plan again under its current key (reconcile, "a plan refused for its
	// key"). Absent from older agents' settles.
	Untrusted bool `json:"untrusted,omitempty"`
}

// Reason says why a node refused a filled-file write.
type Reason string

// Refusal reasons (DESIGN.md §4, judge a write).
const (
	ReasonUndeclared   Reason = "undeclared"
	ReasonNoAccount    Reason = "no-account"
	ReasonWrongAccount Reason = "wrong-account"
	ReasonWriteFailed  Reason = "write-failed"
)

// Refusal reports a filled-file write the node refused or failed.
type Refusal struct {
	Header
	Module string `json:"module"`
	Path   string `json:"path"`
	Reason Reason `json:"reason"`
	// Plan is the sequence of the settled plan the write was judged by; 0
	// when the node had settled none.
	Plan uint64 `json:"plan"`
	// Writer is the account the provisioner client declared.
	Writer string `json:"writer"`
	Error  string `json:"error,omitempty"`
}

// Filled reports a filled-file write the node made.
type Filled struct {
	Header
	Module string `json:"module"`
	Path   string `json:"path"`
	Plan   uint64 `json:"plan"`
	// Digest is the hex HMAC-SHA256 of the content under a key only the
	// node keeps: never the content, never a plain hash of it.
	Digest string `json:"digest"`
	// Claim is the claim of the agent that wrote the file (its lease's
	// token, as its Agent event's Claim): a have of that agent reporting
	// the file gone at its start (MissingFile.AtStart), stored after this
	// filled, was looked before this write (docs/architecture.md, "Files
	// gone at the agent's start"). Optional: absent from older agents.
	Claim string `json:"claim,omitempty"`
}

// HoldReason says why a plan row is held.
type HoldReason string

// Hold reasons (DESIGN.md §4, compose).
const (
	HoldWant     HoldReason = "want"
	HoldApproval HoldReason = "approval"
)

// PlanModule is one row of a plan: composed (apply this build, account,
// files) or held (keep what runs; Why says why).
type PlanModule struct {
	Name   string `json:"name"`
	Build  string `json:"build"`
	RunsAs string `json:"runs_as"`
	Files  []File `json:"files"`
	// Provisioner marks the provisioner client's row.
	Provisioner bool       `json:"provisioner,omitempty"`
	Held        bool       `json:"held,omitempty"`
	Why         HoldReason `json:"why,omitempty"`
	// Pending is the wanted build of a held row when it differs from the
	// build the row carries.
	Pending string `json:"pending,omitempty"`
}

// Plan is the reconciler's composition for one node.
type Plan struct {
	Header
	// Cause is the stream sequence of the event whose folding produced it.
	Cause uint64 `json:"cause"`
	// Want is the stream sequence of the want it composes.
	Want uint64 `json:"want"`
	// ProvisionerAccount is the only writer the node accepts filled-file
	// writes from while this plan is settled; empty: none.
	ProvisionerAccount string       `json:"provisioner_account"`
	Modules            []PlanModule `json:"modules"`
}

// DeclaresFiles reports whether any of a plan's rows declares a file:
// whether the node has anything for a provisioner to fill.
func DeclaresFiles(rows []PlanModule) bool {
	return slices.ContainsFunc(rows, func(m PlanModule) bool { return len(m.Files) > 0 })
}

// Module returns the plan's row for name, or nil.
func (p *Plan) Module(name string) *PlanModule {
	if p == nil {
		return nil
	}
	for i := range p.Modules {
		if p.Modules[i].Name == name {
			return &p.Modules[i]
		}
	}
	return nil
}

// KnockReason is why a knock asks for a fill.
type KnockReason string

// Knock reasons, mapped from refusal reasons.
const (
	KnockDeclared    KnockReason = "declared"     // from undeclared
	KnockAccount     KnockReason = "account"      // from no-account, wrong-account
	KnockWriteFailed KnockReason = "write-failed" // from write-failed
	// KnockOperator: an operator's poke asked for it (DESIGN.md §9); such
	// a knock may carry no owed item.
	KnockOperator KnockReason = "operator"
	// KnockAgent: the node's agent came back (a new claim of its lease,
	// events.Agent up) while its settled plan declares files: a node
	// that rebooted lost what /run (a tmpfs) held, and nothing else
	// would ask for it until the provisioner's resync (a fresh user's
	// finding: a module crash-looped ~8 minutes on a credential the
	// reboot took). Such a knock carries no owed item.
	KnockAgent KnockReason = "agent"
	// KnockMissing: the node's have reported a declared file missing on
	// the node that was in place before (Have.Missing): deleted there,
	// and its module may crash-loop on it until the provisioner's resync
	// (a fresh user's finding U21). Such a knock carries no owed item.
	KnockMissing KnockReason = "missing"
)

// KnockReasonOf maps a refusal reason to the knock reason it brings.
func KnockReasonOf(r Reason) KnockReason {
	switch r {
	case ReasonUndeclared:
		return KnockDeclared
	case ReasonNoAccount, ReasonWrongAccount:
		return KnockAccount
	default:
		return KnockWriteFailed
	}
}

// Owed is an owed item: a refused write that some plan now allows. Its
// identity is (Module, Path, Plan, Writer).
type Owed struct {
	Module string `json:"module"`
	Path   string `json:"path"`
	Reason Reason `json:"reason"`
	Plan   uint64 `json:"plan"`
	Writer string `json:"writer"`
}

// Knock asks the node's provisioner client to fill every file again.
type Knock struct {
	Header
	Cause uint64 `json:"cause"`
	// Reasons are sorted and unique.
	Reasons []KnockReason `json:"reasons"`
	// Owed is sorted by module, path, plan, writer.
	Owed []Owed `json:"owed"`
}

// Level is a journal entry's level.
type Level string

// Journal levels: error for events that cannot be folded and failed
// applies, warn for the provisioner-account transition, info for the rest.
const (
	LevelInfo  Level = "info"
	LevelWarn  Level = "warn"
	LevelError Level = "error"
)

// Journal is a note of the reconciler's about a node.
type Journal struct {
	Header
	Level Level  `json:"level"`
	Msg   string `json:"msg"`
	Cause uint64 `json:"cause"`
}

// Pause asks the reconciler to emit no new plan for the node until a
// [Resume]; wants and approvals are still folded, and knocks still flow
// (DESIGN.md §9).
type Pause struct {
	Header
	By     string `json:"by"`
	Reason string `json:"reason,omitempty"`
}

// Resume ends a pause: the plan composed then is published once if it
// differs from the last plan emitted.
type Resume struct {
	Header
	By string `json:"by"`
	// Reason is free text for the audit, optional (an addition to
	// DESIGN.md §9's payload, which decoders that do not know it ignore).
	Reason string `json:"reason,omitempty"`
}

// Poke asks for a knock with reason "operator": the provisioner client
// fills every file of the node again.
type Poke struct {
	Header
	By     string `json:"by"`
	Reason string `json:"reason,omitempty"`
}

// Revoke takes the approval of Module at Build back. A module held for it
// stays held; one already running that build is not stopped.
type Revoke struct {
	Header
	Module string `json:"module"`
	Build  string `json:"build"`
	By     string `json:"by"`
}

// Waive pays the owed items of Module's file at Path without a knock: a
// path nobody will ever fill.
type Waive struct {
	Header
	Module string `json:"module"`
	Path   string `json:"path"`
	By     string `json:"by"`
}

// Retire empties the node's plan (every module removed) and pays all its
// owed items; once that plan settles the node is retired. Force retires it
// at once (an agent gone for good). A later want brings the node back.
type Retire struct {
	Header
	By    string `json:"by"`
	Force bool   `json:"force,omitempty"`
	// Reason is free text for the audit, optional (as Resume's).
	Reason string `json:"reason,omitempty"`
}

// Gate says Module needs an operator's approval on the node to move to a
// new build, whatever its want says (DESIGN.md §4, "the gate"); Lift takes
// that back. A want that marks a module requires_approval gates it too,
// and a later want without the flag does not lift it: only a Gate with
// Lift does (a fresh user's finding M7: the controller, which writes the
// want, could otherwise lift the gate on its own modules). Lifting
// leaves the want's own flag in force while the want carries it.
type Gate struct {
	Header
	Module string `json:"module"`
	Lift   bool   `json:"lift,omitempty"`
	By     string `json:"by"`
	// Reason is free text for the audit, optional.
	Reason string `json:"reason,omitempty"`
}

// Ack says an operator has read the node's journal warnings (entries of
// level warn or error) stored at or before stream sequence Upto: they no
// longer flag the node as needing an operator, and are counted apart
// (issue 25). Upto 0 means every entry stored before the ack itself; an
// Upto above the ack's own sequence counts as the ack's. It changes no
// plan, knock or owed item.
type Ack struct {
	Header
	By   string `json:"by"`
	Upto uint64 `json:"upto,omitempty"`
	// Reason is free text for the audit, optional.
	Reason string `json:"reason,omitempty"`
}

// Kind implementations.
func (*Want) Kind() Kind    { return KindWant }
func (*Approve) Kind() Kind { return KindApprove }
func (*Have) Kind() Kind    { return KindHave }
func (*Settle) Kind() Kind  { return KindSettle }
func (*Refusal) Kind() Kind { return KindRefusal }
func (*Filled) Kind() Kind  { return KindFilled }
func (*Plan) Kind() Kind    { return KindPlan }
func (*Knock) Kind() Kind   { return KindKnock }
func (*Journal) Kind() Kind { return KindJournal }
func (*Pause) Kind() Kind   { return KindPause }
func (*Resume) Kind() Kind  { return KindResume }
func (*Poke) Kind() Kind    { return KindPoke }
func (*Revoke) Kind() Kind  { return KindRevoke }
func (*Waive) Kind() Kind   { return KindWaive }
func (*Retire) Kind() Kind  { return KindRetire }
func (*Ack) Kind() Kind     { return KindAck }
func (*Gate) Kind() Kind    { return KindGate }

// New returns a zero payload of kind k, or nil for an unknown kind.
func New(k Kind) Payload {
	switch k {
	case KindWant:
		return new(Want)
	case KindApprove:
		return new(Approve)
	case KindHave:
		return new(Have)
	case KindSettle:
		return new(Settle)
	case KindRefusal:
		return new(Refusal)
	case KindFilled:
		return new(Filled)
	case KindPlan:
		return new(Plan)
	case KindKnock:
		return new(Knock)
	case KindJournal:
		return new(Journal)
	case KindPause:
		return new(Pause)
	case KindResume:
		return new(Resume)
	case KindPoke:
		return new(Poke)
	case KindRevoke:
		return new(Revoke)
	case KindWaive:
		return new(Waive)
	case KindRetire:
		return new(Retire)
	case KindAgent:
		return new(Agent)
	case KindAck:
		return new(Ack)
	case KindProv:
		return new(Prov)
	case KindGate:
		return new(Gate)
	}
	return nil
}

// Event is one decoded stream message: where it is in the stream, whose it
// is, and its payload. When the payload could not be decoded or failed
// validation, Payload is nil and Err says why (the fold journals such an
// event and does not fold it, DESIGN.md §3).
type Event struct {
	// Seq is the stream sequence; Time the stream's timestamp.
	Seq  uint64
	Time time.Time
	Node string
	Kind Kind
	// Size is the message's data length in bytes, as stored (0: not
	// known). The fold counts a node's own events' bytes with it
	// (reconcile's noisy rule).
	Size int
	// Payload is nil exactly when Err is not.
	Payload Payload
	Err     error
	// Foreign marks a plan or knock whose signature does not verify
	// against the reconciler's own keys: not one it emitted (a forgery, a
	// replayed signature of another node's effect). The shell that read
	// the message sets it; the fold decides what follows (issue 14).
	Foreign bool
	// OldKey marks a plan whose signature verifies against one of the
	// reconciler's keys other than the one it signs with now (a retired
	// key, issue 24): the fold takes it as foreign when its cause binds to
	// no plan it emitted. The shell that read the message sets it.
	OldKey bool
	// Checked marks an operator event stored on a named operator's
	// subject ([Subjects.Named]) whose payload's `by` is that name
	// ([Attribute]): a `by` the server checked against the publisher's
	// credentials. False for a plain subject's event, whose `by` is
	// self-declared (the shared operator's creds), and for every other
	// kind. [Subjects.DecodeEvent] sets it.
	Checked bool
}

// At returns the publisher's `at` of the event, or the stream time when the
// payload could not be decoded or carried none.
func (e Event) At() time.Time {
	if e.Payload != nil {
		if at := e.Payload.header().At; !at.IsZero() {
			return at
		}
	}
	return e.Time
}
