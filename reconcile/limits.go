package reconcile

import (
	"slices"

	"github.com/meshfold/meshfold/events"
)

// Bounds of a node's state (DESIGN.md §10). The events package bounds
// every value and list an event carries; these bound the records a state
// keeps across events, so that the largest state's snapshot fits in one
// message (store's TestLargestFits builds it: 542 KB, against the
// server's default max_payload of 1 MiB). Each is reached only by a
// history no real node makes; what happens then is chosen so that the
// node's other events still fold and at worst a knock is sent that was
// not needed or a refusal waits for the provisioner's next full refill.
const (
	// MaxOwed bounds the owed items. A refusal that would make one more
	// is journaled and not owed: a knock makes the provisioner fill every
	// file anyway, so nothing is lost while the node owes the others.
	MaxOwed = events.MaxOwedPerKnock
	// MaxFilled bounds the filled marks (a node fills at most
	// events.MaxFilesPerWant files of its want; twice that leaves room
	// for files a newer want dropped). A new mark beyond it replaces the
	// one of the oldest plan: at worst, a refusal arriving late is owed
	// and knocked once more.
	MaxFilled = 2 * events.MaxFilesPerWant
	// MaxAccepting bounds the accepting records, per (module, path,
	// account). A new one beyond it replaces the one of the oldest plan:
	// at worst, a refusal judged by a plan older than that one is not
	// knocked, and the provisioner's next full refill writes the file.
	MaxAccepting = 2 * events.MaxFilesPerWant
	// MaxApprovals bounds the approvals kept. One more is journaled at
	// error and not kept: the operator revokes old ones first.
	MaxApprovals = 128
	// MaxUnsettled bounds the plans emitted and not settled yet. A node
	// agent applies its newest plan, so only the plan it may be applying
	// (the oldest) and the newest ones can be settled: when one more is
	// emitted, the second oldest is dropped. A settle naming it is
	// journaled as naming no plan.
	MaxUnsettled = 4
)

// evictOldest removes from xs the element with the lowest plan (the first
// of them in xs' order) when xs holds max elements, so one more fits.
func evictOldest[T any](xs []T, max int, plan func(T) uint64) []T {
	if len(xs) < max {
		return xs
	}
	i := 0
	for j := range xs {
		if plan(xs[j]) < plan(xs[i]) {
			i = j
		}
	}
	return slices.Delete(xs, i, i+1)
}
