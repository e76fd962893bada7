package store_test

import (
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A start that changes the shared stream's retention (a group member's
// --max-age) gets the retention it replaced, to say it: a fresh user's
// finding m4, where one member's --max-age 2160h changed every member's
// stream from "all events" without a word. A start that leaves it, or
// one without the flags, gets nil.
func TestEnsureStreamSaysTheRetentionItChanged(t *testing.T) {
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	if got := cfg.Keeps(); got != "all events" {
		t.Errorf("a new stream keeps %q, want all events", got)
	}
	_, eff, was, err := store.EnsureStreamSaying(ctx, js, store.StreamConfig{MaxAge: 2160 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if was == nil || was.Keeps() != "all events" || eff.Keeps() != "2160h0m0s of events (--max-age)" {
		t.Fatalf("--max-age 2160h on a stream keeping all: was %+v, now keeps %q; want all events → 2160h0m0s", was, eff.Keeps())
	}
	for _, c := range []store.StreamConfig{{}, {MaxAge: 2160 * time.Hour}} {
		if _, eff, was, err := store.EnsureStreamSaying(ctx, js, c); err != nil || was != nil || eff.MaxAge != 2160*time.Hour {
			t.Errorf("start with %+v: was %+v, max age %s, err %v; want nothing changed", c, was, eff.MaxAge, err)
		}
	}
	_, eff, was, err = store.EnsureStreamSaying(ctx, js, store.StreamConfig{MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if want := "2160h0m0s of events (--max-age) and 1073741824 bytes (--max-bytes)"; was == nil || was.MaxBytes != 0 || eff.Keeps() != want {
		t.Errorf("--max-bytes added: was %+v, keeps %q; want %q", was, eff.Keeps(), want)
	}
}
