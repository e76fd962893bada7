package rollout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/meshfold/meshfold/events"
)

// Kind names one kind of a fleet's rollout events (they travel on the
// fleet's own subjects, never a node's) or one kind of node event the
// fold reads.
type Kind string

// The rollout's own events. start and nodes come from `meshfold apply`;
// promote, pause, resume, abort and revert from the operator verbs;
// published, refused and tick from the controller (facts the fold cannot
// know: what the server answered, and that time passed); record is the
// fold's own output, recorded for the audit.
const (
	KindStart     Kind = "start"
	KindNodes     Kind = "nodes"
	KindPublished Kind = "published"
	KindRefused   Kind = "refused"
	KindPromote   Kind = "promote"
	KindPause     Kind = "pause"
	KindResume    Kind = "resume"
	KindAbort     Kind = "abort"
	KindRevert    Kind = "revert"
	KindTick      Kind = "tick"
	KindRecord    Kind = "record"
)

// RolloutKinds lists the rollout's own event kinds in a fixed order.
var RolloutKinds = []Kind{KindStart, KindNodes, KindPublished, KindRefused, KindPromote, KindPause, KindResume,
	KindAbort, KindRevert, KindTick, KindRecord}

// The node events the fold reads (DESIGN.md §3, §11): a target's wants,
// plans, settles and haves, and its agent's liveness.
const (
	KindWant   Kind = "want"
	KindPlan   Kind = "plan"
	KindSettle Kind = "settle"
	KindHave   Kind = "have"
	KindDown   Kind = "down"
	KindUp     Kind = "up"
	// KindNodePause and KindNodeResume are an operator's pause and resume
	// of the node (`meshfold pause NODE`, events.Pause and events.Resume):
	// a paused node emits no plan, so the fold holds it as it holds a node
	// whose agent is down.
	KindNodePause  Kind = "node-pause"
	KindNodeResume Kind = "node-resume"
	// KindNodeRetire is an operator's retire of the node (`meshfold
	// retire NODE`, events.Retire): an explicit act a rollout never
	// undoes, so a target not finished yet is skipped (see [Skipped]).
	KindNodeRetire Kind = "node-retire"
	// KindFilled is a filled-file write the node made (events.Filled): a
	// file its new want added, filled at last, is no longer waited for.
	KindFilled Kind = "filled"
	// KindProvDown and KindProvUp are the node's provisioner client going
	// down and coming back (events.Prov): what a target waiting for a
	// file is told of who would fill it.
	KindProvDown Kind = "prov-down"
	KindProvUp   Kind = "prov-up"
)

// FileRef names one file a want declares: its module and path.
type FileRef struct {
	Module string `json:"module"`
	Path   string `json:"path"`
}

// Limits of the rollout's events, beside events' (DESIGN.md §10): every
// event must fit in a message and fold.
const (
	// MaxNodes bounds the nodes a fleet owns.
	MaxNodes = 100_000
	// MaxNodesPerEvent bounds the nodes of one start or nodes page: at
	// about 60 bytes a node, 2,000 keep a page near 120 KB, under
	// events.MaxEventBytes.
	MaxNodesPerEvent = 2000
	// MaxWants bounds a start's distinct wants. A fleet file yields one
	// want per distinct set of matched groups; the start's size is bounded
	// by events.MaxEventBytes as every event's is.
	MaxWants = 256
	// MaxPages bounds a start's pages: MaxNodes / MaxNodesPerEvent.
	MaxPages = MaxNodes / MaxNodesPerEvent
)

// Step says which want a step gives a target: its new one, or back its
// previous one.
type Step string

// Steps.
const (
	StepForward Step = "forward"
	StepRevert  Step = "revert"
	// StepOver gives a target its new want again, once, after its
	// forward step was refused because the rollout this one superseded
	// ([Start].Supersedes) stored a want of its own on the node after
	// apply read it: the new want then expects that one (see
	// folder.overSuperseded). A step of its own, so its want and its
	// outcome have message ids of their own ([WantID], [OutcomeID]).
	StepOver Step = "over"
)

// NodeAtStart is one of the fleet's nodes as `apply` saw it when it
// started the rollout.
type NodeAtStart struct {
	Node string `json:"node"`
	// Want is 1 + the index of the node's new want in the start's wants;
	// 0 when the node is not a target (its want does not change).
	Want int `json:"want,omitempty"`
	// Prev is the stream sequence of the node's newest want, the one the
	// rollout diffed against (0: none). The new want is published with
	// Nats-Expected-Last-Subject-Sequence set to it.
	Prev uint64 `json:"prev,omitempty"`
	// Back, when set, is the want a revert gives the target back instead
	// of Prev (below it): Prev is the forward want of the fleet's
	// previous rollout, which this one supersedes and which had not made
	// it done, and Back the want that rollout would have given back (see
	// [State.RevertBases]).
	Back uint64 `json:"back,omitempty"`
	// Had, when set, is 1 + the index in the start's wants of the want a
	// revert gives the target back, carried here so that a revert does
	// not depend on the stream still holding it (--max-age): its want at
	// Prev, which apply read (HadSeq is then Prev; [NewStart] carries
	// every target's within the start's bound), or one the stream no
	// longer held at the apply, which apply read, with its sequence
	// HadSeq, from the reconciler's state (Prev is then 0: the want
	// subject holds none), or from the superseded rollout that carried
	// it. Never set with Back. 0: the revert copies the want at Back or
	// Prev, or gives an empty want when both are 0 (a node with no want
	// before).
	Had    int    `json:"had,omitempty"`
	HadSeq uint64 `json:"had_seq,omitempty"`
	// Down: its agent's lease had expired. DownSince is when (its
	// agent's down event's stream time); zero from an older apply, and
	// then the fold takes the start's time.
	Down      bool      `json:"down,omitempty"`
	DownSince time.Time `json:"down_since,omitzero"`
	// Unhealthy names the modules its newest have reported unhealthy or
	// failed, sorted.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// PausedBy, when set, says the node was paused (its newest pause
	// newer than its newest resume), by whom and why (PausedReason).
	PausedBy     string `json:"paused_by,omitempty"`
	PausedReason string `json:"paused_reason,omitempty"`
	// NewFiles is 1 + the index, in the start's NewFiles, of the files
	// its new want adds; 0: none.
	NewFiles int `json:"new_files,omitempty"`
	// Restarts are the restarts its newest have reported of the modules
	// its new want leaves at their build, those that had any, without
	// their build (the want's), at most events.MaxHaveModules: all of
	// them while its page's nodes encode within MaxNodesPerEvent ×
	// [RestartsNodeBytes], else as many as keep the node's entry within
	// RestartsNodeBytes (rollout's fitRestarts): such a module is
	// judged a crash loop by its restarts after these, not over its whole
	// life (a fresh user's finding G6). A module left out (an older
	// apply's start, or past the bound) counts its restarts whole.
	Restarts []ModuleRestarts `json:"restarts,omitempty"`
}

// RestartsNodeBytes bounds a node's encoded entry in a start or page once
// [NodeAtStart.Restarts] is added, so that the restarts never take a page
// of [MaxNodesPerEvent] nodes past events.MaxEventBytes (2,000 × 128
// bytes is 250 KiB of its 256).
const RestartsNodeBytes = 128

// ModuleRestarts is a module's restart count at a build, as a have
// reported it. In a start its build is empty: the target's new want
// gives it.
type ModuleRestarts struct {
	Module   string `json:"module"`
	Build    string `json:"build,omitempty"`
	Restarts int    `json:"restarts"`
}

// RestartsOf returns the restarts of the modules in ms that had any, in
// their order; nil when none had.
func RestartsOf(ms []HaveModule) []ModuleRestarts {
	var out []ModuleRestarts
	for _, m := range ms {
		if m.Restarts > 0 {
			out = append(out, ModuleRestarts{Module: m.Name, Build: m.Build, Restarts: m.Restarts})
		}
	}
	return out
}

// Start begins a rollout (published by `meshfold apply`). Its stream
// sequence is the rollout's id. Targets are taken in the order they
// appear in Nodes and the pages after it; batches are cut in that order.
// A start while another rollout of the fleet is active supersedes it.
type Start struct {
	events.Header
	By     string `json:"by"`
	Reason string `json:"reason,omitempty"`
	Params Params `json:"rollout"`
	// Wants are the distinct new wants, each exactly a want's modules.
	Wants [][]events.WantModule `json:"wants"`
	// Pages is how many pages of nodes the start has, this one included
	// (1 when the start holds every node); the rollout acts once all are
	// folded.
	Pages int           `json:"pages"`
	Nodes []NodeAtStart `json:"nodes"`
	// NewFiles are the distinct lists of the files a target's new want
	// declares that its newest want did not declare for the same module
	// (a fresh user's finding G4: the module waits for them, it does not
	// fail); a node names its list by [NodeAtStart].NewFiles. Absent
	// from an older apply's start: no file is waited for.
	NewFiles [][]FileRef `json:"new_files,omitempty"`
	// Supersedes is the fleet's newest start when apply read the fleet
	// (0: none), which apply publishes this start over (its expected
	// last subject sequence, so no start came between). A want that
	// rollout stored on a target after apply read the target is no hand
	// change: the target's step expects it instead ([Node].Adopted,
	// [StepOver]), whether or not the fold saw that rollout. Absent
	// from an older apply's start: such a want is a conflict, as before.
	Supersedes uint64 `json:"supersedes,omitempty"`
}

// Nodes is page Page (1-based, from 1 to the start's Pages-1; the start
// itself is page 0) of rollout Rollout's nodes.
type Nodes struct {
	events.Header
	Rollout uint64        `json:"rollout"`
	Page    int           `json:"page"`
	Nodes   []NodeAtStart `json:"nodes"`
}

// Published is the controller's record that the want of a step was
// stored: at stream sequence Want on Node's want subject.
type Published struct {
	events.Header
	Rollout uint64 `json:"rollout"`
	Node    string `json:"node"`
	Step    Step   `json:"step"`
	Want    uint64 `json:"want"`
}

// Refused is the controller's record that the want of a step could not
// be published: the node's newest want was Last, not the one the step
// expected (a want changed by hand, or by another rollout's step: a
// conflict), or, Last 0, the previous want to give back could not be
// read (Error says why).
type Refused struct {
	events.Header
	Rollout uint64 `json:"rollout"`
	Node    string `json:"node"`
	Step    Step   `json:"step"`
	Last    uint64 `json:"last,omitempty"`
	// LastID is the message id of want Last (empty: it has none, a want
	// published by hand, or an older controller's record): a rollout
	// step's names its writer ([ParseWantID]).
	LastID string `json:"last_id,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Operator is an operator's verb on the fleet's rollout: promote, pause,
// resume, abort or revert. Rollout, when set, names the rollout meant;
// the verb is ignored for another one (a promote meant for the rollout
// that a new apply superseded does not promote the new one).
type Operator struct {
	events.Header
	kind    Kind
	Rollout uint64 `json:"rollout,omitempty"`
	By      string `json:"by"`
	Reason  string `json:"reason,omitempty"`
}

// NewOperator returns an operator event of kind k (promote, pause,
// resume, abort or revert), or nil for another kind.
func NewOperator(k Kind, rollout uint64, by, reason string) *Operator {
	switch k {
	case KindPromote, KindPause, KindResume, KindAbort, KindRevert:
		return &Operator{kind: k, Rollout: rollout, By: by, Reason: reason}
	}
	return nil
}

// Kind returns the verb.
func (o *Operator) Kind() Kind { return o.kind }

// Tick is the controller's word that time passed: its clock reached an
// instant [State.NextWake] returned. The fold reads the tick's stream
// time, as it reads every event's.
type Tick struct {
	events.Header
	Rollout uint64 `json:"rollout,omitempty"`
}

// Record is one of the fold's decisions, recorded on the fleet's rollout
// subject for the audit: a target done, failed, unreached or in
// conflict, a batch begun, the rollout waiting, halted, completed. Folding
// it back changes nothing.
type Record struct {
	events.Header
	Rollout uint64 `json:"rollout"`
	// Cause is the stream sequence of the event whose folding decided it.
	Cause uint64 `json:"cause"`
	Node  string `json:"node,omitempty"`
	// What is the decision: a target status or a rollout phase (see
	// [Status] and [Phase]), or "batch", "ignored", "rejected".
	What  string       `json:"what"`
	Level events.Level `json:"level"`
	Msg   string       `json:"msg"`
}

// Errors of decoding and validating a rollout event.
var (
	ErrUnknownKind = errors.New("rollout: unknown event kind")
	ErrPages       = errors.New("must be from 1 to " + strconv.Itoa(MaxPages))
	ErrWantIndex   = errors.New("names no want of the start")
	// ErrFilesIndex: a node's new_files names no list of the start's, or
	// is set on a node that is not a target.
	ErrFilesIndex = errors.New("names no new_files list of the start")
	ErrBack       = errors.New("must be a target's want older than its prev")
	ErrHad        = errors.New("must name one of the start's wants, for a target with a had_seq and no back")
)

// New returns a zero payload of the rollout kind k, or nil.
func New(k Kind) any {
	switch k {
	case KindStart:
		return new(Start)
	case KindNodes:
		return new(Nodes)
	case KindPublished:
		return new(Published)
	case KindRefused:
		return new(Refused)
	case KindPromote, KindPause, KindResume, KindAbort, KindRevert:
		return &Operator{kind: k}
	case KindTick:
		return new(Tick)
	case KindRecord:
		return new(Record)
	}
	return nil
}

type validator interface {
	Validate() error
	header() *events.Header
}

func (s *Start) header() *events.Header     { return &s.Header }
func (n *Nodes) header() *events.Header     { return &n.Header }
func (p *Published) header() *events.Header { return &p.Header }
func (r *Refused) header() *events.Header   { return &r.Header }
func (o *Operator) header() *events.Header  { return &o.Header }
func (t *Tick) header() *events.Header      { return &t.Header }
func (r *Record) header() *events.Header    { return &r.Header }

// Decode parses data as a rollout event of kind k and validates it.
// Unknown fields are ignored (a newer publisher may add some).
//
// Errors: ErrUnknownKind; events.ErrNewerVersion for a `v` newer than
// events.Version; events.ErrMalformed when data is not JSON of the kind's
// shape or is over events.MaxEventBytes; a *events.FieldError (matching
// events.ErrInvalid) when validation fails.
func Decode(k Kind, data []byte) (any, error) { return decode(k, data, false) }

// DecodeStrict is [Decode] refusing unknown fields, for what a user
// wrote.
func DecodeStrict(k Kind, data []byte) (any, error) { return decode(k, data, true) }

func decode(k Kind, data []byte, strict bool) (any, error) {
	p := New(k)
	if p == nil {
		return nil, fmt.Errorf("%w %s", ErrUnknownKind, events.Short(string(k)))
	}
	if len(data) > events.MaxEventBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes, the limit is %d (events.MaxEventBytes)", events.ErrMalformed, k, len(data), events.MaxEventBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	err := dec.Decode(p)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	v := p.(validator)
	if err != nil {
		var hv struct {
			V int `json:"v"`
		}
		if json.Unmarshal(data, &hv) == nil && hv.V > events.Version {
			return nil, fmt.Errorf("%w: v=%d, this build knows v=%d", events.ErrNewerVersion, hv.V, events.Version)
		}
		return nil, fmt.Errorf("%w: %s: %s", events.ErrMalformed, k, events.ErrorText(err.Error()))
	}
	if h := v.header(); h.V > events.Version {
		return nil, fmt.Errorf("%w: v=%d, this build knows v=%d", events.ErrNewerVersion, h.V, events.Version)
	}
	if err := v.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// Stamp sets a rollout payload's v to events.Version and at to t (UTC,
// microseconds), as events.Stamp does, and returns p.
func Stamp[P any](p P, t time.Time) P {
	if v, ok := any(p).(validator); ok {
		h := v.header()
		h.V = events.Version
		h.At = t.UTC().Truncate(time.Microsecond)
	}
	return p
}

func fieldErr(field, value string, err error) error {
	return &events.FieldError{Field: field, Value: value, Err: err}
}

// place prefixes a field error's field with list[i].
func place(list string, i int, err error) error {
	var fe *events.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	c := *fe
	if c.Field == "" {
		c.Field = fmt.Sprintf("%s[%d]", list, i)
	} else {
		c.Field = fmt.Sprintf("%s[%d].%s", list, i, c.Field)
	}
	return &c
}

func checkHeader(h *events.Header) error {
	if h.V < 1 {
		return fieldErr("v", "", events.ErrVersion)
	}
	if h.At.IsZero() {
		return fieldErr("at", "", events.ErrMissing)
	}
	if _, off := h.At.Zone(); off != 0 {
		return fieldErr("at", h.At.Format(time.RFC3339Nano), events.ErrNotUTC)
	}
	return nil
}

func checkName(field, s string) error {
	if s == "" {
		return fieldErr(field, "", events.ErrMissing)
	}
	if !events.ValidName(s) {
		return fieldErr(field, s, events.ErrBadName)
	}
	return nil
}

func checkText(field, s string, required bool, limit int, limitName string) error {
	switch {
	case s == "" && required:
		return fieldErr(field, "", events.ErrMissing)
	case len(s) > limit:
		return fieldErr(field, s, &events.LimitError{Err: events.ErrTooLong, Got: len(s), Limit: limit, Name: limitName})
	case events.HasControl(s):
		return fieldErr(field, s, events.ErrControl)
	}
	return nil
}

func checkBy(by, reason string) error {
	if err := checkText("by", by, true, events.MaxBy, "MaxBy"); err != nil {
		return err
	}
	return checkText("reason", reason, false, events.MaxText, "MaxText")
}

func checkStep(s Step) error {
	switch s {
	case StepForward, StepRevert, StepOver:
		return nil
	case "":
		return fieldErr("step", "", events.ErrMissing)
	}
	return fieldErr("step", string(s), events.ErrBadValue)
}

// CheckWant validates modules as a want's (DESIGN.md §3, §10), with
// events' own validation: names, builds, accounts, paths, the limits.
func CheckWant(modules []events.WantModule) error {
	w := events.Want{Header: events.Header{V: events.Version, At: time.Unix(0, 0).UTC()}, Modules: modules}
	if modules == nil {
		w.Modules = []events.WantModule{}
	}
	return w.Validate()
}

func checkNodes(list []NodeAtStart, wants, files int) error {
	if len(list) > MaxNodesPerEvent {
		return fieldErr("nodes", "", &events.LimitError{Err: events.ErrTooMany, Got: len(list), Limit: MaxNodesPerEvent, Name: "rollout.MaxNodesPerEvent"})
	}
	seen := make(map[string]bool, len(list))
	for i, n := range list {
		if err := checkNode(n, wants, files, seen); err != nil {
			return place("nodes", i, err)
		}
	}
	return nil
}

// RevertTo is the sequence of the want a revert gives the target back
// by copy: Back when set, else Prev; 0 when the start carries it (Had)
// or there is none (an empty want).
func (n NodeAtStart) RevertTo() uint64 {
	if n.Back != 0 {
		return n.Back
	}
	if n.Had != 0 {
		return 0
	}
	return n.Prev
}

func checkNode(n NodeAtStart, wants, files int, seen map[string]bool) error {
	if err := checkName("node", n.Node); err != nil {
		return err
	}
	if n.Back != 0 && (n.Want == 0 || n.Back >= n.Prev) {
		return fieldErr("back", strconv.FormatUint(n.Back, 10), ErrBack)
	}
	if n.Had < 0 || (n.Had > 0 && (n.Want == 0 || n.Back != 0 || n.HadSeq == 0)) || (n.Had == 0 && n.HadSeq != 0) || (wants >= 0 && n.Had > wants) {
		return fieldErr("had", strconv.Itoa(n.Had), ErrHad)
	}
	if seen[n.Node] {
		return fieldErr("node", n.Node, events.ErrDuplicate)
	}
	seen[n.Node] = true
	if n.Want < 0 || (wants >= 0 && n.Want > wants) {
		return fieldErr("want", strconv.Itoa(n.Want), ErrWantIndex)
	}
	if n.NewFiles < 0 || (n.NewFiles > 0 && n.Want == 0) || (files >= 0 && n.NewFiles > files) {
		return fieldErr("new_files", strconv.Itoa(n.NewFiles), ErrFilesIndex)
	}
	if len(n.Unhealthy) > events.MaxHaveModules {
		return fieldErr("unhealthy", "", &events.LimitError{Err: events.ErrTooMany, Got: len(n.Unhealthy), Limit: events.MaxHaveModules, Name: "MaxHaveModules"})
	}
	for j, m := range n.Unhealthy {
		if !events.ValidName(m) {
			return fieldErr(fmt.Sprintf("unhealthy[%d]", j), m, events.ErrBadName)
		}
	}
	if len(n.Restarts) > events.MaxHaveModules {
		return fieldErr("restarts", "", &events.LimitError{Err: events.ErrTooMany, Got: len(n.Restarts), Limit: events.MaxHaveModules, Name: "MaxHaveModules"})
	}
	for j, m := range n.Restarts {
		if !events.ValidName(m.Module) {
			return fieldErr(fmt.Sprintf("restarts[%d].module", j), m.Module, events.ErrBadName)
		}
		if len(m.Build) > events.MaxBuild {
			return fieldErr(fmt.Sprintf("restarts[%d].build", j), "", &events.LimitError{Err: events.ErrTooLong, Got: len(m.Build), Limit: events.MaxBuild, Name: "MaxBuild"})
		}
		if m.Restarts < 0 {
			return fieldErr(fmt.Sprintf("restarts[%d].restarts", j), strconv.Itoa(m.Restarts), events.ErrBadValue)
		}
	}
	if err := checkText("paused_by", n.PausedBy, n.PausedReason != "", events.MaxBy, "MaxBy"); err != nil {
		return err
	}
	return checkText("paused_reason", n.PausedReason, false, events.MaxText, "MaxText")
}

// Validate checks by, the rollout block, each want as a want
// (events.Want's validation), the pages and the nodes: valid names, no
// node twice, want indexes in range.
func (s *Start) Validate() error {
	if err := checkHeader(&s.Header); err != nil {
		return err
	}
	if err := checkBy(s.By, s.Reason); err != nil {
		return err
	}
	if err := s.Params.Validate(); err != nil {
		return fieldErr("rollout", "", err)
	}
	if len(s.Wants) > MaxWants {
		return fieldErr("wants", "", &events.LimitError{Err: events.ErrTooMany, Got: len(s.Wants), Limit: MaxWants, Name: "rollout.MaxWants"})
	}
	for i, w := range s.Wants {
		if err := CheckWant(w); err != nil {
			return place("wants", i, err)
		}
	}
	if s.Pages < 1 || s.Pages > MaxPages {
		return fieldErr("pages", strconv.Itoa(s.Pages), ErrPages)
	}
	for i, list := range s.NewFiles {
		if len(list) == 0 {
			return fieldErr(fmt.Sprintf("new_files[%d]", i), "", events.ErrMissing)
		}
		for j, f := range list {
			if !events.ValidName(f.Module) {
				return fieldErr(fmt.Sprintf("new_files[%d][%d].module", i, j), f.Module, events.ErrBadName)
			}
			if !events.ValidPath(f.Path) {
				return fieldErr(fmt.Sprintf("new_files[%d][%d].path", i, j), f.Path, events.ErrBadValue)
			}
		}
	}
	return checkNodes(s.Nodes, len(s.Wants), len(s.NewFiles))
}

// Validate checks the rollout, the page number and the nodes (want
// indexes are checked against the start when the page is folded).
func (n *Nodes) Validate() error {
	if err := checkHeader(&n.Header); err != nil {
		return err
	}
	if n.Rollout == 0 {
		return fieldErr("rollout", "", events.ErrMissing)
	}
	if n.Page < 1 || n.Page >= MaxPages {
		return fieldErr("page", strconv.Itoa(n.Page), ErrPages)
	}
	return checkNodes(n.Nodes, -1, -1)
}

// Validate checks the rollout, node, step and want sequence.
func (p *Published) Validate() error {
	if err := checkHeader(&p.Header); err != nil {
		return err
	}
	if p.Rollout == 0 {
		return fieldErr("rollout", "", events.ErrMissing)
	}
	if err := checkName("node", p.Node); err != nil {
		return err
	}
	if err := checkStep(p.Step); err != nil {
		return err
	}
	if p.Want == 0 {
		return fieldErr("want", "", events.ErrMissing)
	}
	return nil
}

// Validate checks the rollout, node, step and the error's text; one of
// last and error is required.
func (r *Refused) Validate() error {
	if err := checkHeader(&r.Header); err != nil {
		return err
	}
	if r.Rollout == 0 {
		return fieldErr("rollout", "", events.ErrMissing)
	}
	if err := checkName("node", r.Node); err != nil {
		return err
	}
	if err := checkStep(r.Step); err != nil {
		return err
	}
	if r.Last == 0 && r.Error == "" {
		return fieldErr("last", "", events.ErrMissing)
	}
	// An error comes from the server or the OS: free text, folded with
	// its control characters escaped (DESIGN.md §10).
	if len(r.Error) > events.MaxText {
		return fieldErr("error", r.Error, &events.LimitError{Err: events.ErrTooLong, Got: len(r.Error), Limit: events.MaxText, Name: "MaxText"})
	}
	// A message id anyone may have set on a want: read only through
	// ParseWantID, bounded as free text.
	if len(r.LastID) > events.MaxText {
		return fieldErr("last_id", r.LastID, &events.LimitError{Err: events.ErrTooLong, Got: len(r.LastID), Limit: events.MaxText, Name: "MaxText"})
	}
	return nil
}

// Validate checks by and the reason's text.
func (o *Operator) Validate() error {
	if err := checkHeader(&o.Header); err != nil {
		return err
	}
	return checkBy(o.By, o.Reason)
}

// Validate checks the header.
func (t *Tick) Validate() error { return checkHeader(&t.Header) }

// Validate checks the rollout (0 only for an event rejected or ignored
// before any rollout), the node, the level and the message.
func (r *Record) Validate() error {
	if err := checkHeader(&r.Header); err != nil {
		return err
	}
	if r.Rollout == 0 && r.What != "rejected" && r.What != "ignored" {
		return fieldErr("rollout", "", events.ErrMissing)
	}
	if r.Node != "" && !events.ValidName(r.Node) {
		return fieldErr("node", r.Node, events.ErrBadName)
	}
	switch r.Level {
	case events.LevelInfo, events.LevelWarn, events.LevelError:
	default:
		return fieldErr("level", string(r.Level), events.ErrBadValue)
	}
	if err := checkText("what", r.What, true, events.MaxName, "MaxName"); err != nil {
		return err
	}
	return checkText("msg", r.Msg, true, events.MaxJournal, "MaxJournal")
}
