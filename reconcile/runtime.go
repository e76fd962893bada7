package reconcile

import (
	"slices"
	"time"

	"github.com/meshfold/meshfold/events"
)

// ModuleRuntime is one module of a node's newest have as an operator
// reads it (DESIGN.md §8, "what the have says"): its runtime state,
// restarts since its last apply, last exit and when its state changed,
// with the files it is still waiting for. Its JSON field names are
// stable.
type ModuleRuntime struct {
	Module   string          `json:"module"`
	Build    string          `json:"build"`
	State    events.RunState `json:"state"`
	Account  string          `json:"account,omitempty"`
	Restarts int             `json:"restarts"`
	Exit     string          `json:"exit,omitempty"`
	Since    *time.Time      `json:"since,omitempty"`
	Health   events.Health   `json:"health,omitempty"` // absent without a check (DESIGN.md §11)
	// Unfilled are the paths of the module's owed items and the files its
	// row of the newest settled plan declares that no filled event ever
	// reported, sorted: what a module crash-looping for want of a
	// credential is waiting for (incident 1).
	Unfilled []string `json:"unfilled,omitempty"`
}

// Failing reports whether the module is failed: it exited or could not
// start, and waits to restart (a crash loop while its restarts grow).
func (m ModuleRuntime) Failing() bool { return m.State == events.Failed }

// RuntimeOf returns every module of s's newest have, in the have's order
// (by name), with its unfilled files; none before the first have.
func RuntimeOf(s *State) []ModuleRuntime {
	if s.Have == nil {
		return nil
	}
	out := make([]ModuleRuntime, 0, len(s.Have.Modules))
	for _, m := range s.Have.Modules {
		out = append(out, ModuleRuntime{Module: m.Name, Build: m.Build, State: m.State, Account: m.Account,
			Restarts: m.Restarts, Exit: m.Exit, Since: m.Since, Health: m.Health, Unfilled: unfilled(s, m.Name)})
	}
	return out
}

// unfilled lists module's owed paths and the files its settled row
// declares with no filled mark, sorted and unique.
func unfilled(s *State, module string) []string {
	var out []string
	for _, it := range s.Owed {
		if it.Module == module {
			out = append(out, it.Path)
		}
	}
	if s.Settled != nil {
		if row := s.Settled.Row(module); row != nil {
			for _, f := range row.Files {
				filled := slices.ContainsFunc(s.Filled, func(m FilledMark) bool {
					return m.Module == module && m.Path == f.Path
				})
				if !filled {
					out = append(out, f.Path)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
