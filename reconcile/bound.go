package reconcile

import (
	"cmp"
	"slices"

	"github.com/meshfold/meshfold/events"
)

// forget drops the records the node's current configuration no longer
// names (docs/design.md §4, "Bounded state", an extension of DESIGN.md
// §4), so that a state grows with what the node is configured with now,
// not with every path, account and build it was ever configured with:
//
//   - an accepting record (module, path, account) is kept while the
//     current want declares that file and names that account as its
//     provisioner's runs_as, or the settled plan or a plan emitted after
//     it declares the file under that provisioner account, or an owed
//     item of that file and writer is unpaid;
//   - a filled mark (module, path) is kept while the want, the settled
//     plan or a plan emitted after it declares the file, or an owed item
//     of that file is unpaid;
//   - an approval (module, build) is kept while the want asks for that
//     build, or the settled plan or a plan emitted after it runs it or
//     holds it pending, or it arrived after the current want (an approval
//     given ahead of the want that will ask for it; before the first
//     want every approval is kept), or it is one of the [KeptApprovals]
//     newest approvals of a module the want names (going back to a
//     recently approved build needs no new yes).
//
// It is a function of the state alone, run at the end of every fold, so a
// replay or a refold from a snapshot forgets exactly what the live run
// forgot.
func (s *State) forget() {
	if len(s.Accepting) == 0 && len(s.Filled) == 0 && (len(s.Approvals) == 0 || s.Want == nil) {
		return
	}
	plans := make([]*PlanRecord, 0, 1+len(s.Unsettled))
	if s.Settled != nil {
		plans = append(plans, s.Settled)
	}
	plans = append(plans, s.Unsettled...)
	wantAccount := ""
	if s.Want != nil {
		for _, m := range s.Want.Modules {
			if m.Provisioner {
				wantAccount = m.RunsAs
			}
		}
	}
	wantDeclares := func(module, path string) bool {
		return s.Want != nil && slices.ContainsFunc(s.Want.Modules, func(m events.WantModule) bool {
			return m.Name == module && declares(m.Files, path)
		})
	}
	planDeclares := func(p *PlanRecord, module, path string) bool {
		row := p.Row(module)
		return row != nil && declares(row.Files, path)
	}
	owes := func(module, path string, writer *string) bool {
		return slices.ContainsFunc(s.Owed, func(it Item) bool {
			return it.Module == module && it.Path == path && (writer == nil || it.Writer == *writer)
		})
	}
	if len(s.Accepting) > 0 {
		s.Accepting = slices.DeleteFunc(s.Accepting, func(a Accepting) bool {
			if wantAccount == a.Account && wantDeclares(a.Module, a.Path) {
				return false
			}
			for _, p := range plans {
				if p.Account == a.Account && planDeclares(p, a.Module, a.Path) {
					return false
				}
			}
			return !owes(a.Module, a.Path, &a.Account)
		})
	}
	if len(s.Filled) > 0 {
		s.Filled = slices.DeleteFunc(s.Filled, func(f FilledMark) bool {
			if wantDeclares(f.Module, f.Path) {
				return false
			}
			for _, p := range plans {
				if planDeclares(p, f.Module, f.Path) {
					return false
				}
			}
			return !owes(f.Module, f.Path, nil)
		})
	}
	if len(s.Approvals) > 0 && s.Want != nil {
		// Approvals are sorted by module: each module's are contiguous.
		recent := map[Approval]bool{}
		for i := 0; i < len(s.Approvals); {
			j := i
			for j < len(s.Approvals) && s.Approvals[j].Module == s.Approvals[i].Module {
				j++
			}
			if j-i > KeptApprovals && slices.ContainsFunc(s.Want.Modules, func(m events.WantModule) bool { return m.Name == s.Approvals[i].Module }) {
				mod := slices.Clone(s.Approvals[i:j])
				slices.SortFunc(mod, func(a, b Approval) int { return cmp.Compare(b.Seq, a.Seq) })
				for _, a := range mod[:KeptApprovals] {
					recent[a] = true
				}
			} else if j-i <= KeptApprovals {
				for _, a := range s.Approvals[i:j] {
					recent[a] = true
				}
			}
			i = j
		}
		s.Approvals = slices.DeleteFunc(s.Approvals, func(a Approval) bool {
			if a.Seq > s.Want.Seq {
				return false
			}
			inWant := false
			for _, m := range s.Want.Modules {
				if m.Name == a.Module {
					inWant = true
					if m.Build == a.Build {
						return false
					}
				}
			}
			if inWant && recent[a] {
				return false
			}
			for _, p := range plans {
				if row := p.Row(a.Module); row != nil && (row.Build == a.Build || row.Pending == a.Build) {
					return false
				}
			}
			return true
		})
	}
}

// KeptApprovals is how many of a wanted module's newest approvals a state
// keeps beyond those its configuration names (see [State.Fold]).
const KeptApprovals = 8

func declares(files []events.File, path string) bool {
	return slices.ContainsFunc(files, func(f events.File) bool { return f.Path == path })
}
