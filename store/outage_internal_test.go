package store

import (
	"testing"
	"time"
)

// An outage is said when it starts, again at most each minute, and
// when it ends; the failures between are quiet.
func TestOutageReminderEachMinute(t *testing.T) {
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
