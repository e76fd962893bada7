package node

import (
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
)

// DefaultHealthHold is the hold of a module's recovery when Config.HealthHold is 0: a run's
// check that was reported unhealthy is reported healthy again once it has
// passed for this long without a break.
const DefaultHealthHold = 10 * time.Second

// MaxHealthHold is the longest hold a flapping check's recoveries reach
// (doubling from Config.HealthHold), unless Config.HealthHold is longer.
const MaxHealthHold = 5 * time.Minute

// healthFlapWindow: a fall reported within it of the run's last reported
// recovery is a flap, and doubles the module's hold; a fall after a
// longer healthy spell starts from the first hold again.
const healthFlapWindow = 10 * time.Minute

// healthHold damps the haves of a flapping health check (DESIGN.md §11
// "Health"; docs/architecture.md, "A flapping check's recoveries are
// held"). A module's fall (its check's word becomes unhealthy) goes into
// the next have as any change does; its recovery within the same run
// (unhealthy, then healthy, at the same build and since) goes into a have
// only once the check has passed for the module's hold without a break,
// as the agent saw it. The hold starts at base and doubles, up to max,
// with each fall that comes within healthFlapWindow of the run's last
// reported recovery. A check failing and passing faster than its hold is
// then one have (the fall) for as long as it flaps, where it was one have
// per transition; a flap slower than the hold adds at most two haves per
// hold. The hold only ever reports a module unhealthy longer, never
// healthy longer: a rollout's min_healthy window counts from the have
// that reports the recovery, so it judges no module healthy that its
// check did not find healthy for min_healthy and more.
//
// A new run of the module (a restart, another build) starts afresh: its
// first words (starting, healthy) are not held, and its hold is base (a
// crash loop is the restarts' to bound). An agent's start reports what
// the checks say: it remembers no fall its predecessor reported.
type healthHold struct {
	base, max time.Duration

	mu   sync.Mutex
	mods map[string]*heldHealth
}

// heldHealth is what healthHold knows of one module.
type heldHealth struct {
	run       runOf         // the run the rest is of
	said      events.Health // the word of the last have stored
	passSince time.Time     // since when the check passes, as seen; zero while it does not
	hold      time.Duration
	recovered time.Time // when a have last reported its recovery; zero: none in this run
}

// runOf names one run of a module: its build and since (a restart or an
// on_fill restart sets a new since).
type runOf struct {
	build string
	since time.Time
}

func runOfModule(m events.HaveModule) runOf {
	r := runOf{build: m.Build}
	if m.Since != nil {
		r.since = *m.Since
	}
	return r
}

// newHealthHold returns a healthHold whose holds start at base (0:
// DefaultHealthHold) and double up to max(MaxHealthHold, base).
func newHealthHold(base time.Duration) *healthHold {
	if base <= 0 {
		base = DefaultHealthHold
	}
	return &healthHold{base: base, max: max(MaxHealthHold, base), mods: map[string]*heldHealth{}}
}

// observe notes what the checks of mods say at now. Every look at what
// runs goes through it, so that a fall and its recovery between two haves
// still restarts the hold.
func (h *healthHold) observe(mods []events.HaveModule, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observeLocked(mods, now)
}

func (h *healthHold) observeLocked(mods []events.HaveModule, now time.Time) {
	seen := make(map[string]bool, len(mods))
	for _, m := range mods {
		seen[m.Name] = true
		st := h.mods[m.Name]
		if st == nil {
			st = &heldHealth{hold: h.base}
			h.mods[m.Name] = st
		}
		if r := runOfModule(m); r != st.run {
			*st = heldHealth{run: r, hold: h.base}
		}
		switch {
		case m.State != events.Running || m.Health != events.Healthy:
			st.passSince = time.Time{}
		case st.passSince.IsZero():
			st.passSince = now
		}
	}
	for name := range h.mods {
		if !seen[name] {
			delete(h.mods, name) // removed: a module of that name again starts afresh
		}
	}
}

// report returns mods as a have at now reports them (a copy, never nil):
// a module whose recovery is held is reported unhealthy still.
func (h *healthHold) report(mods []events.HaveModule, now time.Time) []events.HaveModule {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observeLocked(mods, now)
	out := make([]events.HaveModule, len(mods))
	copy(out, mods)
	for i, m := range out {
		st := h.mods[m.Name]
		if m.State == events.Running && m.Health == events.Healthy && st.said == events.Unhealthy &&
			now.Before(st.passSince.Add(st.hold)) {
			out[i].Health = events.Unhealthy
		}
	}
	return out
}

// stored notes that a have reporting mods (as report returned them) was
// stored at now: the words the next have is told against.
func (h *healthHold) stored(mods []events.HaveModule, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range mods {
		st := h.mods[m.Name]
		if st == nil || runOfModule(m) != st.run {
			continue // gone, or a new run seen since the report
		}
		word := m.Health
		if m.State != events.Running {
			word = ""
		}
		switch {
		case st.said == events.Unhealthy && word == events.Healthy:
			st.recovered = now
		case st.said == events.Healthy && word == events.Unhealthy:
			if !st.recovered.IsZero() && now.Sub(st.recovered) < healthFlapWindow {
				st.hold = min(2*st.hold, h.max) // a flap
			} else {
				st.hold = h.base
			}
		}
		st.said = word
	}
}

// due is when the first held recovery ends (zero: none held).
func (h *healthHold) due() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var due time.Time
	for _, st := range h.mods {
		if st.said != events.Unhealthy || st.passSince.IsZero() {
			continue
		}
		if end := st.passSince.Add(st.hold); due.IsZero() || end.Before(due) {
			due = end
		}
	}
	return due
}
