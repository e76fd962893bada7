package reconcile

import (
	"slices"
	"time"

	"github.com/meshfold/meshfold/events"
)

// View is a node's state as an operator reads it (DESIGN.md §6, `meshfold
// state`): the composition of the last plan emitted, what is held and why,
// what is owed. It holds no secret. Sequences are stream sequences; 0
// means none.
type View struct {
	Node string `json:"node"`
	// Seq is the last sequence folded.
	Seq  uint64 `json:"seq"`
	Want uint64 `json:"want"`
	// EmittedPlan is the last plan emitted; 0 while its event is unfolded.
	EmittedPlan uint64 `json:"emitted_plan"`
	SettledPlan uint64 `json:"settled_plan"`
	// Unsettled counts the plans emitted after the settled one.
	Unsettled int `json:"unsettled"`
	// ProvisionerAccount is the account the last plan emitted names.
	ProvisionerAccount string `json:"provisioner_account"`
	// RunningAccount is the account the have names for the provisioner
	// module; a difference with ProvisionerAccount is incident 3's sign.
	RunningAccount string `json:"running_account"`
	// Modules, Files and Held count the last plan's rows, declared files
	// and held rows.
	Modules int    `json:"modules"`
	Files   int    `json:"files"`
	Held    int    `json:"held"`
	Holds   []Held `json:"holds,omitempty"`
	// Owed are the unpaid owed items.
	Owed      []events.Owed `json:"owed,omitempty"`
	LastKnock *KnockRecord  `json:"last_knock,omitempty"`
	// HaveSeq and HaveTime are the last have's sequence and stream time.
	HaveSeq  uint64    `json:"have_seq,omitempty"`
	HaveTime time.Time `json:"have_time,omitzero"`
	// AccountWarning is true while the provisioner-account warning holds.
	AccountWarning bool `json:"account_warning,omitempty"`
	// Runtime is what the newest have says of each module: its runtime
	// state, restarts, last exit and the files it waits for (DESIGN.md §8).
	Runtime []ModuleRuntime `json:"runtime,omitempty"`

	// OwedAt[i] is the stream time of the refusal that made Owed[i] (zero
	// when unknown: a snapshot older than the field).
	OwedAt []time.Time `json:"owed_at,omitempty"`
	// OwedWhy[i] is the error the node gave for Owed[i]'s refusal (why a
	// write failed), shortened; "" when none.
	OwedWhy []string `json:"owed_why,omitempty"`
	// Paused is the pause in force (DESIGN.md §9); Withheld, while paused,
	// what resuming would publish, when it differs from the last plan
	// emitted (a want or approval taken in and shown as pending).
	Paused   *PauseRecord `json:"paused,omitempty"`
	Withheld *PlanDiff    `json:"withheld,omitempty"`
	// Retire is the node's retirement: retiring until Retire.Retired.
	Retire *RetireRecord `json:"retire,omitempty"`
	// Unfilled are the files the newest settled plan declares that were
	// never filled since their module was placed.
	Unfilled []Unfilled `json:"unfilled,omitempty"`
	// Missing are the declared files the node's agent reported missing
	// on the node (State.Missing), each with the have that first
	// reported it, whose knock asked for its refill.
	Missing []MissingFile `json:"missing,omitempty"`
	// Noisy is the node's newest noisy episode (State.Noisy; noisy.go);
	// nil before the first.
	Noisy *NoisyRecord `json:"noisy,omitempty"`
	// Failed is, per module, the newest failed apply of a plan not
	// settled yet: why the node is unsettled (module "" when the agent
	// refused the whole plan).
	Failed []FailedApply `json:"failed,omitempty"`
	// Agent is the node's agent up or down, and since which event
	// (DESIGN.md §11 "Liveness"); nil while nothing is known.
	Agent *AgentRecord `json:"agent,omitempty"`
	// Provisioner is the node's provisioner client up or down, and since
	// which event; nil while nothing is known (no provisioner of this
	// version ever held the node's provisioner lease).
	Provisioner *AgentRecord `json:"provisioner,omitempty"`
	// Ack is the acknowledgement of the node's journal warnings that
	// covers the most (issue 25); nil when none.
	Ack *AckRecord `json:"ack,omitempty"`
	// Gates are the node's gates (State.Gates): the modules that move to
	// a new build only with an operator's approval whatever the want
	// says, each with whether the newest want still marks it
	// requires_approval. Not in the fleet summary: `state`, the audit and
	// the console say why a module is held; a fleet row, that it is.
	Gates []Gate `json:"gates,omitempty"`
	// GatesFull is State.GatesFull: a gate was not kept for want of
	// room, and every module of the node is held for an approval of its
	// build until an operator gates one again. Not in the fleet summary
	// (as Gates): a fleet row says a module waits for an approval.
	GatesFull *GatesFull `json:"gates_full,omitempty"`
}

// Gate is one of a node's gates as an operator reads it: who or what set
// it, and whether the newest want marks its module requires_approval too
// (Wanted). A gate that is not Wanted holds its module on its own: the
// want's flag was left out, and only an operator's ungate lifts it
// (DESIGN.md §4, "the gate").
type Gate struct {
	GateRecord
	Wanted bool `json:"wanted,omitempty"`
}

// AgentDown reports whether the node's agent is known to be down: its
// lease ended and no have came since.
func (v View) AgentDown() bool { return v.Agent != nil && !v.Agent.Up }

// ProvisionerDown returns the record of the node's provisioner client
// when it is known to be down (its lease expired, was released, or was
// taken by another claim not seen up yet) while the last plan emitted
// declares a file for it to fill: no knock of the node is answered and
// no file filled until a provisioner starts again, and what the fill
// status bucket says of the node's files is as the gone provisioner
// last saw it. nil otherwise: up, never known, or nothing to fill. The
// one rule `fleet`, `state` and the console apply (docs/design.md §11).
func (v View) ProvisionerDown() *AgentRecord { return provisionerDown(v.Provisioner, v.Files > 0) }

// ProvisionerDown is [View.ProvisionerDown] of s's view, read without
// making it (a metrics scrape over every state).
func (s *State) ProvisionerDown() *AgentRecord {
	files := false
	if e := s.Emitted(); e != nil {
		files = events.DeclaresFiles(e.Modules)
	}
	return provisionerDown(s.Provisioner, files)
}

// provisionerDown is the rule of [View.ProvisionerDown]: p, when it is a
// down and the last plan emitted declares a file (files).
func provisionerDown(p *AgentRecord, files bool) *AgentRecord {
	if p != nil && !p.Up && files {
		return p
	}
	return nil
}

// Unfilled is a file the newest settled plan declares for Module, never
// filled since Plan, settled at stream time Since, placed it: the plan
// since which the file has been declared for the module running.
type Unfilled struct {
	Module string    `json:"module"`
	Path   string    `json:"path"`
	Plan   uint64    `json:"plan"`
	Since  time.Time `json:"since"`
}

// Held is one held row of the last plan emitted.
type Held struct {
	Module string            `json:"module"`
	Why    events.HoldReason `json:"why"`
	// Build is what the row carries: what runs ("" when nothing runs).
	Build string `json:"build"`
	// Pending is the wanted build waiting, when it differs.
	Pending string `json:"pending,omitempty"`
}

// View returns the operator's view of s.
func (s *State) View() View {
	v := View{
		Node:           s.Node,
		Seq:            s.Seq,
		Unsettled:      len(s.Unsettled),
		RunningAccount: s.runningAccountOfProvisioner(),
		LastKnock:      s.LastKnock,
		AccountWarning: s.AccountJournaled,
		Runtime:        RuntimeOf(s),
	}
	if s.Want != nil {
		v.Want = s.Want.Seq
	}
	if s.Settled != nil {
		v.SettledPlan = s.Settled.Seq
	}
	if s.Have != nil {
		v.HaveSeq, v.HaveTime = s.Have.Seq, s.Have.Time
	}
	if e := s.Emitted(); e != nil {
		v.EmittedPlan = e.Seq
		v.ProvisionerAccount = e.Account
		v.Modules = len(e.Modules)
		for _, m := range e.Modules {
			v.Files += len(m.Files)
			if m.Held {
				v.Held++
				v.Holds = append(v.Holds, Held{Module: m.Name, Why: m.Why, Build: m.Build, Pending: m.Pending})
			}
		}
	}
	if g := s.GatesFull; g != nil {
		full := *g
		full.Modules = slices.Clone(g.Modules)
		v.GatesFull = &full
	}
	for _, g := range s.Gates {
		wanted := s.Want != nil && slices.ContainsFunc(s.Want.Modules, func(m events.WantModule) bool { return m.Name == g.Module && m.RequiresApproval })
		v.Gates = append(v.Gates, Gate{GateRecord: g, Wanted: wanted})
	}
	for _, it := range s.Owed {
		v.Owed = append(v.Owed, it.Owed)
		v.OwedAt = append(v.OwedAt, it.Time)
		if it.Why != "" {
			if v.OwedWhy == nil {
				v.OwedWhy = make([]string, len(s.Owed))
			}
			v.OwedWhy[len(v.Owed)-1] = it.Why
		}
	}
	if s.Paused != nil {
		p := *s.Paused
		v.Paused = &p
		if rows, account, ok := s.Compose(); ok && s.differs(rows, account) {
			d := DiffPlans(s.Emitted(), rows, account, s.Want.Seq)
			v.Withheld = &d
		}
	}
	if s.Retire != nil {
		r := *s.Retire
		v.Retire = &r
	}
	v.Unfilled = s.unfilled()
	v.Missing = slices.Clone(s.Missing)
	if s.Noisy != nil {
		n := *s.Noisy
		v.Noisy = &n
	}
	v.Failed = slices.Clone(s.Failed)
	if s.Agent != nil {
		a := *s.Agent
		v.Agent = &a
	}
	if s.Provisioner != nil {
		p := *s.Provisioner
		v.Provisioner = &p
	}
	if s.Ack != nil {
		a := *s.Ack
		v.Ack = &a
	}
	return v
}

// Composition is the last plan the reconciler emitted for a node, as
// `meshfold state` and the service's composition endpoint show it: each
// row composed or held (with why and pending), the provisioner account
// beside the account what runs names. It holds paths and modes, never
// content. Sequences are stream sequences; 0 means none.
type Composition struct {
	Node string `json:"node"`
	// Seq is the last sequence folded.
	Seq  uint64 `json:"seq"`
	Want uint64 `json:"want"`
	// Plan is the last plan emitted (0 while its event is unfolded, or
	// before the first); Cause the event that made it.
	Plan        uint64 `json:"plan"`
	Cause       uint64 `json:"cause"`
	SettledPlan uint64 `json:"settled_plan"`
	// ProvisionerAccount is the account the plan names; RunningAccount
	// the one the have names for the provisioner module.
	ProvisionerAccount string              `json:"provisioner_account"`
	RunningAccount     string              `json:"running_account"`
	Modules            []events.PlanModule `json:"modules"`
}

// CompositionOf returns s's composition.
func CompositionOf(s *State) Composition {
	v := s.View()
	c := Composition{Node: s.Node, Seq: s.Seq, Want: v.Want, SettledPlan: v.SettledPlan,
		ProvisionerAccount: v.ProvisionerAccount, RunningAccount: v.RunningAccount, Modules: []events.PlanModule{}}
	if e := s.Emitted(); e != nil {
		c.Plan, c.Cause = e.Seq, e.Cause
		c.Modules = e.Modules
	}
	return c
}

// unfilled returns the files of the newest settled plan never filled
// since their module was placed: no filled mark at the placing plan or a
// newer one.
func (s *State) unfilled() []Unfilled {
	var out []Unfilled
	for _, p := range s.Placed {
		i, found := slices.BinarySearchFunc(s.Filled, FilledMark{Module: p.Module, Path: p.Path}, compareFilled)
		if found && s.Filled[i].Plan >= p.Plan {
			continue
		}
		out = append(out, Unfilled{Module: p.Module, Path: p.Path, Plan: p.Plan, Since: p.Time})
	}
	return out
}

// UnfilledStuckAfter is how long after its module was placed a declared
// file may stay unfilled before [View.Stuck] calls it stuck: a provisioner
// fills a settled plan's new files within seconds, so a minute means it
// cannot (no source for the secret, a wrong account).
const UnfilledStuckAfter = time.Minute

// OwedStuckAfter is how old an owed item is before [View.Stuck] calls it
// stuck: a knock follows a settle within seconds, so an item an hour old
// waits for something only an operator can give (DESIGN.md §9).
const OwedStuckAfter = time.Hour

// Stuck is what is stuck on a node, at a glance (`fleet`, `state`): the
// pause (by whom, since when), the retirement, the files never filled
// since their module was placed for longer than [UnfilledStuckAfter],
// and owed items older than [OwedStuckAfter]. Ages are in seconds, against the now given.
type Stuck struct {
	Paused *PauseRecord `json:"paused,omitempty"`
	// PausedFor is the pause's age in seconds.
	PausedFor float64       `json:"paused_for_s,omitempty"`
	Retiring  bool          `json:"retiring,omitempty"`
	Retired   bool          `json:"retired,omitempty"`
	Unfilled  []StuckFile   `json:"unfilled,omitempty"`
	Owed      []StuckOwed   `json:"owed,omitempty"`
	Withheld  bool          `json:"withheld,omitempty"`
	Retire    *RetireRecord `json:"retire,omitempty"`
}

// StuckFile is an [Unfilled] file and how long ago its placing plan
// settled, in seconds.
type StuckFile struct {
	Unfilled
	For float64 `json:"for_s"`
}

// StuckOwed is an owed item older than [OwedStuckAfter]: since when, and
// its age in seconds.
type StuckOwed struct {
	events.Owed
	Since time.Time `json:"since"`
	For   float64   `json:"for_s"`
}

// Any reports whether anything is stuck (a retired node is not: it is
// done).
func (k Stuck) Any() bool {
	return k.Paused != nil || k.Retiring || len(k.Unfilled) > 0 || len(k.Owed) > 0
}

// Stuck derives what is stuck from the view, at now (stream times in the
// view, the present from the caller: the core reads no clock).
func (v View) Stuck(now time.Time) Stuck {
	var k Stuck
	if v.Paused != nil {
		k.Paused = v.Paused
		k.PausedFor = now.Sub(v.Paused.Time).Seconds()
		k.Withheld = v.Withheld != nil
	}
	if r := v.Retire; r != nil {
		k.Retire, k.Retired, k.Retiring = r, r.Retired, !r.Retired
	}
	// Counted first, then made once (`fleet` makes a row for every node).
	n := 0
	for _, u := range v.Unfilled {
		if now.Sub(u.Since) > UnfilledStuckAfter {
			n++
		}
	}
	if n > 0 {
		k.Unfilled = make([]StuckFile, 0, n)
		for _, u := range v.Unfilled {
			if age := now.Sub(u.Since); age > UnfilledStuckAfter {
				k.Unfilled = append(k.Unfilled, StuckFile{Unfilled: u, For: age.Seconds()})
			}
		}
	}
	owedStuck := func(i int) bool {
		return i < len(v.OwedAt) && !v.OwedAt[i].IsZero() && now.Sub(v.OwedAt[i]) > OwedStuckAfter
	}
	n = 0
	for i := range v.Owed {
		if owedStuck(i) {
			n++
		}
	}
	if n > 0 {
		k.Owed = make([]StuckOwed, 0, n)
		for i, o := range v.Owed {
			if owedStuck(i) {
				k.Owed = append(k.Owed, StuckOwed{Owed: o, Since: v.OwedAt[i], For: now.Sub(v.OwedAt[i]).Seconds()})
			}
		}
	}
	return k
}
