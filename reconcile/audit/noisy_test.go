package audit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// TestFleetNoisy: a node that flooded the stream with its own events
// (the tester's 400 haves of 200 KB) needs an operator under a need of
// its own, "noisy", right after an unreadable snapshot, read from its
// fleet summary as from its view; the row's NEEDS says how much, the
// lines after the table what it published and the remedy, and `state`
// says it too. An acknowledgement after the episode's last event, or a
// day of quiet, clears the need; the journal entries stay in the audit.
func TestFleetNoisy(t *testing.T) {
	base := time.Date(2026, 12, 5, 14, 0, 0, 0, time.UTC)
	st := reconcile.NewState("ace")
	seq := uint64(0)
	fold := func(ev events.Event) {
		seq++
		ev.Seq, ev.Node = seq, "ace"
		events.Stamp(ev.Payload, ev.Time)
		st.Fold(ev)
	}
	for i := range 400 {
		at := base.Add(time.Duration(i) * 7 * time.Millisecond)
		fold(events.Event{Time: at, Kind: events.KindHave, Size: 200_000, Payload: &events.Have{Modules: []events.HaveModule{}}})
	}
	if st.Noisy == nil {
		t.Fatal("the flood left no episode")
	}
	now := base.Add(time.Minute)
	sum, err := reconcile.MarshalSummary(st)
	if err != nil {
		t.Fatal(err)
	}
	fromSummary, err := reconcile.UnmarshalSummary(sum)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		v    reconcile.View
	}{{"view", st.View()}, {"summary", fromSummary}} {
		r := audit.FleetRowOfView(c.v, now, time.Hour)
		if len(r.Attention) == 0 || r.Attention[0] != "noisy" {
			t.Fatalf("%s: attention %v, want noisy first", c.name, r.Attention)
		}
		if line := r.Line(4); !strings.Contains(line, "noisy 80 MB") {
			t.Errorf("%s: row %q does not say noisy 80 MB", c.name, line)
		}
		text := audit.FleetNoisyText([]audit.FleetRow{r})
		for _, w := range []string{"noisy", "ace 400 haves, 80 MB in 2.8 s (#11–#400)", "revoke node-ace'", "'meshfold ack ace'"} {
			if !strings.Contains(text, w) {
				t.Errorf("%s: the lines after the table\n%s\nsay no %q", c.name, text, w)
			}
		}
	}
	if s := audit.StateText(st.View(), reconcile.Composition{}, now, "test"); !strings.Contains(s, "noisy     400 haves, 80 MB in 2.8 s (#11–#400), its last event 57s ago") {
		t.Errorf("state says\n%s", s)
	}

	// A day of quiet: no longer news.
	if r := audit.FleetRowOfView(st.View(), base.Add(reconcile.NoisyShow+3*time.Second), time.Hour*48); r.Noisy != nil || strings.Contains(strings.Join(r.Attention, ","), "noisy") {
		t.Errorf("a day later: %v", r.Attention)
	}
	// Acknowledged after the episode's last event: handled.
	fold(events.Event{Time: now, Kind: events.KindAck, Payload: &events.Ack{By: "ops", Reason: "revoked node-ace"}})
	if r := audit.FleetRowOfView(st.View(), now, time.Hour); r.Noisy != nil {
		t.Errorf("after an ack through #%d: %v", st.Ack.Upto, r.Attention)
	}
}
