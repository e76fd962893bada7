package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// flapSim drives a healthHold as the agent does, on a simulated clock:
// a look at what runs on every change of the check (observe), and a have
// on every change that alters what the have says, at most one a
// haveEvery, plus one when a held recovery ends.
type flapSim struct {
	h         *healthHold
	since     time.Time
	haveEvery time.Duration
	last      time.Time // the last have's time
	said      events.Health
	haves     int
	// words are the haves' words of app, with their times.
	words []timedWord
}

type timedWord struct {
	at   time.Time
	word events.Health
}

func (s *flapSim) mods(word events.Health) []events.HaveModule {
	since := s.since
	return []events.HaveModule{{Name: "app", Build: "a:1", State: events.Running, Since: &since, Health: word}}
}

// step is the check saying word at now, and the haves that follow up to
// next (the next change of the check).
func (s *flapSim) step(word events.Health, now, next time.Time) {
	s.h.observe(s.mods(word), now)
	at := now
	for {
		if !s.last.IsZero() && at.Before(s.last.Add(s.haveEvery)) {
			at = s.last.Add(s.haveEvery)
		}
		if !at.Before(next) {
			return
		}
		out := s.h.report(s.mods(word), at)
		if out[0].Health != s.said {
			s.h.stored(out, at)
			s.said, s.last = out[0].Health, at
			s.haves++
			s.words = append(s.words, timedWord{at, out[0].Health})
		}
		due := s.h.due()
		if due.IsZero() || !due.After(at) || !due.Before(next) {
			return
		}
		at = due
	}
}

func newFlapSim(base time.Duration) *flapSim {
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	return &flapSim{h: newHealthHold(base), since: t0, haveEvery: time.Second, last: time.Time{}}
}

// A check failing 4 s and passing 4 s (a fresh user's finding M5: one
// have per transition, 30 in 100 s) is one have a day held: its fall;
// its recoveries, each shorter than the hold, are never reported.
func TestHealthHoldFlappingCheck(t *testing.T) {
	s := newFlapSim(0)
	t0 := s.since
	s.step(events.HealthStarting, t0, t0.Add(time.Second))
	s.step(events.Healthy, t0.Add(time.Second), t0.Add(10*time.Second))
	before := s.haves // starting, healthy
	at := t0.Add(10 * time.Second)
	for i := 0; at.Before(t0.Add(24 * time.Hour)); i++ {
		word := events.Unhealthy
		if i%2 == 1 {
			word = events.Healthy
		}
		s.step(word, at, at.Add(4*time.Second))
		at = at.Add(4 * time.Second)
	}
	t.Logf("a check flapping 4 s/4 s for a day: %d have(s) of its word after the first healthy", s.haves-before)
	if got := s.haves - before; got != 1 {
		t.Fatalf("a check flapping 4 s/4 s for a day: %d haves of its word, want 1 (the fall): %v", got, s.words)
	}
	if s.said != events.Unhealthy {
		t.Errorf("the haves say %s of a check that never passed for its hold, want unhealthy", s.said)
	}
}

// A flap slower than the hold is reported, recovery after the hold, and
// each flap within healthFlapWindow of the last reported recovery
// doubles the hold, up to MaxHealthHold; a day of it stays within two
// haves per MaxHealthHold. A healthy spell longer than the window starts
// the next flap at the first hold.
func TestHealthHoldDoublesAndResets(t *testing.T) {
	s := newFlapSim(10 * time.Second)
	t0 := s.since
	s.step(events.Healthy, t0, t0.Add(time.Second))
	at := t0.Add(time.Second)
	// Spells of 20 s failing, 400 s passing: longer than any hold.
	var recoveries []time.Duration // how long each recovery was held
	for at.Before(t0.Add(24 * time.Hour)) {
		s.step(events.Unhealthy, at, at.Add(20*time.Second))
		pass := at.Add(20 * time.Second)
		n := len(s.words)
		s.step(events.Healthy, pass, pass.Add(400*time.Second))
		if len(s.words) > n && s.words[len(s.words)-1].word == events.Healthy {
			recoveries = append(recoveries, s.words[len(s.words)-1].at.Sub(pass))
		}
		at = pass.Add(400 * time.Second)
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 300 * time.Second, 300 * time.Second}
	for i, w := range want {
		if i >= len(recoveries) || recoveries[i] != w {
			t.Fatalf("recoveries held %v, want them to start %v", recoveries, want)
		}
	}
	day := 24 * time.Hour
	t.Logf("a day of a check failing 20 s, passing 400 s: %d haves of its word (%d recoveries reported)", s.haves, len(recoveries))
	if limit := int(2 * day / MaxHealthHold); s.haves > limit {
		t.Errorf("a day of a slow flap: %d haves, want at most %d (two per MaxHealthHold)", s.haves, limit)
	}

	// Healthy for longer than the window: the next fall starts afresh.
	at = at.Add(healthFlapWindow)
	s.step(events.Healthy, at.Add(-healthFlapWindow), at)
	s.step(events.Unhealthy, at, at.Add(5*time.Second))
	s.step(events.Healthy, at.Add(5*time.Second), at.Add(time.Minute))
	if w := s.words[len(s.words)-1]; w.word != events.Healthy || w.at.Sub(at.Add(5*time.Second)) != 10*time.Second {
		t.Errorf("after a healthy spell longer than the flap window: %v, want healthy reported 10s after the pass", s.words[len(s.words)-3:])
	}
}

// A new run (a restart: another since) is not held: its first words are
// reported as the check says them.
func TestHealthHoldNewRunNotHeld(t *testing.T) {
	h := newHealthHold(time.Minute)
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	run := func(since time.Time, word events.Health) []events.HaveModule {
		return []events.HaveModule{{Name: "app", Build: "a:1", State: events.Running, Since: &since, Health: word}}
	}
	for i, w := range []events.Health{events.Healthy, events.Unhealthy} {
		at := t0.Add(time.Duration(i) * time.Second)
		h.stored(h.report(run(t0, w), at), at)
	}
	at := t0.Add(2 * time.Second)
	if got := h.report(run(t0, events.Healthy), at)[0].Health; got != events.Unhealthy {
		t.Errorf("the same run's recovery at once: reported %s, want unhealthy (held)", got)
	}
	if got := h.report(run(at, events.Healthy), at)[0].Health; got != events.Healthy {
		t.Errorf("a new run's healthy: reported %s, want healthy", got)
	}
}

// Property: whatever the check says when, a have reports a module
// healthy only when its check was seen healthy (the hold reports a
// module unhealthy longer, never healthy longer), and a recovery of the
// same run only after the check passed for at least the first hold.
func TestHealthHoldNeverHealthierThanTheCheck(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		s := newFlapSim(time.Duration(1+r.IntN(20)) * time.Second)
		s.haveEvery = time.Duration(r.IntN(3)) * time.Second
		at := s.since
		type spell struct {
			from, to time.Time
			word     events.Health
		}
		var spells []spell
		word := events.HealthStarting
		for range 300 {
			d := time.Duration(1+r.IntN(40000)) * time.Millisecond
			if n := len(spells); n > 0 && spells[n-1].word == word {
				spells[n-1].to = at.Add(d) // the check said it again: one spell
			} else {
				spells = append(spells, spell{at, at.Add(d), word})
			}
			s.step(word, at, at.Add(d))
			at = at.Add(d)
			word = []events.Health{events.Healthy, events.Unhealthy}[r.IntN(2)]
		}
		checkAt := func(t time.Time) spell {
			for _, sp := range spells {
				if !t.Before(sp.from) && t.Before(sp.to) {
					return sp
				}
			}
			panic(fmt.Sprint("no spell at ", t))
		}
		said := events.Health("")
		for _, w := range s.words {
			sp := checkAt(w.at)
			if w.word == events.Healthy && sp.word != events.Healthy {
				t.Fatalf("seed %d: a have at %s says healthy while the check said %s", seed, w.at, sp.word)
			}
			if w.word == events.Healthy && said == events.Unhealthy && w.at.Sub(sp.from) < s.h.base {
				t.Fatalf("seed %d: a recovery reported %s after the check passed, under the hold %s", seed, w.at.Sub(sp.from), s.h.base)
			}
			said = w.word
		}
	}
}

// healthRuntime is a DirRuntime whose modules' checks say what the test
// sets, a Supervisor that reports each word set as a change.
type healthRuntime struct {
	*DirRuntime
	changes chan struct{}
	mu      sync.Mutex
	word    map[string]events.Health
}

func (h *healthRuntime) Changes() <-chan struct{}       { return h.changes }
func (h *healthRuntime) Filled(context.Context, string) {}

func (h *healthRuntime) Running(ctx context.Context) ([]events.HaveModule, error) {
	mods, err := h.DirRuntime.Running(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range mods {
		mods[i].Health = h.word[mods[i].Name]
	}
	return mods, err
}

// set makes module's check say word, and reports the change once the
// agent took the one before (as the process runtime reports each word).
func (h *healthRuntime) set(module string, word events.Health) {
	h.mu.Lock()
	h.word[module] = word
	h.mu.Unlock()
	h.changes <- struct{}{}
}

// The agent holds a flapping check's recoveries (a fresh user's finding
// M5: 30 haves in 100 s of a check failing 4 s, passing 4 s): the fall
// is a have at once; a check that passes again, fails, passes… adds no
// have while each pass is shorter than the hold, and a have reports it
// healthy once it has passed for the hold.
func TestAgentHoldsFlappingCheck(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "records"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &healthRuntime{DirRuntime: dr, changes: make(chan struct{}, 1), word: map[string]events.Health{"app": events.Healthy}}
	const hold = 3 * time.Second
	e.startAgentIn(t, "ace", filepath.Join(dir, "root"), filepath.Join(dir, "state"), rt,
		func(c *Config) { c.HaveEvery, c.HealthHold = 10*time.Millisecond, hold })
	word := func(m store.Msg) events.Health {
		for _, mod := range m.Event.Payload.(*events.Have).Modules {
			if mod.Name == "app" {
				return mod.Health
			}
		}
		return ""
	}
	p := e.publishPlan(t, "ace", "", events.PlanModule{Name: "app", Build: "a:1"})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
	e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return word(m) == events.Healthy })
	rt.set("app", events.Unhealthy)
	fall := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return word(m) == events.Unhealthy })
	for range 10 {
		rt.set("app", events.Healthy)
		rt.set("app", events.Unhealthy)
	}
	passed := time.Now() // before the word: the agent sees it after
	rt.set("app", events.Healthy)
	back := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return m.Event.Seq > fall.Event.Seq && word(m) == events.Healthy })
	if d := time.Since(passed); d < hold {
		t.Errorf("the recovery was reported %s after the check passed, want at least the hold %s", d, hold)
	}
	var between []uint64
	for _, m := range e.events(t, "ace", events.KindHave) {
		if m.Event.Seq > fall.Event.Seq && m.Event.Seq < back.Event.Seq {
			between = append(between, m.Event.Seq)
		}
	}
	if len(between) > 0 {
		t.Errorf("haves %v between the fall #%d and the recovery #%d of a check that flapped 10 times within its hold, want none", between, fall.Event.Seq, back.Event.Seq)
	}
	// A fall after the recovery is reported at once again.
	rt.set("app", events.Unhealthy)
	e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return m.Event.Seq > back.Event.Seq && word(m) == events.Unhealthy })
}
