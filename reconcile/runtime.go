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
	// FillRestarts are its on_fill restarts since its last apply (a
	// filled file written): not crashes, not in Restarts.
	FillRestarts int           `json:"fill_restarts,omitempty"`
	Exit         string        `json:"exit,omitempty"`
	Since        *time.Time    `json:"since,omitempty"`
	Health       events.Health `json:"health,omitempty"` // absent without a check (DESIGN.md §11)
	// HealthSince is the stream time of the first have since which Health
	// has said what it says; absent without a check, or unknown.
	HealthSince *time.Time `json:"health_since,omitempty"`
	// Crashes are the stream times of the module's last crashes after
	// running at Build (at most FlapRestarts, oldest first); those of a
	// build it ran before are not its.
	Crashes []time.Time `json:"crashes,omitempty"`
	// Unfilled are the paths of the module's owed items and the files its
	// row of the newest settled plan declares that no filled event ever
	// reported, sorted: what a module crash-looping for want of a
	// credential is waiting for (incident 1).
	Unfilled []string `json:"unfilled,omitempty"`
}

// Failing reports whether the module is failed: it exited or could not
// start, and waits to restart (a crash loop while its restarts grow).
func (m ModuleRuntime) Failing() bool { return m.State == events.Failed }

// Unhealthy reports whether the module is alive and its health check
// says unhealthy (DESIGN.md §11).
func (m ModuleRuntime) Unhealthy() bool {
	return m.State == events.Running && m.Health == events.Unhealthy
}

// Flap thresholds (DESIGN.md §11: a module that flaps needs an operator,
// like a crash loop): a module that runs now and crashed after running
// FlapRestarts times within FlapWindow, the running time after which
// §8's backoff forgives a crash loop. A module that crash-looped without
// ever running (a missing credential) and then runs has recovered.
const (
	FlapRestarts = 3
	FlapWindow   = 10 * time.Minute
)

// FlapSettle is the least time a module that flapped must have run
// since its last crash to count as recovered ([ModuleRuntime.FlapSettled]).
const FlapSettle = time.Minute

// Flapping reports whether the module runs now but crash-loops: it
// crashed after running [FlapRestarts] times, the first of them less
// than [FlapWindow] before now, and has not outrun its loop since
// ([ModuleRuntime.FlapSettled]). A have caught between two crashes says
// running; this says what its history says.
func (m ModuleRuntime) Flapping(now time.Time) bool {
	return m.flapped(now) && !m.settled(now)
}

// FlapSettled reports whether the module flapped (three crashes after
// running within [FlapWindow] of now) but has outrun its loop: it runs,
// and no crash came for twice the longest gap between its recorded
// crashes, and at least [FlapSettle]; last is its last crash. A healthy
// module has no have to send after its last crash until the agent's
// resync (10 min), so its newest have is the flapping one: fleet called
// a module flapping, first of the nodes needing an operator, for ten
// minutes after a bad secret was replaced and the module ran healthy
// again (a fresh user's finding F9). A module that still crash-loops,
// however slowly, crashes again within twice its gap and is flapping
// again from that crash's have on.
func (m ModuleRuntime) FlapSettled(now time.Time) (last time.Time, ok bool) {
	if !m.flapped(now) || !m.settled(now) {
		return time.Time{}, false
	}
	return m.Crashes[len(m.Crashes)-1], true
}

func (m ModuleRuntime) flapped(now time.Time) bool {
	return m.State == events.Running && len(m.Crashes) >= FlapRestarts && now.Sub(m.Crashes[len(m.Crashes)-FlapRestarts]) < FlapWindow
}

// settled: no crash for twice the longest gap between the recorded
// crashes, and at least FlapSettle.
func (m ModuleRuntime) settled(now time.Time) bool {
	if len(m.Crashes) == 0 {
		return true
	}
	var gap time.Duration
	for i := 1; i < len(m.Crashes); i++ {
		gap = max(gap, m.Crashes[i].Sub(m.Crashes[i-1]))
	}
	return now.Sub(m.Crashes[len(m.Crashes)-1]) >= max(FlapSettle, 2*gap)
}

// RuntimeOf returns every module of s's newest have, in the have's order
// (by name), with its unfilled files; none before the first have.
func RuntimeOf(s *State) []ModuleRuntime {
	if s.Have == nil {
		return nil
	}
	out := make([]ModuleRuntime, 0, len(s.Have.Modules))
	for i, m := range s.Have.Modules {
		r := ModuleRuntime{Module: m.Name, Build: m.Build, State: m.State, Account: m.Account,
			Restarts: m.Restarts, FillRestarts: m.FillRestarts, Exit: m.Exit, Since: m.Since, Health: m.Health, Unfilled: unfilled(s, m.Name)}
		if j := slices.IndexFunc(s.Crashes, func(c Crashes) bool { return c.Module == m.Name && (c.Build == m.Build || c.Build == "") }); j >= 0 {
			r.Crashes = s.Crashes[j].Times
		}
		if i < len(s.Have.HealthSince) && !s.Have.HealthSince[i].IsZero() {
			t := s.Have.HealthSince[i]
			r.HealthSince = &t
		}
		out = append(out, r)
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
