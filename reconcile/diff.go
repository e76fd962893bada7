package reconcile

import (
	"slices"

	"github.com/meshfold/meshfold/events"
)

// PlanDiff is how one composition differs from another, row by row
// (DESIGN.md §9, dry run): rows added, removed and changed (by module
// name), the held rows of the new one with why, and the provisioner
// accounts and wants of both. It holds paths and modes, never content.
type PlanDiff struct {
	// Added are the new composition's rows the old one lacks.
	Added []events.PlanModule `json:"added,omitempty"`
	// Removed are the old composition's rows the new one lacks: the node
	// removes those modules.
	Removed []events.PlanModule `json:"removed,omitempty"`
	// Changed are the rows of both that differ.
	Changed []RowChange `json:"changed,omitempty"`
	// Held are the new composition's held rows, with why and the pending
	// build.
	Held []Held `json:"held,omitempty"`
	// AccountFrom and AccountTo are the provisioner accounts; WantFrom
	// and WantTo the wants composed (0: none, or a dry run's want, which
	// is in no stream).
	AccountFrom string `json:"account_from"`
	AccountTo   string `json:"account_to"`
	WantFrom    uint64 `json:"want_from"`
	WantTo      uint64 `json:"want_to"`
}

// RowChange is one module whose row differs: the old row, the new one and
// the names of the fields that differ (build, runs_as, files, provisioner,
// held, why, pending).
type RowChange struct {
	Module string            `json:"module"`
	From   events.PlanModule `json:"from"`
	To     events.PlanModule `json:"to"`
	Fields []string          `json:"fields"`
}

// Rows reports whether the diff changes any row or the account: whether
// the node would apply anything.
func (d PlanDiff) Rows() bool {
	return len(d.Added)+len(d.Removed)+len(d.Changed) > 0 || d.AccountFrom != d.AccountTo
}

// DiffPlans returns how the composition (to, toAccount, toWant) differs
// from the plan from (nil: none emitted yet).
func DiffPlans(from *PlanRecord, to []events.PlanModule, toAccount string, toWant uint64) PlanDiff {
	d := PlanDiff{AccountTo: toAccount, WantTo: toWant}
	var old []events.PlanModule
	if from != nil {
		old, d.AccountFrom, d.WantFrom = from.Modules, from.Account, from.Want
	}
	for _, r := range to {
		i := slices.IndexFunc(old, func(o events.PlanModule) bool { return o.Name == r.Name })
		if i < 0 {
			d.Added = append(d.Added, r)
		} else if fields := rowFields(old[i], r); len(fields) > 0 {
			d.Changed = append(d.Changed, RowChange{Module: r.Name, From: old[i], To: r, Fields: fields})
		}
		if r.Held {
			d.Held = append(d.Held, Held{Module: r.Name, Why: r.Why, Build: r.Build, Pending: r.Pending})
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(to, func(r events.PlanModule) bool { return r.Name == o.Name }) {
			d.Removed = append(d.Removed, o)
		}
	}
	return d
}

func rowFields(a, b events.PlanModule) []string {
	var f []string
	add := func(differ bool, name string) {
		if differ {
			f = append(f, name)
		}
	}
	add(a.Build != b.Build, "build")
	add(a.RunsAs != b.RunsAs, "runs_as")
	add(!slices.Equal(a.Files, b.Files), "files")
	add(a.Provisioner != b.Provisioner, "provisioner")
	add(a.Held != b.Held, "held")
	add(a.Why != b.Why, "why")
	add(a.Pending != b.Pending, "pending")
	return f
}

// DryRun is what the reconciler would do now with a new want (DESIGN.md
// §9, `meshfold want --dry-run`): the plan it would compose, whether it
// would publish it, and its difference from the last plan emitted.
type DryRun struct {
	Node string `json:"node"`
	// Seq is the last sequence folded into the state the dry run started
	// from; Want is that state's newest want (0: none), the sequence to
	// pin with `want --expect`.
	Seq  uint64 `json:"seq"`
	Want uint64 `json:"want"`
	// Account and Modules are the composition.
	Account string              `json:"provisioner_account"`
	Modules []events.PlanModule `json:"modules"`
	// Publish: the reconciler would publish this plan now. A new want
	// always yields a plan, except while the node is paused (Paused says
	// by whom and since when): then the plan waits for the resume.
	Publish bool         `json:"publish"`
	Paused  *PauseRecord `json:"paused,omitempty"`
	// Returns: the node is retiring or retired, and this want brings it
	// back.
	Returns bool     `json:"returns,omitempty"`
	Diff    PlanDiff `json:"diff"`
}

// DryRun composes a new want of modules against s without changing s: the
// fold's own want rule and [State.Compose] on a copy, so it cannot
// disagree with what folding the want would emit.
func (s *State) DryRun(modules []events.WantModule) DryRun {
	c := s.Clone()
	d := DryRun{Node: s.Node, Seq: s.Seq, Paused: s.Paused, Returns: s.Retire != nil}
	if s.Want != nil {
		d.Want = s.Want.Seq
	}
	c.takeWant(s.Seq+1, modules)
	rows, account, _ := c.Compose()
	d.Modules, d.Account = rows, account
	d.Publish = s.Paused == nil && c.differs(rows, account)
	d.Diff = DiffPlans(s.Emitted(), rows, account, 0) // the want is not in the stream
	return d
}
