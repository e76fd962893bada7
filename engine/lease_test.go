package engine

import (
	"testing"
	"time"
)

// TestLeaseViewLive: a lease the view reports counts as another
// instance's live lease only while that instance renews it; one naming
// this instance (which holds none) or one not renewed for 1.25 TTL is
// looked for again (issue 13: a missed expiry left it "present" forever).
func TestLeaseViewLive(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const ttl = 15 * time.Second
	cases := []struct {
		name string
		v    leaseView
		live bool
	}{
		{"absent", leaseView{}, false},
		{"another's, just renewed", leaseView{present: true, holder: "b", created: now.Add(-time.Second)}, true},
		{"another's, renewed 1.25 TTL ago", leaseView{present: true, holder: "b", created: now.Add(-ttl - ttl/4)}, true},
		{"another's, older than 1.25 TTL", leaseView{present: true, holder: "b", created: now.Add(-ttl - ttl/4 - time.Millisecond)}, false},
		{"this instance's, held by none here", leaseView{present: true, holder: "a", created: now}, false},
	}
	for _, c := range cases {
		if got := c.v.live("a", ttl, now); got != c.live {
			t.Errorf("%s: live %v, want %v", c.name, got, c.live)
		}
	}
}
