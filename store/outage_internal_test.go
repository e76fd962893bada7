package store

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// An outage is said when it starts, again at most each minute, and
// when it ends; the failures between are quiet.
func TestOutageReminderEachMinute(t *testing.T) {
	t.Parallel()
	var o outage
	t0 := time.Date(2026, 12, 4, 15, 46, 0, 0, time.UTC)
	steps := []struct {
		after time.Duration
		want  outageSay
	}{
		{0, outageStarts},
		{1250 * time.Millisecond, outageQuiet},
		{59 * time.Second, outageQuiet},
		{60 * time.Second, outageLasts},
		{61 * time.Second, outageQuiet},
		{119 * time.Second, outageQuiet},
		{120 * time.Second, outageLasts},
	}
	for _, s := range steps {
		if got := o.fail(t0.Add(s.after)); got != s.want {
			t.Errorf("failure at +%s: %d, want %d", s.after, got, s.want)
		}
	}
	if since, got := o.renewed(); got != outageEnds || !since.Equal(t0) {
		t.Errorf("renewal after the outage: %d since %s", got, since)
	}
	if _, got := o.renewed(); got != outageNone {
		t.Errorf("renewal after a renewal: %d", got)
	}
	if got := o.fail(t0.Add(time.Hour)); got != outageStarts {
		t.Errorf("failure after the return: %d, want a new outage", got)
	}
}

// A renewal refused because the server cannot store (a full data
// directory, 503 10023) is said as that, not as NATS unreachable, and so
// is its end (the fresh user's V7: "lease not renewed ... nats: nats: API
// error ... insufficient resources").
func TestOutageOfAFullStoreSaidAsSuch(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := &Lease{key: "stream", ttl: 15 * time.Second, log: slog.New(slog.NewTextHandler(&buf, nil))}
	l.unrenewed(fmt.Errorf("update: %w", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}))
	l.renewedNow()
	out := buf.String()
	for _, want := range []string{
		`msg="the server cannot store since `,
		`err="the server cannot store: its data directory is full (or its storage limit reached): insufficient resources, code 503, err_code 10023`,
		`msg="the server stores again, after `,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "unreachable") || strings.Contains(out, "nats: nats:") {
		t.Errorf("a full store said as an unreachable NATS, or raw:\n%s", out)
	}
}

// renewKV answers a renewal's update as stored, at the next revision.
type renewKV struct {
	jetstream.KeyValue
}

func (renewKV) Update(_ context.Context, _ string, _ []byte, rev uint64) (uint64, error) {
	return rev + 1, nil
}

// A renewal that ends an outage of renewals as long as the TTL is
// answered as a re-claim (Lease.Reclaimed), though the key was still the
// holder's: a watcher may have read it gone from a replica that aged it
// out and recorded the holder down (a fresh user's finding, G1: after a
// quorum loss the agents said "NATS reachable again" and nothing else,
// and stayed recorded down until their next have). A shorter outage is
// not.
func TestRenewalAfterAnOutageAsLongAsTheTTLIsAReclaim(t *testing.T) {
	t.Parallel()
	const ttl = 5 * time.Second
	for _, c := range []struct {
		outage time.Duration
		want   bool
	}{
		{ttl / 8, false},
		{ttl / 2, false},
		{ttl - ttl/4, true}, // the last stored renewal came up to TTL/4 before the first failure
		{41 * time.Second, true},
	} {
		l := &Lease{kv: renewKV{}, key: "ace", ttl: ttl, rev: 7, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			stop: make(chan struct{}), reclaimed: make(chan struct{}, 1)}
		l.out.since, l.out.said = time.Now().Add(-c.outage), time.Now().Add(-c.outage)
		if err := l.renewOnce(context.Background()); err != nil {
			t.Fatalf("outage %s: %v", c.outage, err)
		}
		got := false
		select {
		case <-l.Reclaimed():
			got = true
		default:
		}
		if got != c.want {
			t.Errorf("a renewal after an outage of %s (TTL %s) answered as a re-claim: %t, want %t", c.outage, ttl, got, c.want)
		}
		if l.rev != 8 {
			t.Errorf("outage %s: revision %d after the renewal, want 8", c.outage, l.rev)
		}
	}
}
