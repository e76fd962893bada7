package reconcile

import (
	"math"

	"github.com/meshfold/meshfold/events"
)

// Caps are the caps a test folds under; a zero lifts its cap.
type Caps struct {
	Unsettled, Owed, Approvals, ModuleApprovals, Accepting, Filled, Waivers int
}

// NewStateCapped returns node's empty state whose records are bounded by
// c instead of the constants of limits.go: with Caps{}, a fold without
// caps, which the property that a bounded fold equals an unbounded one
// below the caps compares with. A snapshot of it does not keep its caps.
func NewStateCapped(node string, c Caps) *State {
	or := func(n int) int {
		if n == 0 {
			return math.MaxInt
		}
		return n
	}
	s := NewState(node)
	s.caps = &caps{unsettled: or(c.Unsettled), owed: or(c.Owed), approvals: or(c.Approvals),
		moduleApprovals: or(c.ModuleApprovals), accepting: or(c.Accepting), filled: or(c.Filled), waivers: or(c.Waivers)}
	return s
}

// MarshalSummaryJSON is format 1 of the fleet summary, as builds before
// format 2 wrote it.
var MarshalSummaryJSON = marshalSummaryJSON

// MarshalSummaryView encodes v, a fleet summary (View.FleetSummary), in
// this build's format.
func MarshalSummaryView(v View) []byte { return marshalSummaryBinary(v, 1) }

// SummaryFormats decodes a summary MarshalSummary wrote: its view, and the
// snapshot format it names (-1 when it does not decode).
func SummaryFormats(data []byte) (View, int) {
	v, snapshot, err := unmarshalSummaryBinary(data[len(summaryPrefix):], SummaryFormat)
	if err != nil {
		return View{}, -1
	}
	return v, snapshot
}

// FoldUncounted is Fold without the noisy rule (folder.traffic): what a
// fold made before the rule existed, which the property that counting
// changes nothing but the journal compares with. It must stay Fold less
// that one call.
func (s *State) FoldUncounted(ev events.Event) []Effect {
	if ev.Seq <= s.Seq {
		return nil
	}
	s.Seq = ev.Seq
	f := folder{s: s, ev: ev}
	f.fold()
	return f.out
}
