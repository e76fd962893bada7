package reconcile

import (
	"slices"

	"github.com/meshfold/meshfold/events"
)

// Running is what runs of one module (DESIGN.md §4, "what runs").
type Running struct {
	Build  string
	RunsAs string
	Files  []events.File
}

// Runs returns what runs of module name: the newest settled plan's row for
// it (a composed row, or the values a held row carried); if that plan has
// no row for it or no plan has settled, the have's build and account when
// the have lists it running, with no files; else nothing (ok false).
func (s *State) Runs(name string) (r Running, ok bool) {
	if s.Settled != nil {
		if row := s.Settled.Row(name); row != nil {
			return Running{Build: row.Build, RunsAs: row.RunsAs, Files: row.Files}, true
		}
	}
	if m := s.haveModule(name); m != nil && m.State == events.Running {
		return Running{Build: m.Build, RunsAs: m.Account}, true
	}
	return Running{}, false
}

func (s *State) haveModule(name string) *events.HaveModule {
	if s.Have == nil {
		return nil
	}
	for i := range s.Have.Modules {
		if s.Have.Modules[i].Name == name {
			return &s.Have.Modules[i]
		}
	}
	return nil
}

// Approved reports whether an approval names module at build.
func (s *State) Approved(module, build string) bool {
	_, found := slices.BinarySearchFunc(s.Approvals, Approval{Module: module, Build: build}, compareApproval)
	return found
}

// Gated reports whether an operator's gate, or an earlier want's
// requires_approval, gates module on the node (DESIGN.md §4, "the gate"),
// and the record that does.
func (s *State) Gated(module string) (GateRecord, bool) {
	i, found := slices.BinarySearchFunc(s.Gates, GateRecord{Module: module}, compareGate)
	if !found {
		return GateRecord{}, false
	}
	return s.Gates[i], true
}

// Hold decides whether a wanted module is held, and why. It is the one
// rule for it (incident 4: a second rule elsewhere is exactly the bug):
//
//   - held with why "want" if the want says hold;
//   - held with why "approval" if it requires approval (the want says
//     requires_approval, or the node's gate of the module stands, or the
//     node's gates are full, State.GatesFull, or a gated module was
//     dropped from the want, GateRecord.Dropped: gated),
//     the wanted build differs from the build that runs, and no approval
//     names the wanted build (first placement included: nothing runs, so
//     it waits);
//   - otherwise composed.
func Hold(m events.WantModule, runs Running, approved, gated bool) (why events.HoldReason, held bool) {
	switch {
	case m.Hold:
		return events.HoldWant, true
	case (m.RequiresApproval || gated) && m.Build != runs.Build && !approved:
		return events.HoldApproval, true
	}
	return "", false
}

// Compose returns the plan rows and provisioner account the newest want
// composes with what runs and the approvals (DESIGN.md §4). ok is false
// before the first want. A retiring or retired node composes no row and
// no account (DESIGN.md §9).
//
// A composed row is the wanted build, runs_as and files. A held row carries
// what runs (build empty when nothing runs: the node neither starts nor
// removes it) and Pending, the wanted build when it differs.
//
// The provisioner account (incident 3) is decided by the want's provisioner
// module: composed, its runs_as (none if empty); held, the account it runs
// as (the runs_as of what runs, else the have's account when the have lists
// it running); no provisioner module in the want, none.
func (s *State) Compose() (rows []events.PlanModule, account string, ok bool) {
	if s.Want == nil {
		return nil, "", false
	}
	if s.Retire != nil {
		// A retiring node's plan is empty: every module removed (§9).
		return []events.PlanModule{}, "", true
	}
	rows = make([]events.PlanModule, len(s.Want.Modules))
	for i, m := range s.Want.Modules {
		row, acc := s.composeRow(m)
		rows[i] = row
		if m.Provisioner {
			account = acc
		}
	}
	return rows, account, true
}

// composeRow is [State.Compose]'s row for the wanted module m, and, when m
// is the provisioner, the account that row decides.
func (s *State) composeRow(m events.WantModule) (row events.PlanModule, account string) {
	runs, _ := s.Runs(m.Name)
	_, gated := s.Gated(m.Name)
	// Gates full, or a gated module dropped from the want: every module
	// is held as a gated one (State.GatesFull, GateRecord.Dropped).
	if !gated {
		_, dropped := s.droppedGate()
		gated = s.GatesFull != nil || dropped
	}
	why, held := Hold(m, runs, s.Approved(m.Name, m.Build), gated)
	row = events.PlanModule{Name: m.Name, Provisioner: m.Provisioner}
	if held {
		row.Build, row.RunsAs, row.Files = runs.Build, runs.RunsAs, runs.Files
		row.Held, row.Why = true, why
		if m.Build != runs.Build {
			row.Pending = m.Build
		}
	} else {
		row.Build, row.RunsAs, row.Files = m.Build, m.RunsAs, m.Files
	}
	if m.Provisioner {
		account = row.RunsAs
		if held && account == "" {
			if hm := s.haveModule(m.Name); hm != nil && hm.State == events.Running {
				account = hm.Account
			}
		}
	}
	return row, account
}

// composesEmitted reports whether [State.Compose] gives the rows and
// account of the last plan emitted (so [State.differs] is false), and
// that account, without building the rows: most events (a have that
// changes nothing, above all) compose the plan already emitted, and
// building it to compare was most of their fold (issue 17). false when
// it cannot tell (no want, a retirement, no plan emitted): compose then.
func (s *State) composesEmitted() (account string, same bool) {
	last := s.Emitted()
	if s.Want == nil || s.Retire != nil || last == nil || last.Want != s.Want.Seq || len(last.Modules) != len(s.Want.Modules) {
		return "", false
	}
	for i, m := range s.Want.Modules {
		row, acc := s.composeRow(m)
		if !equalRow(last.Modules[i], row) {
			return "", false
		}
		if m.Provisioner {
			account = acc
		}
	}
	return account, account == last.Account
}

// runningAccountOfProvisioner returns the account the have names for the
// provisioner module: the want's, or, when the want has none, the one the
// newest settled plan marked (DESIGN.md §4, incident 3).
func (s *State) runningAccountOfProvisioner() string {
	name := ""
	if s.Want != nil {
		for _, m := range s.Want.Modules {
			if m.Provisioner {
				name = m.Name
			}
		}
	}
	if name == "" && s.Settled != nil {
		for _, m := range s.Settled.Modules {
			if m.Provisioner {
				name = m.Name
			}
		}
	}
	if name == "" {
		return ""
	}
	if hm := s.haveModule(name); hm != nil {
		return hm.Account
	}
	return ""
}

// removesProvisioner says whether the newest want removes the provisioner
// module the newest settled plan marked and leaves nothing to fill: the
// want marks none, does not name that module and declares no file.
func (s *State) removesProvisioner() bool {
	if s.Want == nil || s.Settled == nil || slices.ContainsFunc(s.Want.Modules, func(m events.WantModule) bool { return m.Provisioner || len(m.Files) > 0 }) {
		return false
	}
	i := slices.IndexFunc(s.Settled.Modules, func(m events.PlanModule) bool { return m.Provisioner })
	if i < 0 {
		return false
	}
	name := s.Settled.Modules[i].Name
	return !slices.ContainsFunc(s.Want.Modules, func(m events.WantModule) bool { return m.Name == name })
}

// differs reports whether a plan of rows and account, composing the newest
// want, differs from the last plan emitted: the one rule for publishing a
// plan (DESIGN.md §4), so each new want yields exactly one plan, and a
// resume publishes only a plan that differs.
func (s *State) differs(rows []events.PlanModule, account string) bool {
	last := s.Emitted()
	return last == nil || last.Want != s.Want.Seq || last.Account != account || !equalRows(last.Modules, rows)
}

func equalRows(a, b []events.PlanModule) bool { return slices.EqualFunc(a, b, equalRow) }

func equalRow(x, y events.PlanModule) bool {
	return x.Name == y.Name && x.Build == y.Build && x.RunsAs == y.RunsAs &&
		x.Provisioner == y.Provisioner && x.Held == y.Held && x.Why == y.Why &&
		x.Pending == y.Pending && slices.Equal(x.Files, y.Files)
}
