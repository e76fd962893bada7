package audit

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// failing returns the failed modules of rs.
func failing(rs []reconcile.ModuleRuntime) []reconcile.ModuleRuntime {
	var out []reconcile.ModuleRuntime
	for _, r := range rs {
		if r.Failing() {
			out = append(out, r)
		}
	}
	return out
}

// unhealthy returns the modules of rs alive with a failing check.
func unhealthy(rs []reconcile.ModuleRuntime) []reconcile.ModuleRuntime {
	var out []reconcile.ModuleRuntime
	for _, r := range rs {
		if r.Unhealthy() {
			out = append(out, r)
		}
	}
	return out
}

// flapping returns the modules of rs that run at now but crash-loop
// (reconcile.ModuleRuntime.Flapping), unhealthy ones left to [unhealthy].
func flapping(rs []reconcile.ModuleRuntime, now time.Time) []reconcile.ModuleRuntime {
	var out []reconcile.ModuleRuntime
	for _, r := range rs {
		if r.Flapping(now) && !r.Unhealthy() {
			out = append(out, r)
		}
	}
	return out
}

// ShortBuild cuts a sha256 build (a bundle's) to its first 12 digits for
// summaries and lines, where the whole digest would push what follows
// past [LineWidth]; other builds are kept. JSON entries keep every build
// whole.
func ShortBuild(b string) string {
	const scheme = "sha256:"
	if strings.HasPrefix(b, scheme) && len(b) > len(scheme)+12 {
		return b[:len(scheme)+12] + "…"
	}
	return b
}

// runtimeText is one module's runtime for a state line: "mesh-build-go
// sha256:9f1c2b3a4d5e… failed as mbg, 7 restarts, last exit status 1,
// since 2026-…Z (45s ago); unfilled /run/x"; a module fleet calls
// flapping says so: "; flapping: 3 crashes after running since T (…)".
func runtimeText(r reconcile.ModuleRuntime, now time.Time, suffix string) string {
	s := fmt.Sprintf("%s %s %s", r.Module, orNone(ShortBuild(r.Build)), r.State)
	if r.Health != "" {
		s += " " + string(r.Health)
		if hs := r.HealthSince; hs != nil {
			s += fmt.Sprintf(" (since %s, %s %s)", FormatTime(*hs), Age(now.Sub(*hs)), suffix)
		}
	}
	if r.Account != "" {
		s += " as " + r.Account
	}
	s += ", " + plural(r.Restarts, "restart")
	if r.FillRestarts > 0 {
		s += ", " + plural(r.FillRestarts, "on_fill restart")
	}
	if r.Exit != "" {
		s += ", last exit " + r.Exit
	}
	if r.Since != nil {
		s += fmt.Sprintf(", since %s (%s %s)", FormatTime(*r.Since), Age(now.Sub(*r.Since)), suffix)
	}
	if r.Flapping(now) && !r.Unhealthy() {
		// What fleet flags it for (flapping), so that the two agree.
		c := r.Crashes[len(r.Crashes)-reconcile.FlapRestarts]
		s += fmt.Sprintf("; flapping: %d crashes after running since %s (%s %s)", len(r.Crashes), FormatTime(c), Age(now.Sub(c)), suffix)
	} else if last, ok := r.FlapSettled(now); ok && !r.Unhealthy() {
		// What fleet no longer flags: the loop is history.
		s += fmt.Sprintf("; last seen flapping %s %s (%d crashes, the last at %s; none since, so not counted as needing an operator)",
			Age(now.Sub(last)), suffix, len(r.Crashes), FormatTime(last))
	}
	if len(r.Unfilled) > 0 {
		s += "; unfilled " + strings.Join(r.Unfilled, ", ")
	}
	return s
}

// failedNeed is a failed module as fleet's NEEDS column shows it:
// "mesh-build-go failed ×7 (status 1), 1 unfilled"; [FleetFailedText]
// names the files.
func failedNeed(r reconcile.ModuleRuntime) string {
	s := r.Module + " failed"
	if r.Restarts > 0 {
		s += fmt.Sprintf(" ×%d", r.Restarts)
	}
	if r.Exit != "" {
		s += " (" + r.Exit + ")"
	}
	if n := len(r.Unfilled); n > 0 {
		s += fmt.Sprintf(", %d unfilled", n)
	}
	return s
}

// FleetFailedText returns, for the rows in their order, one labelled line
// (wrapped at [LineWidth]) per failed, unhealthy or flapping module: node, module, restarts, last
// exit, since when, and the files it waits for in full, which a fleet
// line has no room for. Empty when no module failed.
func FleetFailedText(rows []FleetRow) string {
	var t textWriter
	for _, r := range rows {
		for _, f := range r.Failed {
			s := fmt.Sprintf("%s %s %s, %s", r.Node, f.Module, orNone(ShortBuild(f.Build)), plural(f.Restarts, "restart"))
			if f.Exit != "" {
				s += ", last exit " + f.Exit
			}
			if f.Since != nil {
				s += ", since " + FormatTime(*f.Since)
			}
			if len(f.Unfilled) > 0 {
				s += "; unfilled " + strings.Join(f.Unfilled, ", ")
			}
			t.line(0, "failed", s)
		}
		for _, f := range r.Unhealthy {
			s := fmt.Sprintf("%s %s %s: alive, its health check failing", r.Node, f.Module, orNone(ShortBuild(f.Build)))
			if f.Restarts > 0 {
				s += ", " + plural(f.Restarts, "restart")
			}
			t.line(0, "unhealthy", s)
		}
		for _, f := range r.Flapping {
			s := fmt.Sprintf("%s %s %s: %s, %d crashes after running since %s", r.Node, f.Module, orNone(ShortBuild(f.Build)),
				plural(f.Restarts, "restart"), len(f.Crashes), FormatTime(f.Crashes[0]))
			if f.Exit != "" {
				s += ", last exit " + f.Exit
			}
			t.line(0, "flapping", s)
		}
	}
	return t.b.String()
}

// haveChanges tells what changed from have prev to have h, module by
// module in h's order, removals last: "+name build state" for a new
// module, "-name" for one gone, and for a changed one its state
// (running→failed, with the exit and restarts), its check's word while
// it runs (healthy→unhealthy), build or account; a failed module that
// restarted and failed again shows its restarts (3→4).
func haveChanges(prev, h *events.Have) []string {
	old := map[string]events.HaveModule{}
	for _, m := range prev.Modules {
		old[m.Name] = m
	}
	var out []string
	for _, m := range h.Modules {
		o, ok := old[m.Name]
		if !ok {
			out = append(out, "+"+m.Name+" "+orNone(ShortBuild(m.Build))+" "+string(m.State)+haveDetail(m))
			continue
		}
		var c []string
		if o.State != m.State {
			c = append(c, string(o.State)+"→"+string(m.State)+haveDetail(m))
		} else if m.Restarts != o.Restarts || m.Exit != o.Exit {
			c = append(c, fmt.Sprintf("%s, restarts %d→%d", m.State, o.Restarts, m.Restarts)+exitDetail(m))
		} else if m.FillRestarts != o.FillRestarts {
			c = append(c, fmt.Sprintf("%s, on_fill restarts %d→%d", m.State, o.FillRestarts, m.FillRestarts))
		} else if o.Since != nil && m.Since != nil && !o.Since.Equal(*m.Since) {
			// Its state began again and nothing else tells it: a crash
			// loop's run shorter than the agent's have pace (a shim
			// older than the one that counts a restart with its start
			// said the count first), told "unchanged" before (a fresh
			// user's finding m4).
			c = append(c, fmt.Sprintf("%s again since %s", m.State, m.Since.UTC().Format(time.TimeOnly))+exitDetail(m))
		}
		if h := healthChange(o, m); h != "" {
			c = append(c, h)
		}
		if o.Build != m.Build {
			c = append(c, orNone(ShortBuild(o.Build))+"→"+orNone(ShortBuild(m.Build)))
		}
		if o.Account != m.Account {
			c = append(c, "account "+orNone(o.Account)+"→"+orNone(m.Account))
		}
		if len(c) > 0 {
			out = append(out, m.Name+" "+strings.Join(c, ", "))
		}
	}
	for _, m := range prev.Modules {
		if !slices.ContainsFunc(h.Modules, func(n events.HaveModule) bool { return n.Name == m.Name }) {
			out = append(out, "-"+m.Name)
		}
	}
	return out
}

// healthChange says how module m's check changed since o, both running
// (DESIGN.md §11 "Health"): "healthy→unhealthy", "starting→healthy";
// "health unhealthy" for a check first reported (a module that runs
// with one now, not before). "" when it did not change, or when m does
// not run: its state's change says it, and no check runs then.
func healthChange(o, m events.HaveModule) string {
	switch {
	case m.State != events.Running || m.Health == o.Health || m.Health == "":
		return ""
	case o.State != events.Running || o.Health == "":
		if m.Health == events.HealthStarting {
			return "" // a start's first word, said by its state's change
		}
		return "health " + string(m.Health)
	}
	return string(o.Health) + "→" + string(m.Health)
}

// haveDetail is a module's exit and restarts in parentheses, when any.
func haveDetail(m events.HaveModule) string {
	var d []string
	if m.Exit != "" && m.State != events.Running {
		d = append(d, m.Exit)
	}
	if m.Restarts > 0 {
		d = append(d, plural(m.Restarts, "restart"))
	}
	if m.FillRestarts > 0 {
		d = append(d, plural(m.FillRestarts, "on_fill restart"))
	}
	if len(d) == 0 {
		return ""
	}
	return " (" + strings.Join(d, ", ") + ")"
}

func exitDetail(m events.HaveModule) string {
	if m.Exit == "" {
		return ""
	}
	return " (" + m.Exit + ")"
}

// haveSummaryAfter is a have's timeline summary told against the have
// before it (nil: the first): its changes first, or "unchanged" and what
// runs; led by "holds no plan" when the agent says it holds none (it
// found none in the stream at its start: the reconciler publishes the
// node's plan again). plan is the node's newest plan stored before the
// have (0: none): one at or after where the agent looked
// (events.Have.LookedBefore) is one it gets from its follow, not one it
// lacks, and the summary says so (an agent older than the rule that its
// haves stop saying no plan once it takes one says it until that plan
// settles: a fresh user's finding m2).
func haveSummaryAfter(h, prev *events.Have, plan uint64) string {
	var s string
	// Files newly reported missing lead: they are what the knock after
	// the have answers, and said after the modules a line cut them off
	// (a fresh user's finding, fresh12 m1: "have unchanged: …" for the
	// very have that reported a file gone).
	newMissing := len(h.Missing) > 0 && (prev == nil || !slices.Equal(h.Missing, prev.Missing))
	switch {
	case prev == nil:
		s = haveSummary(h)
	default:
		if c := haveChanges(prev, h); len(c) > 0 {
			s = strings.Join(c, "; ")
		} else if !newMissing {
			s = "unchanged: " + haveSummary(h)
		}
	}
	if newMissing {
		s = strings.TrimSuffix("missing on the node: "+missingFiles(h.Missing)+"; "+s, "; ")
	}
	switch {
	case h.NoPlan && h.LookedBefore != 0 && plan >= h.LookedBefore:
		s = fmt.Sprintf("takes plan #%d (stored after the agent's start), not settled yet; ", plan) + s
	case h.NoPlan:
		s = "holds no plan (none in the stream at the agent's start); " + s
	}
	if len(h.Missing) > 0 && !newMissing {
		s += "; missing on the node: " + missingFiles(h.Missing)
	}
	return s
}

// missingFiles says the files a have reports missing (events.Have.Missing):
// "app /run/app/token (gone at the agent's start), app /run/app/ca".
func missingFiles(ms []events.MissingFile) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = m.Module + " " + events.Text(m.Path)
		if m.AtStart {
			parts[i] += " (gone at the agent's start)"
		}
	}
	return strings.Join(parts, ", ")
}
