package reconcile_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// burst appends n of node's own events of kind k (a have when k is
// empty), each of size bytes, every apart in stream time from the last
// event; the stream's clock then goes on at its step before. invalid
// makes each a payload that does not decode (junk on the node's
// subject).
func burst(s *reconciletest.Stream, node string, k events.Kind, n, size int, every time.Duration, invalid bool) {
	step := s.Step
	rebase := func(step time.Duration) {
		last := s.Next() - 1
		s.Base, s.Step = s.TimeOf(last).Add(-time.Duration(last)*step), step
	}
	rebase(every)
	defer rebase(step)
	for range n {
		ev := events.Event{Node: node, Kind: k, Size: size}
		switch k {
		case events.KindSettle:
			ev.Payload = &events.Settle{Module: "app", Op: events.OpApply, Plan: lastOr(s.Plans(node), 1)}
		case events.KindRefusal:
			ev.Payload = &events.Refusal{Module: "app", Path: "/1/a", Reason: events.ReasonNoAccount, Plan: lastOr(s.Plans(node), 0), Writer: "prov"}
		default:
			ev.Kind = events.KindHave
			ev.Payload = &events.Have{Modules: []events.HaveModule{}}
		}
		if invalid {
			ev.Payload, ev.Err = nil, fmt.Errorf("%w: junk", events.ErrMalformed)
		} else {
			events.Stamp(ev.Payload, s.TimeOf(s.Next()))
		}
		s.AppendEvent(ev)
	}
}

func lastOr(seqs []uint64, or uint64) uint64 {
	if len(seqs) == 0 {
		return or
	}
	return seqs[len(seqs)-1]
}

// noisyEntry reports whether e is a journal entry of the noisy rule.
func noisyEntry(e reconcile.Effect) bool {
	j, ok := e.Payload.(*events.Journal)
	return ok && j.Level == events.LevelWarn && (strings.HasPrefix(j.Msg, "noisy: ") || strings.HasPrefix(j.Msg, "still noisy: "))
}

// TestNoisyChangesOnlyTheJournal: over random histories with floods of
// the node's own events among them (large, small, undecodable), the
// fold with the noisy rule makes every effect the fold without it makes,
// with the same ids and payloads, and its state differs only in the
// episode (State.Noisy); what it adds is the rule's journal entries, each
// the last effect of its event.
func TestNoisyChangesOnlyTheJournal(t *testing.T) {
	tried := 0
	rapid.Check(t, func(rt *rapid.T) {
		noisy := 0
		s := newSim(rt)
		for i := range rapid.IntRange(1, 8).Draw(rt, "rounds") {
			randomHistory(rt, s, rapid.IntRange(0, 10).Draw(rt, fmt.Sprint("events", i)))
			if rapid.Bool().Draw(rt, "flood") {
				burst(s.Stream, "ace", rapid.SampledFrom([]events.Kind{events.KindHave, events.KindSettle, events.KindRefusal}).Draw(rt, "kind"),
					rapid.IntRange(1, 40).Draw(rt, "n"), rapid.SampledFrom([]int{0, 120, 20_000, 200_000, 400_000}).Draw(rt, "size"),
					rapid.SampledFrom([]time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second}).Draw(rt, "every"),
					rapid.IntRange(0, 4).Draw(rt, "invalid") == 0)
			}
		}
		plain := reconcile.NewState("ace")
		for _, ev := range s.Events {
			want := plain.FoldUncounted(ev)
			got := s.Effects(ev.Seq)
			if ev.Kind.Effect() {
				got = nil // the live fold's effects are not inputs: folding them makes none
			}
			i := 0
			for ; i < len(got) && i < len(want); i++ {
				if got[i].ID() != want[i].ID() || encode(rt, got[i].Payload) != encode(rt, want[i].Payload) {
					rt.Fatalf("#%d effect %d: %s %s, without the rule %s %s", ev.Seq, i, got[i].ID(), encode(rt, got[i].Payload), want[i].ID(), encode(rt, want[i].Payload))
				}
			}
			if len(want) > len(got) {
				rt.Fatalf("#%d: the rule took effect %s away", ev.Seq, want[len(got)].ID())
			}
			switch extra := got[i:]; {
			case len(extra) > 1:
				rt.Fatalf("#%d: %d effects more than without the rule", ev.Seq, len(extra))
			case len(extra) == 1 && !noisyEntry(extra[0]):
				rt.Fatalf("#%d: the rule added %s %s", ev.Seq, extra[0].ID(), encode(rt, extra[0].Payload))
			case len(extra) == 1:
				noisy++
			}
		}
		live := *s.state
		if live.Noisy == nil && noisy > 0 {
			rt.Fatalf("journaled noisy, no episode kept")
		}
		tried += noisy
		live.Noisy = nil
		if got, want := encode(rt, &live), encode(rt, plain); got != want {
			rt.Fatalf("the state beside the episode:\n%s\nwithout the rule:\n%s", got, want)
		}
	})
	if tried == 0 {
		t.Fatal("no history was noisy: the property tried nothing")
	}
}

// TestNoisyRestart is the rule under a restart (DESIGN.md §5.1, and the
// decision "The noisy rule's window is not in the snapshot"): the
// tester's flood (400 haves of 200 KB, 7 ms apart, after a busy apply)
// and a count flood, folded whole and, for every cut, folded to the cut,
// encoded and decoded (a snapshot), then folded on. Every effect but the
// rule's journal entries is the same. A cut inside a window already
// noisy, or after a window's last event, journals and keeps exactly what
// the whole fold does. A cut inside a window not yet noisy forgets what
// that window counted before it: the episode may be short by at most
// that (under both thresholds), and its entries differ by at most one.
func TestNoisyRestart(t *testing.T) {
	for _, c := range []struct {
		name   string
		make   func(s *reconciletest.Stream)
		stride int // cut after every stride-th event
	}{
		{"tester's flood", func(s *reconciletest.Stream) {
			s.Append("ace", want("app", "/1/a"))
			burst(s, "ace", events.KindRefusal, 256, 1400, 5*time.Millisecond, false)
			burst(s, "ace", events.KindSettle, 32, 200, 5*time.Millisecond, false)
			burst(s, "ace", events.KindHave, 1, 0, 10*time.Minute, false)
			burst(s, "ace", events.KindHave, 400, 200_000, 7*time.Millisecond, false)
		}, 1},
		{"count flood", func(s *reconciletest.Stream) {
			burst(s, "ace", events.KindHave, 1, 0, 10*time.Minute, false)
			burst(s, "ace", events.KindHave, 2100, 120, 4*time.Millisecond, false)
		}, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := reconciletest.New(base, time.Second)
			c.make(s)
			whole := s.State("ace")
			if whole.Noisy == nil {
				t.Fatal("the whole fold was not noisy: the test tries nothing")
			}
			var wholeEffs []reconcile.Effect
			for _, ev := range s.Events {
				wholeEffs = append(wholeEffs, s.Effects(ev.Seq)...)
			}
			wholeOthers, wholeEntries := split(t, wholeEffs)
			exact, bounded := 0, 0
			// The prefix is folded once, on: at each cut its state is
			// snapshotted and the rest folded from the snapshot.
			prefix, folded := reconcile.NewState("ace"), 0
			var prefixOthers, prefixEntries []string
			for cut := 1; cut < len(s.Events); cut += c.stride {
				for ; folded < cut; folded++ {
					o, e := split(t, prefix.Fold(s.Events[folded]))
					prefixOthers, prefixEntries = append(prefixOthers, o...), append(prefixEntries, e...)
				}
				st := prefix
				var effs []reconcile.Effect
				// What the window of the cut holds, and whether the
				// cut leaves it exact: noisy there, or its last event.
				at := s.Events[cut-1].Time.Truncate(reconcile.NoisyWindow)
				inNoisy := st.Noisy != nil && !st.Noisy.Last.Before(at)
				ends := !s.Events[cut].Time.Truncate(reconcile.NoisyWindow).Equal(at)
				var lost reconcile.Traffic
				for _, ev := range s.Events[:cut] {
					own := ev.Kind == events.KindHave || ev.Kind == events.KindSettle || ev.Kind == events.KindRefusal || ev.Kind == events.KindFilled
					if own && ev.Time.Truncate(reconcile.NoisyWindow).Equal(at) {
						lost.Haves++ // by count: Traffic's kind does not matter here
						lost.Bytes += int64(ev.Size)
					}
				}
				snap, err := reconcile.MarshalState(st)
				if err != nil {
					t.Fatal(err)
				}
				if st, err = reconcile.UnmarshalState(snap); err != nil { // not prefix: a state of its own
					t.Fatal(err)
				}
				for _, ev := range s.Events[cut:] {
					effs = append(effs, st.Fold(ev)...)
				}
				o, e := split(t, effs)
				others := append(prefixOthers[:len(prefixOthers):len(prefixOthers)], o...)
				entries := append(prefixEntries[:len(prefixEntries):len(prefixEntries)], e...)

				if !slices.Equal(others, wholeOthers) {
					t.Fatalf("cut at #%d: an effect other than the rule's entries differs", s.Events[cut-1].Seq)
				}
				if inNoisy || ends {
					exact++
					if got, want := strings.Join(entries, "\n"), strings.Join(wholeEntries, "\n"); got != want {
						t.Fatalf("cut at #%d (noisy window %v, its end %v): entries\n%s\nwhole\n%s", s.Events[cut-1].Seq, inNoisy, ends, got, want)
					}
					if got, want := encode(t, st), encode(t, whole); got != want {
						t.Fatalf("cut at #%d: state\n%s\nwhole\n%s", s.Events[cut-1].Seq, got, want)
					}
					continue
				}
				bounded++
				if lost.Events() > reconcile.NoisyEvents || lost.Bytes > reconcile.NoisyBytes {
					t.Fatalf("cut at #%d: a window not noisy held %s", s.Events[cut-1].Seq, lost)
				}
				if d := len(entries) - len(wholeEntries); d < -1 || d > 1 {
					t.Fatalf("cut at #%d: %d entries, whole %d", s.Events[cut-1].Seq, len(entries), len(wholeEntries))
				}
				w, r := whole.Noisy, st.Noisy
				if r == nil {
					if w.Events() > lost.Events() && w.Bytes > lost.Bytes {
						t.Fatalf("cut at #%d: no episode; whole %s", s.Events[cut-1].Seq, w)
					}
					continue
				}
				if r.Events() > w.Events() || r.Bytes > w.Bytes || r.Events() < w.Events()-lost.Events() || r.Bytes < w.Bytes-lost.Bytes {
					t.Fatalf("cut at #%d, %s lost: episode %s (%d events), whole %s (%d events)",
						s.Events[cut-1].Seq, lost, r, r.Events(), w, w.Events())
				}
			}
			if exact == 0 || bounded == 0 {
				t.Fatalf("%d exact cuts, %d bounded: the test tries too little", exact, bounded)
			}
			t.Logf("%d cuts: %d exact, %d within the bound", exact+bounded, exact, bounded)
		})
	}
}

// split encodes effs as "id payload", the noisy rule's entries apart
// from the others.
func split(t testing.TB, effs []reconcile.Effect) (others, entries []string) {
	for _, e := range effs {
		if noisyEntry(e) {
			entries = append(entries, e.ID()+" "+encode(t, e.Payload))
		} else {
			others = append(others, e.ID()+" "+encode(t, e.Payload))
		}
	}
	return others, entries
}
