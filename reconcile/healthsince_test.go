package reconcile_test

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// TestHealthStretchIsOneRun: a module's health since is the time of the
// first have of the newest stretch of haves that report the same word of
// the same run of the module (its build, its since, neither restart count
// grown), and so never before the have that first reported the process
// that runs now (a fresh user's finding m4: "healthy … 7m ago" the moment
// an on_fill restart's new process started). The haves are random: a
// resync, a restart for a fill (with and without a new since, as older
// agents), a crash's restart, another build, each with any word.
func TestHealthStretchIsOneRun(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		words := []events.Health{events.HealthStarting, events.Healthy, events.Unhealthy}
		m := events.HaveModule{Name: "app", Build: "b1", State: events.Running}
		var runFrom, stretchFrom time.Time // the model: the first have of the run, of the stretch
		var said events.Health
		for i := range rapid.IntRange(1, 30).Draw(rt, "haves") {
			at := s.TimeOf(s.Next())
			newRun := i == 0
			switch rapid.IntRange(0, 5).Draw(rt, fmt.Sprint("change", i)) {
			case 1: // an on_fill restart of this build
				m.FillRestarts++
				m.Since = &at
				newRun = true
			case 2: // an on_fill restart by an agent that kept the since
				m.FillRestarts++
				newRun = true
			case 3: // a crash's restart
				m.Restarts++
				m.Since = &at
				newRun = true
			case 4: // another build, a new apply
				m.Build = rapid.SampledFrom([]string{"b1", "b2"}).Draw(rt, "build")
				m.Restarts, m.FillRestarts, m.Since = 0, 0, &at
				newRun = true
			}
			m.Health = rapid.SampledFrom(words).Draw(rt, fmt.Sprint("word", i))
			if newRun {
				runFrom = at
			}
			if newRun || m.Health != said {
				stretchFrom = at
			}
			said = m.Health
			s.add(&events.Have{Modules: []events.HaveModule{m}})

			rs := reconcile.RuntimeOf(s.state)
			if len(rs) != 1 || rs[0].HealthSince == nil {
				rt.Fatalf("after have %d: no health since: %+v", i, rs)
			}
			got := *rs[0].HealthSince
			if got.Before(runFrom) {
				rt.Fatalf("after have %d: %s since %s, before its run's first have at %s", i, m.Health, got, runFrom)
			}
			if !got.Equal(stretchFrom) {
				rt.Fatalf("after have %d: %s since %s, want %s", i, m.Health, got, stretchFrom)
			}
		}
	})
}
