package audit_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

func TestParseBound(t *testing.T) {
	for _, c := range []struct {
		in   string
		seq  uint64
		unit time.Duration
	}{
		{in: "42", seq: 42},
		{in: "#42", seq: 42},
		{in: "2026-11-03T20:50:05Z", unit: time.Second},
		{in: "2026-11-03T20:50:05.1Z", unit: 100 * time.Millisecond},
		{in: "2026-11-03T20:50:05.120Z", unit: time.Millisecond},
		{in: "2026-11-03T21:50:05.123456789+01:00", unit: time.Nanosecond},
	} {
		b, err := audit.ParseBound(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if b.Seq != c.seq || b.Unit != c.unit || (c.unit != 0) != b.IsTime() {
			t.Errorf("%s: got seq %d unit %v time %v", c.in, b.Seq, b.Unit, b.Time)
		}
	}
	for _, bad := range []string{"", "0", "-3", "yesterday", "2026-11-03"} {
		if _, err := audit.ParseBound(bad); !errors.Is(err, audit.ErrBadBound) {
			t.Errorf("%q: err = %v, want ErrBadBound", bad, err)
		}
	}
}

// TestTimeBoundsSameTimestamp: events with the same stream time are both in
// or both out of a time bound, and the output says so.
func TestTimeBoundsSameTimestamp(t *testing.T) {
	t0 := time.Date(2026, 11, 3, 20, 50, 5, 250_000_000, time.UTC)
	mk := func(seq uint64, at time.Time) events.Event {
		return events.Event{Seq: seq, Time: at, Node: "ace", Kind: events.KindApprove,
			Payload: events.Stamp(&events.Approve{Module: "nats", Build: "b", By: "x"}, at)}
	}
	h, err := audit.NewHistory("ace", []events.Event{mk(3, t0.Add(-time.Second)), mk(7, t0), mk(9, t0), mk(12, t0.Add(time.Second))})
	if err != nil {
		t.Fatal(err)
	}
	bound := func(s string) audit.Bound {
		b, err := audit.ParseBound(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		bound      string
		until      int
		since      int
		noteSubstr string
	}{
		// Exactly the shared time: both in (until) and both in (since).
		{"2026-11-03T20:50:05.25Z", 3, 1, "2 events share that time (#7 to #9)"},
		// The whole second of the shared time.
		{"2026-11-03T20:50:05Z", 3, 1, "2 events share that time"},
		// Just before: both out of until, both in since.
		{"2026-11-03T20:50:05.249Z", 1, 1, "falls between #3"},
		// Just after: both in until, both out of since.
		{"2026-11-03T20:50:05.251Z", 3, 3, "falls between #9"},
		{"2026-11-03T20:40:00Z", 0, 0, "before ace's first event #3"},
		{"2026-11-03T21:00:00Z", 4, 4, "after ace's last event #12"},
		{"8", 2, 2, "#8 is not an event of ace; it falls between #7"},
		{"9", 3, 2, ""},
	} {
		b := bound(c.bound)
		n, note := h.Until(b)
		i, note2 := h.Since(b)
		if n != c.until || i != c.since {
			t.Errorf("%s: until %d since %d, want %d %d", c.bound, n, i, c.until, c.since)
		}
		if !strings.Contains(note, c.noteSubstr) || (c.noteSubstr == "") != (note == "") || (note == "") != (note2 == "") {
			t.Errorf("%s: notes %q / %q, want %q", c.bound, note, note2, c.noteSubstr)
		}
	}
}

// TestAsOfEqualsLive: for a long scripted history of several nodes, the
// state as of every sequence S (replayed from the node's events alone)
// equals the state the live fold held right after S.
func TestAsOfEqualsLive(t *testing.T) {
	nodes := []string{"ace", "shanks", "novox"}
	// live[S][node] is the node's state, as JSON, right after the fold
	// that built the stream folded sequence S.
	live := map[uint64]map[string][]byte{}
	last := map[string][]byte{}
	s := reconciletest.Scripted(nodes, 600, 7, func(ev events.Event, st *reconcile.State) {
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		last[ev.Node] = b
		snap := make(map[string][]byte, len(last))
		for n, v := range last {
			snap[n] = v
		}
		live[ev.Seq] = snap
	})
	if len(s.Events) < 700 {
		t.Fatalf("only %d events", len(s.Events))
	}
	kinds := map[events.Kind]int{}
	for _, ev := range s.Events {
		kinds[ev.Kind]++
	}
	for _, k := range events.Kinds {
		if kinds[k] == 0 {
			t.Errorf("the scripted history has no %s event: %v", k, kinds)
		}
	}
	for _, node := range nodes {
		h, err := audit.NewHistory(node, s.Node(node))
		if err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= uint64(len(s.Events)); seq++ {
			a := h.AsOf(audit.SeqBound(seq))
			got, err := json.Marshal(a.State)
			if err != nil {
				t.Fatal(err)
			}
			want, ok := live[seq][node]
			if !ok {
				want, _ = json.Marshal(reconcile.NewState(node))
			}
			if string(got) != string(want) {
				t.Fatalf("%s as of #%d:\n got %s\nwant %s", node, seq, got, want)
			}
			if err := a.State.CheckInvariants(); err != nil {
				t.Fatalf("%s as of #%d: %v", node, seq, err)
			}
		}
	}
}

// TestWhyEveryEffect: --why works on every event of a long history, and
// for every effect the replay of its cause makes the same effect (the
// audit and the fold agree), and every knock's items name their refusal.
func TestWhyEveryEffect(t *testing.T) {
	nodes := []string{"ace", "shanks"}
	s := reconciletest.Scripted(nodes, 400, 11, nil)
	for _, node := range nodes {
		h, err := audit.NewHistory(node, s.Node(node))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range h.Events {
			w, err := h.Why(ev.Seq)
			if err != nil {
				t.Fatalf("why #%d: %v", ev.Seq, err)
			}
			for _, l := range strings.Split(strings.TrimSuffix(w.Text(), "\n"), "\n") {
				if n := len([]rune(l)); n > audit.LineWidth {
					t.Errorf("why #%d: line of %d columns: %q", ev.Seq, n, l)
				}
			}
			switch ev.Kind {
			case events.KindPlan, events.KindKnock, events.KindJournal:
				if !strings.HasPrefix(w.Replay, "folding #") {
					t.Errorf("why #%d %s: replay %q", ev.Seq, ev.Kind, w.Replay)
				}
				if w.Cause == nil {
					t.Errorf("why #%d %s: no cause", ev.Seq, ev.Kind)
				}
			}
			for _, o := range w.Owed {
				if o.Refusal == nil {
					t.Errorf("why knock #%d: item %+v has no refusal", ev.Seq, o.Owed)
				}
			}
		}
		for _, e := range h.Timeline(0, len(h.Events)) {
			if n := len([]rune(e.Line(7))); n > audit.LineWidth {
				t.Errorf("timeline #%d: %d columns", e.Seq, n)
			}
		}
	}
	if _, err := (&audit.History{Node: "ace"}).Why(3); !errors.Is(err, audit.ErrNotInHistory) {
		t.Errorf("why of a missing event: err = %v, want ErrNotInHistory", err)
	}
}

// A --why of a sequence that is none of the node's events says which
// sequences the node's events span (a fresh user's "--why 999" got only
// "not an event of the node fox").
func TestWhyNotInHistorySaysRange(t *testing.T) {
	s := reconciletest.Scripted([]string{"ace", "shanks"}, 60, 11, nil)
	h, err := audit.NewHistory("ace", s.Node("ace"))
	if err != nil {
		t.Fatal(err)
	}
	first, last := h.Events[0].Seq, h.Events[len(h.Events)-1].Seq
	other := s.Node("shanks")
	var inside uint64 // one of shanks's events between ace's first and last
	for _, ev := range other {
		if ev.Seq > first && ev.Seq < last {
			inside = ev.Seq
			break
		}
	}
	if inside == 0 {
		t.Fatalf("the script interleaves no event of shanks into ace's #%d–#%d", first, last)
	}
	span := fmt.Sprintf("#%d–#%d", first, last)
	for _, c := range []struct {
		seq  uint64
		want string
	}{
		{last + 100, fmt.Sprintf("why #%d: audit: not an event of the node ace (its events span %s)", last+100, span)},
		{inside, fmt.Sprintf("why #%d: audit: not an event of the node ace (its events span %s; #%d between them is another node's)", inside, span, inside)},
	} {
		_, err := h.Why(c.seq)
		if !errors.Is(err, audit.ErrNotInHistory) || err.Error() != c.want {
			t.Errorf("why #%d: %v\nwant %s", c.seq, err, c.want)
		}
	}
}

func TestNewHistoryRefusesDisorder(t *testing.T) {
	a := events.Event{Seq: 2, Node: "ace"}
	b := events.Event{Seq: 1, Node: "ace"}
	if _, err := audit.NewHistory("ace", []events.Event{a, b}); err == nil {
		t.Error("out of order accepted")
	}
	if _, err := audit.NewHistory("shanks", []events.Event{b}); err == nil {
		t.Error("another node's event accepted")
	}
}

func TestFleetOrder(t *testing.T) {
	now := time.Date(2026, 11, 3, 21, 0, 0, 0, time.UTC)
	s := reconciletest.New(now.Add(-time.Hour), time.Second)
	// calm: settled, fresh have, nothing owed.
	s.Append("calm", &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}})
	s.Append("calm", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 2})
	// owing: a refusal no settled plan accepts yet.
	s.Append("owing", &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}})
	s.Append("owing", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 5})
	s.Append("owing", &events.Refusal{Module: "pg", Path: "/etc/pg", Reason: events.ReasonUndeclared, Plan: 5, Writer: "prov"})
	s.Append("owing", &events.Have{})
	// waiting: held for an approval.
	s.Append("waiting", &events.Want{Modules: []events.WantModule{{Name: "nats", Build: "n:2", RequiresApproval: true}}})
	s.Append("waiting", &events.Have{})
	// unsettled: a plan never settled.
	s.Append("unsettled", &events.Want{Modules: []events.WantModule{{Name: "pg", Build: "p:1"}}})
	s.Append("unsettled", &events.Have{})
	s.Append("calm", &events.Have{})

	var rows []audit.FleetRow
	for _, n := range []string{"calm", "unsettled", "waiting", "owing"} {
		rows = append(rows, audit.FleetRowOf(s.State(n), now, 2*time.Hour))
	}
	rows = append(rows, audit.FleetErrorRow("broken", errors.New("bad snapshot")))
	audit.SortFleet(rows)
	var order []string
	for _, r := range rows {
		order = append(order, r.Node)
		if l := r.Line(10); len([]rune(l)) > audit.LineWidth {
			t.Errorf("line too long: %q", l)
		}
	}
	if got, want := strings.Join(order, " "), "broken owing waiting unsettled calm"; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
	if len(rows[2].Pending) != 1 || rows[2].Pending[0].Pending != "n:2" {
		t.Errorf("waiting: pending = %+v", rows[2].Pending)
	}
	stale := audit.FleetRowOf(s.State("calm"), now.Add(3*time.Hour), 2*time.Hour)
	if !stale.StaleHave || stale.Attention[0] != "stale-have" {
		t.Errorf("an old have: %+v", stale)
	}
}

// The rows that need nothing come last, by name alone, whatever their
// haves' ages (fresh12 m3: `fleet` listed them n05, n07, n06, n02, n01…,
// each after the one whose have was older), as the console's "Every
// node" table lists them; the radix sort of many rows the same.
func TestFleetCalmRowsByName(t *testing.T) {
	for _, n := range []int{8, 600} {
		rng := rand.New(rand.NewPCG(7, uint64(n)))
		var rows []audit.FleetRow
		var calm []string
		for i := range n {
			r := audit.FleetRow{Node: fmt.Sprintf("n%04d", i), HaveAge: float64(rng.IntN(30)), Attention: []string{}}
			if i%3 == 0 {
				r.Attention = []string{"unsettled"}
				r.Unsettled = 1
			} else {
				calm = append(calm, r.Node)
			}
			rows = append(rows, r)
		}
		rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
		audit.SortFleet(rows)
		var got []string
		for _, r := range rows[len(rows)-len(calm):] {
			got = append(got, r.Node)
		}
		if !slices.Equal(got, calm) {
			t.Errorf("%d rows: the calm rows are not by name: %v", n, got[:min(10, len(got))])
		}
	}
}

// FleetNeeds names every need attention may list, in rank order, and
// CountNeeds counts a row under each of its needs.
func TestCountNeeds(t *testing.T) {
	rows := []audit.FleetRow{
		{Node: "a", Attention: []string{"failed", "owed"}},
		{Node: "b", Attention: []string{"owed"}},
		{Node: "c", Attention: []string{}},
	}
	counts, calm := audit.CountNeeds(rows)
	if calm != 1 || len(counts) != 2 || counts[0] != (audit.NeedCount{Need: "failed", Nodes: 1}) || counts[1] != (audit.NeedCount{Need: "owed", Nodes: 2}) {
		t.Errorf("CountNeeds: %v, %d calm", counts, calm)
	}
	want := "NEEDS            NODES\nfailed               1\nowed                 2\nnothing              1\n"
	if got := audit.FleetSummaryText(counts, calm); got != want {
		t.Errorf("FleetSummaryText:\n%q\nwant\n%q", got, want)
	}
}

// A fleet row counts its warnings in words that agree with the count.
func TestFleetLineWarningsPlural(t *testing.T) {
	for n, want := range map[int]string{1: " 1 warning", 2: " 2 warnings"} {
		r := audit.FleetRow{Node: "ace", Attention: []string{"journal"}, Warnings: n, HaveAge: -1}
		if l := r.Line(4); !strings.HasSuffix(l, want) {
			t.Errorf("%d warnings: %q, want it to end %q", n, l, want)
		}
	}
}

// CompareFleetKeys, which compares the counts packed in one number when
// they fit, orders rows as SortFleet documents it: by the first need,
// then more needs, more restarts, more owed items, more pending
// approvals, more unsettled plans, an older have (of a row that needs
// something), the name; counts past
// what a packed field holds (and negative ones) compared one by one.
func TestCompareFleetKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	count := func() int {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return rng.IntN(3)
		case 2:
			return []int{-1, 4095, 4096, 16383, 16384, 1 << 20}[rng.IntN(6)]
		}
		return rng.IntN(20000)
	}
	row := func() audit.FleetRow {
		r := audit.FleetRow{Node: fmt.Sprintf("n%d", rng.IntN(3)), HaveAge: float64(rng.IntN(3)), Owed: count(), Unsettled: count()}
		for _, need := range audit.FleetNeeds {
			if rng.IntN(3) == 0 {
				r.Attention = append(r.Attention, need)
			}
		}
		for range rng.IntN(3) {
			r.Failed = append(r.Failed, reconcile.ModuleRuntime{Restarts: count()})
		}
		r.Pending = make([]reconcile.Held, []int{0, 1, 2, 4095, 4096}[rng.IntN(5)])
		return r
	}
	first := func(r *audit.FleetRow) int {
		if len(r.Attention) == 0 {
			return len(audit.FleetNeeds)
		}
		return slices.Index(audit.FleetNeeds, r.Attention[0])
	}
	restarts := func(r *audit.FleetRow) int {
		n := 0
		for _, m := range r.Failed {
			n += m.Restarts
		}
		return n
	}
	for range 20000 {
		a, b := row(), row()
		if rng.IntN(4) == 0 {
			b = a // equal counts, ties broken by age and name
			b.Node, b.HaveAge = fmt.Sprintf("n%d", rng.IntN(3)), float64(rng.IntN(3))
		}
		age := func(r *audit.FleetRow) float64 {
			if len(r.Attention) == 0 {
				return 0 // a row that needs nothing: by name alone
			}
			return r.HaveAge
		}
		want := cmp.Or(cmp.Compare(first(&a), first(&b)), -cmp.Compare(len(a.Attention), len(b.Attention)),
			-cmp.Compare(restarts(&a), restarts(&b)), -cmp.Compare(a.Owed, b.Owed), -cmp.Compare(len(a.Pending), len(b.Pending)),
			-cmp.Compare(a.Unsettled, b.Unsettled), -cmp.Compare(age(&a), age(&b)), cmp.Compare(a.Node, b.Node))
		ka, kb := audit.FleetKeyOf(&a), audit.FleetKeyOf(&b)
		if got := audit.CompareFleetKeys(&ka, &kb); got != want {
			t.Fatalf("compare %+v\nwith %+v:\n got %d, want %d", a, b, got, want)
		}
	}
}

// stableOrder is keys' indexes in CompareFleetKeys' order, ties in
// their given order: what FleetKeysOrder must return.
func stableOrder(keys []audit.FleetKey) []int32 {
	order := make([]int32, len(keys))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(i, j int32) int { return audit.CompareFleetKeys(&keys[i], &keys[j]) })
	return order
}

// FleetKeysOrder puts keys in CompareFleetKeys' order, equal keys in the
// order given, whatever the ages (NaN, ±0, ±Inf among them) and counts
// (some past what a packed field holds).
func TestFleetKeysOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ages := []float64{math.NaN(), math.Copysign(0, -1), 0, math.Inf(1), math.Inf(-1), -1.5, 1.5, 2, 1e300}
	for try := range 200 {
		n := rng.IntN(300)
		keys := make([]audit.FleetKey, n)
		for i := range keys {
			r := audit.FleetRow{Node: fmt.Sprintf("n%d", rng.IntN(4)), HaveAge: ages[rng.IntN(len(ages))],
				Owed: []int{0, 1, 2, 16384, -1}[rng.IntN(5)], Unsettled: rng.IntN(3)}
			for _, need := range audit.FleetNeeds[:4] {
				if rng.IntN(3) == 0 {
					r.Attention = append(r.Attention, need)
				}
			}
			keys[i] = audit.FleetKeyOf(&r)
		}
		if got, want := audit.FleetKeysOrder(keys), stableOrder(keys); !slices.Equal(got, want) {
			t.Fatalf("try %d: order %v, want %v", try, got, want)
		}
	}
	// Many keys that all pack (sorted by radix, then by name within
	// equal counts and ages): counts and ages of every byte, ties on
	// both, names shared.
	for try := range 100 {
		n := 256 + rng.IntN(2000)
		keys := make([]audit.FleetKey, n)
		for i := range keys {
			age := ages[rng.IntN(len(ages))]
			if rng.IntN(2) == 0 {
				age = float64(rng.IntN(5)) * rng.Float64() * 1e6
			}
			r := audit.FleetRow{Node: fmt.Sprintf("n%d", rng.IntN(40)), HaveAge: age,
				Owed: []int{0, 1, 2, 255, 256, 16383}[rng.IntN(6)], Unsettled: rng.IntN(3) * rng.IntN(1400)}
			for _, need := range audit.FleetNeeds {
				if rng.IntN(4) == 0 {
					r.Attention = append(r.Attention, need)
				}
			}
			keys[i] = audit.FleetKeyOf(&r)
		}
		if got := audit.FleetKeysOrder(keys); !slices.Equal(got, stableOrder(keys)) {
			t.Fatalf("packed try %d: order differs from CompareFleetKeys' (n %d)", try, n)
		}
	}
}
