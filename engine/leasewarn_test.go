package engine_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// deniedLease is the start of the server's denial of a lease key's put.
const deniedLease = "Permissions Violation for Publish to \"$KV.MESH_LEASES.lease."

// A group member that cannot take the partitions of its share warns, with
// the cause, at most every 10 s: here its user may put its member key but
// is denied every lease key, so each create fails, with the server's
// denial (store.GuardDenied: the server drops a denied request, which
// timed out). It was logged at debug level only: a member holding
// nothing said nothing. A warning after a denial names it, even when
// the last creates before it timed out (their denials came late).
func TestGroupWarnsItCannotTakeItsPartitions(t *testing.T) {
	t.Parallel()
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"m": {Deny: []string{"$KV.MESH_LEASES.lease.>"}}})
	_, js := ps.Connect(t, "m")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecords()
	g, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "test", Instance: "a", TTL: time.Second,
		Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	gctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(gctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	const warned = "partition leases of this member's share not acquired; retrying"
	// records returns the records logged so far.
	records := func() []slog.Record {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		return slices.Clone(*logs.recs)
	}
	isDenial := func(r slog.Record) bool {
		denial := false
		r.Attrs(func(a slog.Attr) bool {
			denial = denial || a.Key == "err" && strings.Contains(a.Value.String(), deniedLease)
			return true
		})
		return r.Message == "acquire partition lease" && denial
	}
	// The first warning logged after a create failed with the denial
	// (each round logs its failures, then warns). A round whose denials
	// all came after the lease attempt timeout (TTL/4: 250 ms, outrun
	// under -race) fails with that timeout; its warning, with no denial
	// seen yet, names the timeout, and the next comes 10 s later.
	var w slog.Record
	var after int // index of w in the records
	waitfor.Until(t, 30*time.Second, "a warning after a denied create", func() bool {
		denied := false
		for i, r := range records() {
			denied = denied || isDenial(r)
			if denied && r.Message == warned {
				w, after = r, i
				return true
			}
		}
		return false
	})
	if w.Level != slog.LevelWarn {
		t.Errorf("logged at %v, want warn", w.Level)
	}
	attrs := map[string]string{}
	w.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if attrs["partitions"] != "[0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]" || !strings.Contains(attrs["err"], deniedLease) {
		t.Errorf("warned %v; want every partition and the cause (the denial)", attrs)
	}
	// Rate-limited: the creates go on failing, 16 at a time, a round a
	// few hundred milliseconds; the next warning comes after 10 s.
	since := func() (warnings, creates int) {
		for _, r := range records()[after+1:] {
			switch r.Message {
			case warned:
				warnings++
			case "acquire partition lease":
				creates++
			}
		}
		return warnings, creates
	}
	waitfor.Until(t, 30*time.Second, "three more rounds of failed creates", func() bool {
		_, n := since()
		return n >= 3*16
	})
	if w, n := since(); w != 0 {
		t.Fatalf("%d more warnings over %d failed creates; want none in 10 s", w, n)
	}
	if got := g.Owned(); len(got) != 0 {
		t.Fatalf("owns %v with every lease key denied", got)
	}
}
