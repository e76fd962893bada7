package main

import (
	"context"
	"fmt"
	"time"

	"github.com/meshfold/meshfold/query"
)

// controllerGoneText says, as of now, that no live rollout controller
// holds fleet's lease (the key rollout.<fleet> of the reconcilers' lease
// bucket, h, with the bucket's TTL ttl), measured from the lease's
// expiry (its last renewal plus ttl), or from its last renewal while it
// has not yet expired; "" when its holder renewed it within half its TTL
// (a live controller). A key the bucket no longer holds (expired or
// released) has no time left to measure from, and says so. A fresh
// user's finding M8: with every reconciler killed, `rollout ls` said
// "running" and the console counted "no controller for 5m37s" from the
// rollout's last record, minutes before the death.
func controllerGoneText(fleet string, h query.LeaseHolder, ttl time.Duration, now time.Time) string {
	if !h.Held {
		return fmt.Sprintf("no controller holds fleet %s's lease: it expired or was released (no reconciler with rollouts on runs: 'meshfold serve' or 'meshfold reconcile' steps rollouts again when one starts)", fleet)
	}
	age := now.Sub(h.Renewed)
	if age <= ttl/2 {
		return ""
	}
	if expires := h.Renewed.Add(ttl); !expires.After(now) {
		return fmt.Sprintf("no controller holds fleet %s's lease since %s (%s ago; %s last renewed it at %s)", fleet,
			expires.UTC().Format(time.RFC3339), now.Sub(expires).Round(time.Second), h.Who, h.Renewed.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("fleet %s's controller, %s, has not renewed its lease since %s (%s ago): gone or stalled; the lease expires at %s",
		fleet, h.Who, h.Renewed.UTC().Format(time.RFC3339), age.Round(time.Second), h.Renewed.Add(ttl).UTC().Format(time.RFC3339))
}

// controllerGone reads fleet's controller lease (query.Reader.ControllerHolder)
// and says controllerGoneText of it; "" when a live controller holds it or
// the lease cannot be read (credentials issued before operators could
// read it, no reconciler ever ran): the views then say what they said
// before.
func controllerGone(ctx context.Context, r *query.Reader, fleet string, now time.Time) string {
	hctx, cancel := context.WithTimeout(ctx, holdersWait)
	defer cancel()
	h, ttl, err := r.ControllerHolder(hctx, fleet)
	if err != nil {
		return ""
	}
	return controllerGoneText(fleet, h, ttl, now)
}
