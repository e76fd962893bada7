package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/query"
)

// With every reconciler killed, the rollout views say no controller holds
// the fleet's lease and since when, measured from the lease's expiry (its
// last renewal plus the TTL), not from the rollout's last record (a fresh
// user's finding M8: "no controller for 5m37s" 82 s after the kill).
func TestControllerGoneText(t *testing.T) {
	t.Parallel()
	ttl := 15 * time.Second
	renewed := time.Date(2026, 12, 5, 20, 27, 21, 0, time.UTC) // the kill -9 came after it
	h := query.LeaseHolder{Key: "rollout.big", Held: true, Who: "reconciler r1 of group reconcilers", Renewed: renewed}
	for _, c := range []struct {
		name string
		h    query.LeaseHolder
		now  time.Time
		want string
	}{
		{"live", h, renewed.Add(5 * time.Second), ""},
		{"stalled, not expired", h, renewed.Add(10 * time.Second),
			"fleet big's controller, reconciler r1 of group reconcilers, has not renewed its lease since 2026-12-05T20:27:21Z (10s ago): gone or stalled; the lease expires at 2026-12-05T20:27:36Z"},
		{"expired", h, renewed.Add(82 * time.Second),
			"no controller holds fleet big's lease since 2026-12-05T20:27:36Z (1m7s ago; reconciler r1 of group reconcilers last renewed it at 2026-12-05T20:27:21Z)"},
		{"key gone", query.LeaseHolder{Key: "rollout.big"}, renewed.Add(10 * time.Minute),
			"no controller holds fleet big's lease: it expired or was released"},
	} {
		got := controllerGoneText("big", c.h, ttl, c.now)
		if (c.want == "") != (got == "") || !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: said %q, want %q", c.name, got, c.want)
		}
	}
}
