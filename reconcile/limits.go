package reconcile

import "github.com/meshfold/meshfold/events"

// Caps of a node's state: "bounded by counts, never by forgetting what
// still matters" (DESIGN.md §4; each cap and what happens past it is
// recorded in docs/design.md §4, "The caps"). The events package bounds
// every value and list an event carries; these bound the records a state
// keeps across events, so that the largest state's snapshot fits in one
// message (store's TestLargestFits builds it, against the server's default
// max_payload of 1 MiB; DESIGN.md §10). A record is dropped only when one
// more would pass its cap, oldest first; never because a want stopped
// naming its module or file. Each cap is above what a node whose
// configuration changes less often than it ever holds, so such a node
// folds exactly as DESIGN.md §4's rules say; past a cap the node's other
// events still fold and the drop is journaled.
const (
	// MaxUnsettled bounds the plans emitted and not settled yet (a node
	// that is down while wants keep coming; wants refolded at a restart
	// before their plans are read back). One more drops the oldest plan
	// whose event is not read yet (that event, when read, records it
	// again: a plan of the fold's own, issue 25), else the second oldest:
	// the oldest may be what the node is applying, and it applies the
	// newest it follows. Not journaled. A settle naming a dropped plan is
	// journaled at info while it is among the last MaxDroppedPlans dropped
	// (State.Dropped), else at error as naming no plan.
	MaxUnsettled = 4
	// MaxDroppedPlans bounds the sequences of plans whose unsettled records
	// the cap dropped after their events were read (State.Dropped), the
	// newest kept: a node agent settles a plan it read, and while it
	// applies one, every newer plan past the cap drops one such record.
	// One more drops the oldest, not journaled: a settle naming it is
	// journaled at error as naming no plan, as before issue 25.
	MaxDroppedPlans = 64
	// MaxOwed bounds the owed items: a knock carries at most
	// events.MaxOwedPerKnock. One more drops the oldest (the first to
	// arrive), journaled at warn: its file waits for the provisioner's
	// next refill, which every knock makes it do.
	MaxOwed = events.MaxOwedPerKnock
	// MaxApprovals bounds the approvals of a node: four builds for each
	// of events.MaxModules modules. One more drops the node's oldest
	// approval of a build its want does not ask for, journaled at warn:
	// going back to that build needs a new yes.
	MaxApprovals = 4 * events.MaxModules
	// MaxModuleApprovals bounds the approvals of one module: its last 16
	// approved builds, several releases of rollbacks. One more drops the
	// module's oldest approval of a build its want does not ask for,
	// journaled at warn.
	MaxModuleApprovals = 16
	// MaxAccepting bounds the accepting records, per (module, path,
	// account): every file of the largest want under the provisioner
	// account and the one it rotates from, or as many again of files
	// dropped from it. One more drops the record of the oldest plan,
	// journaled at info: at worst a refusal judged by a plan older than
	// that one is not knocked, and the provisioner's next refill writes
	// the file.
	MaxAccepting = 2 * events.MaxFilesPerWant
	// MaxFilled bounds the filled marks, per (module, path): every file of
	// the largest want and as many dropped from it. One more drops the
	// mark of the oldest plan, journaled at info: at worst a refusal
	// judged by a plan older than that mark arrives late, is owed and is
	// knocked once more.
	MaxFilled = 2 * events.MaxFilesPerWant
	// MaxWaivers bounds the waivers, per (module, path): an operator
	// waives a file nobody will ever fill, a rare answer to a broken
	// configuration, and a waiver of a module no want names is kept until
	// the cap drops it (a module leaving the want drops its own). One more
	// drops the oldest waive, journaled at warn: a late refusal of that
	// file judged by a plan it covered is owed again, and waiving the file
	// again pays it. 32 at their longest are about 10 KB of the largest
	// state (store's TestLargestFits).
	MaxWaivers = 32
	// MaxGates bounds the modules gated on a node (State.Gates): twice a
	// want's modules. Past it a new gate is not kept, journaled at warn
	// (a want's flag still holds its module while the want carries it);
	// a gate kept is never dropped to make room: dropping the oldest
	// would let a controller lift a gate by gating other modules, the
	// very thing gates stand against (a fresh user's finding M7). An
	// operator's ungate makes room. 64 at their longest are about 14 KB
	// of the largest state (store's TestLargestFits).
	MaxGates = 2 * events.MaxModules
	// MaxFailed bounds the failed-apply records, one per module of a
	// want (and one for a whole plan): one more drops the oldest, not
	// journaled (each failed settle is journaled at error already).
	MaxFailed = events.MaxModules + 1
	// MaxFailedError bounds the error a failed-apply record keeps, and
	// MaxWhy an owed item's: bytes of events.ErrorText's line (the whole
	// error stays in the stream for audit). With every record at its
	// cap and its text escaping at its longest in JSON, the largest
	// state stays under three quarters of max_payload (store's
	// TestLargestFits).
	MaxFailedError = 200
	MaxWhy         = 96
)

// caps are a state's caps, the constants above unless a test lifts them
// (export_test.go): the property that a bounded fold equals an unbounded
// one below the caps needs an unbounded fold to compare with.
type caps struct {
	unsettled, owed, approvals, moduleApprovals, accepting, filled, waivers int
}

var defaultCaps = caps{
	unsettled:       MaxUnsettled,
	owed:            MaxOwed,
	approvals:       MaxApprovals,
	moduleApprovals: MaxModuleApprovals,
	accepting:       MaxAccepting,
	filled:          MaxFilled,
	waivers:         MaxWaivers,
}

// limits returns s's caps.
func (s *State) limits() *caps {
	if s.caps != nil {
		return s.caps
	}
	return &defaultCaps
}

// oldest returns the index of the element of xs with the lowest key, the
// first of them in xs' order, skipping those protected reports (nil
// skips none); -1 when every element is skipped.
func oldest[T any](xs []T, key func(T) uint64, protected func(T) bool) int {
	i := -1
	for j := range xs {
		if protected != nil && protected(xs[j]) {
			continue
		}
		if i < 0 || key(xs[j]) < key(xs[i]) {
			i = j
		}
	}
	return i
}
