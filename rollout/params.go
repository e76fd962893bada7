package rollout

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Params is a rollout's `rollout` block (DESIGN.md §11), as the operator
// wrote it; the fold resolves percentages against the rollout's own
// counts ([Params.Resolve]). The zero value of each field means its
// default.
type Params struct {
	// Batch is the size of each batch after the canary: a count or a
	// percentage of the targets (rounded up, at least 1). Default 1.
	Batch Amount `json:"batch,omitzero" yaml:"batch"`
	// MaxUnavailable is how many of the fleet's nodes may be unavailable
	// at once (a target being changed, an agent down, a module unhealthy
	// or crash-looping): a count or a percentage of the fleet's nodes
	// (rounded down, at least 1). Default 1.
	MaxUnavailable Amount `json:"max_unavailable,omitzero" yaml:"max_unavailable"`
	// Canary is the first batch's size (a count or a percentage of the
	// targets, rounded up); the rollout then waits for a promote. Default
	// 0: no canary.
	Canary Amount `json:"canary,omitzero" yaml:"canary"`
	// MinHealthy is how long every module of a target's want must run at
	// its build, healthy, without a break, for the target to be done.
	// Default 10s (nil); 0 is done as soon as every module runs healthy.
	MinHealthy *Duration `json:"min_healthy,omitempty" yaml:"min_healthy"`
	// HealthyDeadline is how long a target has, from the step that gave
	// it its want, to be done. Default 5m.
	HealthyDeadline Duration `json:"healthy_deadline,omitzero" yaml:"healthy_deadline"`
	// AutoRevert: a failure gives every changed target its previous want.
	// Default false.
	AutoRevert bool `json:"auto_revert,omitempty" yaml:"auto_revert"`
}

// Defaults of DESIGN.md §11.
const (
	DefaultMinHealthy      = 10 * time.Second
	DefaultHealthyDeadline = 5 * time.Minute
)

// MaxDuration bounds min_healthy and healthy_deadline: a week. A rollout
// that waits longer for one target is not a rollout.
const MaxDuration = 7 * 24 * time.Hour

// Resolved is Params with every default applied and every percentage
// turned into a count.
type Resolved struct {
	Batch, MaxUnavailable, Canary int
	MinHealthy, HealthyDeadline   time.Duration
	AutoRevert                    bool
}

// Resolve applies the defaults and turns percentages into counts: batch
// and canary of targets (rounded up), max_unavailable of nodes, the
// fleet's owned nodes (rounded down); batch and max_unavailable are at
// least 1, canary at most targets.
func (p Params) Resolve(targets, nodes int) Resolved {
	r := Resolved{
		Batch:           max(1, p.Batch.of(targets, true, 1)),
		MaxUnavailable:  max(1, p.MaxUnavailable.of(nodes, false, 1)),
		Canary:          min(targets, p.Canary.of(targets, true, 0)),
		MinHealthy:      DefaultMinHealthy,
		HealthyDeadline: time.Duration(p.HealthyDeadline),
		AutoRevert:      p.AutoRevert,
	}
	if p.MinHealthy != nil {
		r.MinHealthy = time.Duration(*p.MinHealthy)
	}
	if p.HealthyDeadline == 0 {
		r.HealthyDeadline = DefaultHealthyDeadline
	}
	return r
}

// CanaryCoversAll says, when the canary batch would hold every one of
// targets (canary set, and at least as many as the targets), what that
// means: the rollout changes every target in its first batch (within
// max_unavailable), then waits for a promote that has no batch left to
// start. "" otherwise. Such a rollout is valid (an apply that changes one
// node of a fleet whose file says canary 2 makes one), so apply and its
// dry run warn rather than refuse (a fresh user's finding: canary 9 in a
// 4-node fleet made every node a canary without a word).
func (p Params) CanaryCoversAll(targets int) string {
	if p.Canary.IsZero() || targets == 0 {
		return ""
	}
	c := p.Canary.of(targets, true, 0)
	if c < targets {
		return ""
	}
	amount := "canary " + p.Canary.String()
	switch {
	case c > targets:
		amount += fmt.Sprintf(" is more than the %d targets (cut to %d)", targets, targets)
	case targets == 1:
		amount += " holds the only target"
	default:
		amount += fmt.Sprintf(" holds all %d targets", targets)
	}
	return amount + ": every target is a canary, changed in the first batch (within max_unavailable), " +
		"and the promote it then waits for only ends the rollout; to try the build on a few nodes first, set canary below the number of targets"
}

// Validate checks each field: counts from 1 (canary from 0), percentages
// from 1 to 100, durations from 0 (min_healthy) or above 0
// (healthy_deadline) to [MaxDuration]. Errors name the field.
func (p Params) Validate() error {
	if err := p.Batch.check("batch", 1); err != nil {
		return err
	}
	if err := p.MaxUnavailable.check("max_unavailable", 1); err != nil {
		return err
	}
	if err := p.Canary.check("canary", 0); err != nil {
		return err
	}
	if p.MinHealthy != nil {
		if d := time.Duration(*p.MinHealthy); d < 0 || d > MaxDuration {
			return fmt.Errorf("min_healthy %s: %w", d, ErrBadDuration)
		}
	}
	if d := time.Duration(p.HealthyDeadline); d < 0 || d > MaxDuration {
		return fmt.Errorf("healthy_deadline %s: %w", d, ErrBadDuration)
	}
	return nil
}

// ErrNoTimeToBeDone is [Params.CheckTimes]'s error.
var ErrNoTimeToBeDone = errors.New("no target can be done in time")

// CheckTimes says whether a target can be done at all: it must run
// healthy for min_healthy within healthy_deadline of the step that gave
// it its want, so min_healthy (default 10s) must be below
// healthy_deadline (default 5m); otherwise every target fails at its
// deadline by construction and auto_revert reverts a good build (a
// fresh user's finding U30). The error names min_healthy's field when
// the file set it, else healthy_deadline's, and says which value is a
// default. It is not part of [Params.Validate]: a start already in a
// stream stays readable; fleet files refuse such a block.
func (p Params) CheckTimes() (field string, err error) {
	r := p.Resolve(1, 1)
	if r.MinHealthy < r.HealthyDeadline {
		return "", nil
	}
	mh, hd := "min_healthy "+r.MinHealthy.String(), "healthy_deadline "+r.HealthyDeadline.String()
	field = "min_healthy"
	if p.MinHealthy == nil {
		mh, field = "the default "+mh, "healthy_deadline"
	}
	if p.HealthyDeadline == 0 {
		hd = "the default " + hd
	}
	return field, fmt.Errorf("%s is not below %s: %w", mh, hd, ErrNoTimeToBeDone)
}

// ErrBadAmount and ErrBadDuration are the errors of [Params.Validate] and
// of decoding an [Amount] or a [Duration].
var (
	ErrBadAmount   = errors.New("must be a count, or a percentage from 1% to 100%")
	ErrBadDuration = errors.New("must be a duration from 0 to 168h (\"10s\", \"5m\")")
)

// Amount is a count or a percentage: `2` or `"25%"` in YAML and JSON. The
// zero value means "not set" (the field's default).
type Amount struct {
	N       int
	Percent bool
}

// Ptr returns a pointer to d, for [Params.MinHealthy].
func (d Duration) Ptr() *Duration { return &d }

// IsZero reports whether the amount was not set.
func (a Amount) IsZero() bool { return a == Amount{} }

// String writes the amount as the operator does: "2" or "25%".
func (a Amount) String() string {
	if a.Percent {
		return strconv.Itoa(a.N) + "%"
	}
	return strconv.Itoa(a.N)
}

// of returns the count the amount means among total; def when not set.
func (a Amount) of(total int, up bool, def int) int {
	switch {
	case a.IsZero():
		return def
	case !a.Percent:
		return a.N
	case up:
		return (a.N*total + 99) / 100
	default:
		return a.N * total / 100
	}
}

func (a Amount) check(field string, least int) error {
	switch {
	case a.IsZero():
		return nil
	case a.Percent && (a.N < 1 || a.N > 100), !a.Percent && (a.N < least || a.N > MaxNodes):
		return fmt.Errorf("%s %s: %w", field, a, ErrBadAmount)
	}
	return nil
}

// ParseAmount reads "2" or "25%".
func ParseAmount(s string) (Amount, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	n, err := strconv.Atoi(strings.TrimSuffix(t, "%"))
	if err != nil || n < 0 {
		return Amount{}, fmt.Errorf("%q: %w", s, ErrBadAmount)
	}
	return Amount{N: n, Percent: pct}, nil
}

// MarshalJSON writes a count as a number, a percentage as "N%".
func (a Amount) MarshalJSON() ([]byte, error) {
	if a.Percent {
		return json.Marshal(a.String())
	}
	return []byte(strconv.Itoa(a.N)), nil
}

// UnmarshalJSON reads a number or a "N%" string.
func (a *Amount) UnmarshalJSON(b []byte) error {
	var s string
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	} else {
		s = string(b)
	}
	v, err := ParseAmount(s)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Duration is a time.Duration written as Go writes one ("10s", "5m0s").
type Duration time.Duration

// String is time.Duration's.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes "10s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads "10s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", b, ErrBadDuration)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: %w", s, ErrBadDuration)
	}
	*d = Duration(v)
	return nil
}

// ViewParams is Resolved as a [View] shows it: in JSON, with the fleet
// file's own names and forms ({"batch":2,"max_unavailable":1,"canary":1,
// "min_healthy":"5s","healthy_deadline":"1m0s","auto_revert":true}), so
// that a script can compare it with the file (a fresh user's finding U3:
// Go's field names and nanoseconds). Resolved itself, stored in the
// controller's state as Rollout.R, keeps its encoding: a snapshot written
// before decodes as it did.
type ViewParams Resolved

// viewParamsJSON is ViewParams' JSON form.
type viewParamsJSON struct {
	Batch           int      `json:"batch"`
	MaxUnavailable  int      `json:"max_unavailable"`
	Canary          int      `json:"canary"`
	MinHealthy      Duration `json:"min_healthy"`
	HealthyDeadline Duration `json:"healthy_deadline"`
	AutoRevert      bool     `json:"auto_revert"`
}

// MarshalJSON writes the fleet file's names, durations as "5s".
func (p ViewParams) MarshalJSON() ([]byte, error) {
	return json.Marshal(viewParamsJSON{Batch: p.Batch, MaxUnavailable: p.MaxUnavailable, Canary: p.Canary,
		MinHealthy: Duration(p.MinHealthy), HealthyDeadline: Duration(p.HealthyDeadline), AutoRevert: p.AutoRevert})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *ViewParams) UnmarshalJSON(b []byte) error {
	var j viewParamsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*p = ViewParams{Batch: j.Batch, MaxUnavailable: j.MaxUnavailable, Canary: j.Canary,
		MinHealthy: time.Duration(j.MinHealthy), HealthyDeadline: time.Duration(j.HealthyDeadline), AutoRevert: j.AutoRevert}
	return nil
}
