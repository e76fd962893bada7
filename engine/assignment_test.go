package engine

import (
	"slices"
	"testing"
)

// TestAssignmentOwner: contiguous balanced blocks over the members sorted
// by name, whatever order they are given in.
func TestAssignmentOwner(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		members []string
		n       int
		owners  string // owner's first letter, per partition; '-' for none
	}{
		{"no member owns nothing", nil, 4, "----"},
		{"one member owns all", []string{"a"}, 4, "aaaa"},
		{"two members halve 16", []string{"b", "a"}, 16, "aaaaaaaabbbbbbbb"},
		{"three members of 16: blocks of 6, 5, 5", []string{"c", "a", "b"}, 16, "aaaaaabbbbbccccc"},
		{"more members than partitions", []string{"a", "b", "c", "d"}, 2, "ac"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := assign(c.members, c.n)
			got := make([]byte, c.n)
			for p := range c.n {
				o := a.owner(p)
				if o == "" {
					got[p] = '-'
				} else {
					got[p] = o[0]
				}
			}
			if string(got) != c.owners {
				t.Errorf("owners %s, want %s", got, c.owners)
			}
			if a.owner(-1) != "" || a.owner(c.n) != "" {
				t.Error("a partition out of range has an owner")
			}
		})
	}
}

// TestAssignmentMoves: what a member releases and acquires for what it
// knows of each lease.
func TestAssignmentMoves(t *testing.T) {
	t.Parallel()
	// Members a and b share 4 partitions: a owns 0 and 1, b owns 2 and 3.
	a := assign([]string{"a", "b"}, 4)
	mine := leaseSeen{mine: true, present: true}
	revoked := leaseSeen{mine: true, revoked: true, present: true}
	taken := leaseSeen{present: true}
	acquiring := leaseSeen{acquiring: true}
	free := leaseSeen{}
	cases := []struct {
		name             string
		self             string
		leases           []leaseSeen
		release, acquire []int
	}{
		{"a fresh member acquires its free share", "a", []leaseSeen{free, free, free, free}, nil, []int{0, 1}},
		{"a held share moves nothing", "a", []leaseSeen{mine, mine, taken, taken}, nil, nil},
		{"leases outside the share are released", "a", []leaseSeen{mine, mine, mine, mine}, []int{2, 3}, nil},
		{"a release already under way is not repeated", "a", []leaseSeen{mine, mine, revoked, mine}, []int{3}, nil},
		{"a share someone else still holds waits", "b", []leaseSeen{taken, taken, taken, free}, nil, []int{3}},
		{"a create in flight is not sent again", "a", []leaseSeen{acquiring, free, free, free}, nil, []int{1}},
		{"a revoked lease of the share is not acquired again until it stops", "a", []leaseSeen{revoked, free, free, free}, nil, []int{1}},
		{"a stranger to the group owns nothing", "z", []leaseSeen{mine, free, free, free}, []int{0}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rel, acq := a.moves(c.self, c.leases)
			if !slices.Equal(rel, c.release) || !slices.Equal(acq, c.acquire) {
				t.Errorf("release %v acquire %v, want release %v acquire %v", rel, acq, c.release, c.acquire)
			}
		})
	}
}
