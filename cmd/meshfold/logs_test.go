package main

import (
	"testing"
	"time"
)

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"10m", "2026-12-01T21:50:00Z"},
		{"2026-12-01T23:00:00+01:00", "2026-12-01T22:00:00Z"},
	} {
		if got, err := parseSince(tc.in, now); err != nil || got != tc.want {
			t.Errorf("parseSince(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"-5m", "yesterday", "2026-12-01"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("parseSince(%q): no error", bad)
		}
	}
}
