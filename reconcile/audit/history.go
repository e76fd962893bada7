package audit

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// Errors of this package.
var (
	// ErrNotInHistory: the sequence is not one of the node's events.
	ErrNotInHistory = errors.New("audit: not an event of the node")
	// ErrBadBound: a bound is neither a stream sequence nor an RFC 3339
	// time.
	ErrBadBound = errors.New("audit: a bound is a stream sequence (1, 2, …) or an RFC 3339 time")
)

// History is one node's events in stream order (strictly increasing
// sequences), every kind included: the inputs the fold reads, and the
// plans, knocks and journal entries the reconciler published.
type History struct {
	Node   string
	Events []events.Event
	// Partial is set when Events were read only up to a bound: the node
	// may have later events, so a bound after the last of Events is not
	// after the node's last event.
	Partial bool
	// First is the node's first event when a read up to a bound ended
	// before it (Events is empty): the bound's notes say it is before
	// that event, where an empty history is a node with no events. nil
	// otherwise.
	First *events.Event
	// Rollout marks, by sequence, the wants a rollout step published
	// (DESIGN.md §11), as the caller read them from each want's message
	// id and why header; nil when none.
	Rollout map[uint64]RolloutStep
}

// RolloutStep is the rollout step that published a want: the fleet, the
// rollout (its start's sequence), the step (forward: the target's new
// want; revert: its previous want given back) and why, as the rollout
// decided it (its batch, who applied and why, who promoted or reverted).
// Its JSON field names are stable.
type RolloutStep struct {
	Fleet   string `json:"fleet"`
	Rollout uint64 `json:"rollout"`
	Step    string `json:"step"`
	Why     string `json:"why,omitempty"`
}

// Short is the step as a timeline line begins it, short enough to leave
// the want's change whole within [LineWidth]: "rollout #93 canary",
// "rollout #93 batch 2/3", "rollout #93 revert" (a rollout's id, its
// start's sequence, names it in every fleet). [RolloutStep.Text] says it
// whole.
func (r RolloutStep) Short() string {
	s := fmt.Sprintf("rollout #%d ", r.Rollout)
	var batch, batches int
	switch {
	case r.Step != "forward":
		return s + r.Step
	case strings.HasPrefix(r.Why, "the canary"):
		return s + "canary"
	}
	if _, err := fmt.Sscanf(r.Why, "batch %d of %d", &batch, &batches); err == nil {
		return s + fmt.Sprintf("batch %d/%d", batch, batches)
	}
	return s + r.Step
}

// Text is the step in words: "rollout web #93, forward step: the canary,
// batch 1 of 3; applied by alice".
func (r RolloutStep) Text() string {
	s := fmt.Sprintf("rollout %s #%d, %s step", r.Fleet, r.Rollout, r.Step)
	if r.Why != "" {
		s += ": " + r.Why
	}
	return s
}

// step returns the rollout step that published the want ev, if any.
func (h *History) step(ev events.Event) (RolloutStep, bool) {
	if ev.Kind != events.KindWant {
		return RolloutStep{}, false
	}
	st, ok := h.Rollout[ev.Seq]
	return st, ok
}

// summary is [Summary], but a rollout step's want begins with its step
// and tells only what changed (its module and file counts left out, so
// that the change fits the line).
func (h *History) summary(ev events.Event, prev *events.Want) string {
	st, ok := h.step(ev)
	w, isWant := ev.Payload.(*events.Want)
	if !ok || !isWant || ev.Err != nil {
		return Summary(ev, prev)
	}
	return st.Short() + ": " + wantChange(w, prev)
}

// NewHistory checks that evs are node's events in strictly increasing
// sequence order and returns them as a History (evs is not copied).
//
// Errors: an event of another node, or out of order.
func NewHistory(node string, evs []events.Event) (*History, error) {
	for i, ev := range evs {
		if ev.Node != node {
			return nil, fmt.Errorf("audit: event #%d is of node %q, not %q", ev.Seq, ev.Node, node)
		}
		if i > 0 && ev.Seq <= evs[i-1].Seq {
			return nil, fmt.Errorf("audit: event #%d after #%d: not in stream order", ev.Seq, evs[i-1].Seq)
		}
	}
	return &History{Node: node, Events: evs}, nil
}

// Index returns the position of the event with sequence seq.
func (h *History) Index(seq uint64) (int, bool) {
	return slices.BinarySearchFunc(h.Events, seq, func(ev events.Event, s uint64) int {
		switch {
		case ev.Seq < s:
			return -1
		case ev.Seq > s:
			return 1
		}
		return 0
	})
}

// Event returns the event with sequence seq.
func (h *History) Event(seq uint64) (events.Event, bool) {
	i, ok := h.Index(seq)
	if !ok {
		return events.Event{}, false
	}
	return h.Events[i], true
}

// Fold folds the first n events into a new state with the reconciler's
// fold and returns it. Effects are discarded: they are on the stream
// already (the plans among the events bind the plans the fold emits).
func (h *History) Fold(n int) *reconcile.State {
	st := reconcile.NewState(h.Node)
	for _, ev := range h.Events[:n] {
		st.Fold(ev)
	}
	return st
}

// Bound is an end of a range of events: a stream sequence, or a time with
// the unit it was written in.
type Bound struct {
	// Seq is the sequence bound; used when Time is zero.
	Seq uint64
	// Time is the time bound, and Unit the precision it was written in
	// (1s for "…05Z", 1ms for "…05.120Z"): the bound covers
	// [Time, Time+Unit).
	Time time.Time
	Unit time.Duration
	// Text is the bound as written.
	Text string
}

// IsTime reports whether b is a time bound.
func (b Bound) IsTime() bool { return !b.Time.IsZero() }

// String returns the bound as written, or a canonical form.
func (b Bound) String() string {
	switch {
	case b.Text != "":
		return b.Text
	case b.IsTime():
		return b.Time.UTC().Format(time.RFC3339Nano)
	}
	return "#" + strconv.FormatUint(b.Seq, 10)
}

// SeqBound returns the bound of sequence seq.
func SeqBound(seq uint64) Bound { return Bound{Seq: seq, Text: "#" + strconv.FormatUint(seq, 10)} }

// ParseBound reads a bound: a stream sequence ("1234", or "#1234") or an
// RFC 3339 time ("2026-11-03T20:50:05Z", fractions allowed). The unit of a
// time is that of its last digit.
//
// Errors: [ErrBadBound] for anything else, or sequence 0.
func ParseBound(s string) (Bound, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "#")
	if n, err := strconv.ParseUint(t, 10, 64); err == nil {
		if n == 0 {
			return Bound{}, fmt.Errorf("%w: %q: sequences start at 1", ErrBadBound, s)
		}
		return SeqBound(n), nil
	}
	tm, err := time.Parse(time.RFC3339Nano, t)
	if err != nil {
		return Bound{}, fmt.Errorf("%w: %q", ErrBadBound, s)
	}
	unit := time.Second
	if i := strings.IndexByte(t, '.'); i >= 0 {
		digits := 0
		for _, c := range t[i+1:] {
			if c < '0' || c > '9' {
				break
			}
			digits++
		}
		for range digits {
			unit /= 10
		}
		unit = max(unit, time.Nanosecond)
	}
	return Bound{Time: tm.UTC(), Unit: unit, Text: s}, nil
}

// atOrBefore reports whether ev is at or before b ("until" semantics).
func (b Bound) atOrBefore(ev events.Event) bool {
	if b.IsTime() {
		return ev.Time.Before(b.Time.Add(b.Unit))
	}
	return ev.Seq <= b.Seq
}

// Until returns how many of the node's events are at or before b (the
// events a fold "as of b" takes), and a note when b does not name one of
// the node's events exactly: which events it falls between, or that it is
// before the first or after the last; for a time, also when several events
// share the bound's time (all of them are in).
func (h *History) Until(b Bound) (n int, note string) {
	// A linear scan, not a binary search: stream times are not
	// guaranteed to be monotonic (a server clock can step back), and the
	// fold needs a prefix. The cut is the first event after the bound.
	for n < len(h.Events) && b.atOrBefore(h.Events[n]) {
		n++
	}
	return n, h.note(b, n, "until")
}

// Since returns the position of the first of the node's events at or
// after b: events from it on are at or after b. For a time, an event is at
// or after b when its time is at or after b.Time. The note is as for
// [History.Until].
func (h *History) Since(b Bound) (i int, note string) {
	for i < len(h.Events) && !b.atOrAfter(h.Events[i]) {
		i++
	}
	return i, h.note(b, i, "since")
}

// atOrAfter reports whether ev is at or after b ("since" semantics).
func (b Bound) atOrAfter(ev events.Event) bool {
	if b.IsTime() {
		return !ev.Time.Before(b.Time)
	}
	return ev.Seq >= b.Seq
}

// note explains where b falls. cut is the position of the first event
// after the bound (until) or the first event in it (since).
func (h *History) note(b Bound, cut int, which string) string {
	evs := h.Events
	if len(evs) == 0 && h.First != nil {
		if which == "since" {
			return "" // the read ended at an earlier until: its note says where
		}
		return fmt.Sprintf("%s %s: %s has no event at or before it; its first event is %s", which, b, h.Node, ref(*h.First))
	}
	if len(evs) == 0 {
		return fmt.Sprintf("%s %s: %s has no events", which, b, h.Node)
	}
	// The events that match the bound exactly.
	var exact []events.Event
	for _, ev := range evs {
		if b.IsTime() {
			if !ev.Time.Before(b.Time) && ev.Time.Before(b.Time.Add(b.Unit)) {
				exact = append(exact, ev)
			}
		} else if ev.Seq == b.Seq {
			exact = append(exact, ev)
		}
	}
	switch {
	case len(exact) == 1:
		return ""
	case len(exact) > 1:
		return fmt.Sprintf("%s %s: %d events share that time (#%d to #%d): all of them are in",
			which, b, len(exact), exact[0].Seq, exact[len(exact)-1].Seq)
	}
	what := "no event of " + h.Node + " is at " + b.String()
	if !b.IsTime() {
		what = "#" + strconv.FormatUint(b.Seq, 10) + " is not an event of " + h.Node
	}
	// Without an exact match, the bound falls between evs[cut-1] and
	// evs[cut] for both semantics.
	switch {
	case cut == 0:
		return fmt.Sprintf("%s %s: %s; it is before %s's first event %s", which, b, what, h.Node, ref(evs[0]))
	case cut == len(evs) && h.Partial:
		return fmt.Sprintf("%s %s: %s; the last event of %s at or before it is %s", which, b, what, h.Node, ref(evs[len(evs)-1]))
	case cut == len(evs):
		return fmt.Sprintf("%s %s: %s; it is after %s's last event %s", which, b, what, h.Node, ref(evs[len(evs)-1]))
	}
	return fmt.Sprintf("%s %s: %s; it falls between %s and %s", which, b, what, ref(evs[cut-1]), ref(evs[cut]))
}

// ref names an event: #seq kind (time).
func ref(ev events.Event) string {
	return fmt.Sprintf("#%d %s (%s)", ev.Seq, ev.Kind, FormatTime(ev.Time))
}

// FormatTime is the time format of every text output: RFC 3339 UTC with
// milliseconds.
func FormatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
