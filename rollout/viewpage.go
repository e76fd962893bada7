package rollout

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrBadStatus: a name that is not one of [TargetStatuses].
var ErrBadStatus = errors.New("rollout: no target status")

// TargetStatuses are the statuses a target of the delivery view shows
// ([TargetView.Status]), most pressing first: the order `meshfold
// rollout status` and the console count them in ([View.CountsText]) and
// sort a page of targets by ([SortPressing]). A target that needs an
// operator comes first (its apply failed, its agent was away at its
// deadline, its want was changed by hand, it waits for an approval),
// then the ones the rollout is changing, then those still to come, then
// those it no longer judges, and done last: at 300 targets the rows an
// operator reads first are the problem rows, not the done ones (a fresh
// user's finding M7).
var TargetStatuses = []Status{Failed, Unreached, Conflict, WaitingApproval, Publishing, Changing, Pending, Stopped, Skipped, Moved, Done}

// statusRank is a status's place in [TargetStatuses]; an unknown one
// ranks after them all.
func statusRank(s Status) int {
	if i := slices.Index(TargetStatuses, s); i >= 0 {
		return i
	}
	return len(TargetStatuses)
}

// ParseStatuses parses a comma-separated list of target statuses
// ("failed,changing"), as `rollout status --status` takes it.
//
// Errors: ErrBadStatus naming the status that is not one of
// [TargetStatuses].
func ParseStatuses(list string) ([]Status, error) {
	var out []Status
	for s := range strings.SplitSeq(list, ",") {
		st := Status(strings.TrimSpace(s))
		if !slices.Contains(TargetStatuses, st) {
			return nil, fmt.Errorf("%w %q: one of %s", ErrBadStatus, st, strings.Join(statusNames(), ", "))
		}
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out, nil
}

func statusNames() []string {
	names := make([]string, len(TargetStatuses))
	for i, s := range TargetStatuses {
		names[i] = string(s)
	}
	return names
}

// CountsText says how many targets have each status, most pressing
// first, leaving out the statuses no target has: "300 targets: 2 failed,
// 20 changing, 136 pending, 142 done". "0 targets" for a rollout of none.
func (v View) CountsText() string {
	total := 0
	var parts []string
	for _, s := range TargetStatuses {
		if n := v.Counts[s]; n > 0 {
			total += n
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	for s, n := range v.Counts {
		if !slices.Contains(TargetStatuses, s) && n > 0 { // none today: said, not dropped
			total += n
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	if total == 0 {
		return "0 targets"
	}
	return plural(total, "target") + ": " + strings.Join(parts, ", ")
}

// SortPressing sorts targets most pressing first: by status in
// [TargetStatuses]' order, then a target whose agent is down or whose
// node is paused before one that is not, then in the rollout's order
// (batch, then the order the start lists them in, as [View.Targets]
// holds them). Stable: targets equal in all of these keep their order.
func SortPressing(targets []TargetView) {
	slices.SortStableFunc(targets, func(a, b TargetView) int {
		return cmp.Or(cmp.Compare(statusRank(a.Status), statusRank(b.Status)), cmp.Compare(awayRank(b), awayRank(a)))
	})
}

func awayRank(t TargetView) int {
	if t.Down || t.Paused != nil {
		return 1
	}
	return 0
}
