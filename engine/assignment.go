package engine

import "slices"

// assignment is who should fold which partition for a set of live
// members of a group: partition p belongs to the member at index
// ⌊p·m/n⌋ of the m members sorted by name (contiguous, balanced blocks,
// as pcgroups assigns static members). Every member computes the same
// assignment from the same watch. It is a pure value.
type assignment struct {
	members []string // sorted
	n       int      // partitions
}

// assign returns the assignment of n partitions to members (any order,
// no duplicates).
func assign(members []string, n int) assignment {
	return assignment{members: slices.Sorted(slices.Values(members)), n: n}
}

// owner returns the member partition p belongs to, "" when there is no
// member.
func (a assignment) owner(p int) string {
	m := len(a.members)
	if m == 0 || p < 0 || p >= a.n {
		return ""
	}
	return a.members[p*m/a.n]
}

// leaseSeen is what one member knows of one partition's lease.
type leaseSeen struct {
	// mine: this member holds the lease (or held it, until its partition
	// stops); revoked: and has revoked its grant already.
	mine, revoked bool
	// acquiring: a create of the lease is in flight.
	acquiring bool
	// present: the watch says the lease key exists (anyone's).
	present bool
}

// moves returns what member self must do to move toward its share, given
// what it knows of each partition's lease (indexed by partition):
// release (hand over) the partitions it holds that are no longer its
// share, and try to acquire the free ones that are. Both are sorted.
func (a assignment) moves(self string, leases []leaseSeen) (release, acquire []int) {
	for p, l := range leases {
		want := a.owner(p) == self
		switch {
		case l.mine:
			if !want && !l.revoked {
				release = append(release, p)
			}
		case want && !l.acquiring && !l.present:
			acquire = append(acquire, p)
		}
	}
	return release, acquire
}
