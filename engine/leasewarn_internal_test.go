package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// warnUnacquired's rules for a lease that exists: an ordinary wait (a
// dead member's lease, until its TTL) says nothing; one that kept the
// member out for longer than any holder that stopped renewing keeps it
// (1.25 TTL) warns, once per acquireWarnEvery; a partition no longer
// the member's share is forgotten; a lease taken after a warning says so.
func TestWarnUnacquiredRules(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	g := &Group{cfg: GroupConfig{Instance: "a"}, ttl: time.Second, n: 2,
		log:     slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})),
		members: map[string]time.Time{}, mine: map[int]*lease{}, view: make([]leaseView, 2), failing: map[int]*unacquired{}}
	lines := func() []string {
		s := strings.TrimSpace(out.String())
		out.Reset()
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
	g.acquired(0, jetstream.ErrKeyExists)
	g.acquired(1, jetstream.ErrKeyExists)
	g.warnUnacquired()
	if l := lines(); l != nil {
		t.Fatalf("an existing lease just seen: logged %q", l)
	}
	g.failing[0].first = time.Now().Add(-2 * g.ttl) // outlived any holder
	g.warnUnacquired()
	l := lines()
	if len(l) != 1 || !strings.Contains(l[0], "level=WARN") || !strings.Contains(l[0], "partitions=[0]") ||
		!strings.Contains(l[0], "key exists") {
		t.Fatalf("a lease existing for 2 TTL: logged %q; want one warning naming partition 0 and the cause", l)
	}
	g.failing[1].first = g.failing[0].first
	g.warnUnacquired()
	if l := lines(); l != nil {
		t.Fatalf("within acquireWarnEvery of the last warning: logged %q", l)
	}
	// Partition 1 becomes another member's share ("b" sorts after "a").
	g.members["b"] = time.Now()
	g.acquireWarnNext = time.Time{}
	g.warnUnacquired()
	if _, ok := g.failing[1]; ok {
		t.Fatal("partition 1, now b's share, still counted as failing")
	}
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "partitions=[0]") {
		t.Fatalf("logged %q; want partition 0 alone", l)
	}
	g.acquired(0, nil)
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "partition lease acquired after failing") {
		t.Fatalf("taken after a warning: logged %q", l)
	}
	if len(g.failing) != 0 {
		t.Fatalf("failing after the take: %v", g.failing)
	}
}

// A warning names the refusal (a denial) its failing period saw, not the
// timeout of a later create whose denial came after its deadline (under
// -race a whole round's denials came after the lease attempt timeout,
// TTL/4 = 250 ms at a 1 s TTL, and the line said only "context deadline
// exceeded"); a refusal of one partition goes before another's timeout;
// with no refusal seen, the timeout is the cause.
func TestWarnUnacquiredNamesTheRefusal(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	g := &Group{cfg: GroupConfig{Instance: "a"}, ttl: time.Second, n: 3,
		log:     slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})),
		members: map[string]time.Time{}, mine: map[int]*lease{}, view: make([]leaseView, 3), failing: map[int]*unacquired{}}
	warned := func() string {
		g.acquireWarnNext = time.Time{}
		out.Reset()
		g.warnUnacquired()
		return out.String()
	}
	denied := fmt.Errorf("%w: Permissions Violation for Publish to \"$KV.MESH_LEASES.lease.0\"", nats.ErrPermissionViolation)
	g.acquired(0, context.DeadlineExceeded)
	if l := warned(); !strings.Contains(l, "err=\"context deadline exceeded\"") {
		t.Fatalf("no refusal seen: logged %q; want the timeout", l)
	}
	g.acquired(0, denied)
	g.acquired(0, context.DeadlineExceeded)
	g.acquired(1, nats.ErrTimeout)
	if l := warned(); !strings.Contains(l, "Permissions Violation") || !strings.Contains(l, "partitions=\"[0 1]\"") {
		t.Fatalf("a denial, then timeouts: logged %q; want partitions 0 and 1 and the denial", l)
	}
	// Partition 0 taken: its failing period, and its denial, end.
	g.acquired(0, nil)
	if l := warned(); !strings.Contains(l, "nats: timeout") || !strings.Contains(l, "partitions=[1]") {
		t.Fatalf("partition 0 taken: logged %q; want partition 1 and its timeout", l)
	}
	// A lease that exists is its own answer.
	g.acquired(2, jetstream.ErrKeyExists)
	g.failing[2].first = time.Now().Add(-2 * g.ttl)
	g.failing[2].refused = errors.New("an older refusal")
	if l := warned(); !strings.Contains(l, "nats: timeout") || strings.Contains(l, "older refusal") {
		t.Fatalf("a timeout and a lease that exists: logged %q; want the timeout", l)
	}
}
