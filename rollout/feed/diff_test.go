package feed_test

import (
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout/feed"
)

// Diff names what changes in each module: its build, and any other field
// by the name a want's JSON gives it. A changed runs_as was described
// "api (fields)", naming none.
func TestDiffNamesTheChangedFields(t *testing.T) {
	api := events.WantModule{Name: "api", Build: "a:1", RunsAs: "api"}
	web := events.WantModule{Name: "web", Build: "w:1", RunsAs: "web"}
	with := func(m events.WantModule, f func(*events.WantModule)) events.WantModule {
		f(&m)
		return m
	}
	file := []events.File{{Path: "/run/api/c", Mode: "0600"}}
	for _, c := range []struct {
		from, to []events.WantModule
		want     string
	}{
		{[]events.WantModule{api}, []events.WantModule{with(api, func(m *events.WantModule) { m.RunsAs = "nobdy" })}, "api (runs_as)"},
		{[]events.WantModule{api}, []events.WantModule{with(api, func(m *events.WantModule) { m.Files, m.Hold = file, true })}, "api (files, hold)"},
		{[]events.WantModule{api}, []events.WantModule{with(api, func(m *events.WantModule) { m.Provisioner, m.RequiresApproval = true, true })}, "api (provisioner, requires_approval)"},
		{[]events.WantModule{api}, []events.WantModule{with(api, func(m *events.WantModule) { m.Build, m.RunsAs = "a:2", "x" })}, "api a:1 → a:2 (runs_as)"},
		{[]events.WantModule{api, web}, []events.WantModule{with(api, func(m *events.WantModule) { m.Build = "a:2" }), web}, "api a:1 → a:2"},
		{[]events.WantModule{api}, []events.WantModule{api, web}, "+web w:1"},
		{[]events.WantModule{api, web}, []events.WantModule{web}, "-api"},
		{[]events.WantModule{api, web}, []events.WantModule{web, api}, "(order)"},
	} {
		if got := feed.Diff(c.from, c.to); got != c.want {
			t.Errorf("Diff(%+v, %+v) = %q, want %q", c.from, c.to, got, c.want)
		}
	}
}
