package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// TestGoldenUpgradeGates is the approval gate across an upgrade
// (docs/architecture.md, "The gate is set only by a want that says so"),
// on every golden: the streams older builds wrote, where ace's want
// marked web requires_approval and a later want dropped the flag, fold
// under today's build to no gate and web composed at the want's build,
// as they did; the wants this build writes after it (events.Stamp) gate
// web, and neither a want without the flag nor one written as an older
// build writes it (no "gates", which the controller's credentials can
// publish) lifts the gate.
func TestGoldenUpgradeGates(t *testing.T) {
	t.Parallel()
	eachGolden(t, func(t *testing.T, g golden) {
		subj := events.Subjects{}
		ace := reconcile.NewState("ace")
		var last uint64
		for _, m := range g.msgs {
			last = m.Seq
			node, kind, err := subj.Parse(m.Subject)
			if err != nil || !kind.Input() || node != "ace" {
				continue
			}
			ev := events.Event{Seq: m.Seq, Time: m.Time, Node: node, Kind: kind}
			ev.Payload, ev.Err = events.Decode(kind, m.Data)
			ace.Fold(ev)
		}
		if ace.Want == nil || !slices.ContainsFunc(ace.Want.Modules, func(m events.WantModule) bool { return m.Name == "web" }) {
			t.Fatal("the golden's ace wants no web: the test's premise is gone")
		}
		if _, gated := ace.Gated("web"); gated || len(ace.Gates) != 0 {
			t.Fatalf("the older build's stream folds to gates %+v, want none", ace.Gates)
		}
		web := func() events.PlanModule {
			t.Helper()
			for _, row := range ace.Emitted().Modules {
				if row.Name == "web" {
					return row
				}
			}
			t.Fatal("ace's newest plan has no web row")
			return events.PlanModule{}
		}
		if row := web(); row.Held || row.Build != "web:3" {
			t.Fatalf("ace's web after the older build's stream: %+v, want composed at web:3 as before the upgrade", row)
		}

		// After the upgrade: this build's wants, then one written as an
		// older build writes it.
		want := func(build string, flag, stamped bool) {
			t.Helper()
			w := &events.Want{Modules: slices.Clone(ace.Want.Modules)}
			for i := range w.Modules {
				if w.Modules[i].Name == "web" {
					w.Modules[i].Build, w.Modules[i].RequiresApproval = build, flag
				}
			}
			events.Stamp(w, time.Now())
			w.Gates = stamped
			last++
			effs := ace.Fold(events.Event{Seq: last, Time: time.Now(), Node: "ace", Kind: events.KindWant, Payload: w})
			// Each plan effect is folded as the reconciler folds its own
			// plan when it lands.
			for _, e := range effs {
				last++
				ace.Fold(events.Event{Seq: last, Time: time.Now(), Node: "ace", Kind: e.Kind, Payload: e.Payload})
			}
		}
		want("web:4", true, true)
		if g, gated := ace.Gated("web"); !gated || g.By != "" {
			t.Fatalf("this build's flagged want: gate %+v %v, want web gated by the want", g, gated)
		}
		if row := web(); !row.Held || row.Why != events.HoldApproval || row.Build != "web:3" {
			t.Fatalf("this build's flagged want: web %+v, want held for an approval at web:3", row)
		}
		for _, c := range []struct {
			build   string
			stamped bool
		}{{"web:5", true}, {"web:6", false}} {
			want(c.build, false, c.stamped)
			if _, gated := ace.Gated("web"); !gated {
				t.Fatalf("a want (gates %v) without the flag lifted the gate", c.stamped)
			}
			if row := web(); !row.Held || row.Build != "web:3" || row.Pending != c.build {
				t.Fatalf("a want (gates %v) of %s without the flag: web %+v, want held at web:3", c.stamped, c.build, row)
			}
		}
	})
}
