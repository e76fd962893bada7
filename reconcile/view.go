package reconcile

import (
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
	for _, it := range s.Owed {
		v.Owed = append(v.Owed, it.Owed)
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
