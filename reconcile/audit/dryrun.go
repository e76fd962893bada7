package audit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// DryRunText returns a dry run (`meshfold want NODE -f FILE --dry-run`)
// as lines of at most [LineWidth] columns: whether the reconciler would
// publish a plan now, the sequence the state was folded through (the want
// to pin with --expect), the difference from the last plan emitted (rows
// added, removed, changed; held rows and why) and the whole composition.
// source says where the state came from.
func DryRunText(d reconcile.DryRun, source string) string {
	var t textWriter
	t.line(0, "", fmt.Sprintf("dry run of a want for %s, against its state folded through #%d, from %s", d.Node, d.Seq, source))
	switch {
	case d.Paused != nil:
		t.line(1, "publish", fmt.Sprintf("no plan yet: the node is paused (by %s since #%d); resuming would publish this one",
			events.Text(d.Paused.By), d.Paused.Seq))
	case d.Publish:
		t.line(1, "publish", "a new plan, composed as below")
	default:
		t.line(1, "publish", "no plan: it would be the last one emitted")
	}
	if d.Returns {
		t.line(1, "retired", "the node is retiring or retired: this want brings it back")
	}
	expect := fmt.Sprintf("the newest want is #%d: publish with --expect %d to be sure nothing came in between", d.Want, d.Want)
	if d.Want == 0 {
		expect = "the node has no want yet: publish with --expect 0 to be sure none came in between"
	}
	t.line(1, "expect", expect)
	df := d.Diff
	if df.AccountFrom != df.AccountTo {
		t.line(1, "account", fmt.Sprintf("%s → %s", orNone(df.AccountFrom), orNone(df.AccountTo)))
	} else {
		t.line(1, "account", orNone(df.AccountTo)+" (unchanged)")
	}
	for _, r := range df.Added {
		t.line(1, "added", planRowText(r))
	}
	for _, r := range df.Removed {
		t.line(1, "removed", r.Name+" (the node removes it)")
	}
	for _, c := range df.Changed {
		t.line(1, "changed", c.Module+": "+changeText(c))
	}
	if !df.Rows() {
		t.line(1, "rows", "no module changes")
	}
	if users := newUsers(df); len(users) > 0 {
		t.line(1, "users", fmt.Sprintf("runs_as %s: checked by the node when it applies, not here (the node knows its users); "+
			"one it lacks fails the apply, and 'meshfold state %s' says why", strings.Join(users, ", "), d.Node))
	}
	for _, h := range df.Held {
		t.line(1, "held", HeldText(h.Module, h.Why, h.Build, h.Pending))
	}
	for _, r := range d.Modules {
		t.line(1, "plan", planRowText(r))
	}
	if len(d.Modules) == 0 {
		t.line(1, "plan", "empty: every module removed")
	}
	t.line(0, "", "-- nothing was published")
	return t.b.String()
}

// newUsers returns the runs_as accounts the diff's added rows and changed
// runs_as name, each once, in the diff's order: the users the node will
// look up when it applies, which no dry run can check.
func newUsers(df reconcile.PlanDiff) []string {
	var users []string
	add := func(u string) {
		if u != "" && !slices.Contains(users, u) {
			users = append(users, u)
		}
	}
	for _, r := range df.Added {
		add(r.RunsAs)
	}
	for _, c := range df.Changed {
		if slices.Contains(c.Fields, "runs_as") {
			add(c.To.RunsAs)
		}
	}
	return users
}

func planRowText(r events.PlanModule) string {
	if r.Held {
		return "held " + HeldText(r.Name, r.Why, r.Build, r.Pending)
	}
	s := fmt.Sprintf("%s %s as %s", r.Name, r.Build, orNone(r.RunsAs))
	if n := len(r.Files); n > 0 {
		s += ", " + plural(n, "file")
	}
	if r.Provisioner {
		s += " (provisioner)"
	}
	return s
}

// HeldText says a held row plainly: what the node keeps running of module
// (build; "" is nothing) and what the row waits for (why, pending). It
// read "nats (approval) carries (none), pending n:2", which a fresh user
// could not parse (finding U17): now "nats: nothing runs until n:2 is
// approved", "nats: keeps n:2.10 until n:2.11 is approved", "restic:
// nothing runs, held by its want (hold), which names r:1".
func HeldText(module string, why events.HoldReason, build, pending string) string {
	runs := "nothing runs"
	if build != "" {
		runs = "keeps " + build
	}
	switch why {
	case events.HoldApproval:
		if pending != "" {
			return fmt.Sprintf("%s: %s until %s is approved", module, runs, pending)
		}
		return fmt.Sprintf("%s: %s, held for an approval", module, runs)
	case events.HoldWant:
		s := fmt.Sprintf("%s: %s, held by its want (hold)", module, runs)
		if pending != "" {
			s += ", which names " + pending
		}
		return s
	}
	s := fmt.Sprintf("%s: %s, held (%s)", module, runs, why)
	if pending != "" {
		s += ", pending " + pending
	}
	return s
}
