package reconcile

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
)

// The noisy rule (a tester's finding M6): a node's credentials may
// publish its own events (have, settle, refusal, filled) as fast and as
// large as the server takes them, and the stream keeps every one for the
// audit: one node could fill the server's disk for the whole mesh. The
// server bounds a node user's message (store/auth.NodeMaxPayload), not
// its rate, so the fold measures it: a node whose own events pass
// NoisyEvents or NoisyBytes within one window of stream time is noisy.
// The fold journals it at warn when it starts, and again each time its
// bytes or events double (a few entries for any flood: six for the
// tester's 400 haves), and keeps the episode in [State.Noisy] for
// `fleet`, `state` and the console. Counting changes no plan, knock or
// other effect: the episode's journal entries come after every other
// effect of their event, so no other effect's id moves.
//
// The thresholds are above what a node running the largest want does at
// its busiest, a plan's apply: a settle per module and a refusal and a
// filled per file, at most 32 + 2×256 events, and a few haves of a few
// kilobytes (the largest valid have is 102 KB); and far below what fills
// a disk (the tester's flood: 400 haves of 200 KB, 80 MB in 2.85 s).
//
// Windows are fixed spans of stream time, aligned on multiples of
// NoisyWindow (:00, :10, :20, … of each minute), so that where they fall
// depends on the stream alone, not on where a fold started. A flood split
// across two windows is seen once it passes a threshold within one, and
// a node that stays just under them (2 MB every 10 s, 17 GB a day) is not
// flagged; the stream's --max-bytes bounds that (docs/operations.md,
// "A node that floods the stream").
//
// The window's counts live in the state's memory only (State.traffic),
// never in its snapshot. A window is noisy exactly when the episode's
// last event is in it, which the snapshot holds, so a fold restarted from
// a snapshot inside a noisy window journals what an uninterrupted one
// does; one restarted inside a window not yet noisy counts that window
// from the restart on: what the window held before the snapshot (under
// both thresholds) is not counted, so that window's entry may come later
// or not at all, and that episode's totals may be short by as much. Every
// later window counts the same (docs/architecture.md, "The noisy rule's
// window is not in the snapshot").
const (
	// NoisyWindow is the span of stream time the rule counts over.
	NoisyWindow = 10 * time.Second
	// NoisyEvents is the most own events a node publishes in a window
	// without being noisy.
	NoisyEvents = 1000
	// NoisyBytes is the most bytes (as stored: each message's data) of
	// own events a node publishes in a window without being noisy.
	NoisyBytes = 2_000_000
)

// trafficWindow counts the node's own events of one window of stream
// time, [start, start+NoisyWindow) (start: first.Truncate(NoisyWindow)),
// from the first one this fold saw in it (firstSeq, at stream time
// first). The zero value is no window. 72 bytes in every state's memory.
type trafficWindow struct {
	first    time.Time
	firstSeq uint64
	Traffic
}

// start is the start of w's window; zero for no window.
func (w *trafficWindow) start() time.Time {
	if w.first.IsZero() {
		return time.Time{}
	}
	return w.first.Truncate(NoisyWindow)
}

// Traffic counts a node's own events, by kind, and their bytes.
type Traffic struct {
	Haves    int   `json:"haves,omitempty"`
	Settles  int   `json:"settles,omitempty"`
	Refusals int   `json:"refusals,omitempty"`
	Filled   int   `json:"filled,omitempty"`
	Bytes    int64 `json:"bytes,omitempty"`
}

// Events returns how many events t counts.
func (t Traffic) Events() int { return t.Haves + t.Settles + t.Refusals + t.Filled }

func (t *Traffic) add(k events.Kind, size int) {
	switch k {
	case events.KindHave:
		t.Haves++
	case events.KindSettle:
		t.Settles++
	case events.KindRefusal:
		t.Refusals++
	case events.KindFilled:
		t.Filled++
	}
	t.Bytes += int64(max(size, 0))
}

func (t *Traffic) plus(o Traffic) {
	t.Haves += o.Haves
	t.Settles += o.Settles
	t.Refusals += o.Refusals
	t.Filled += o.Filled
	t.Bytes += o.Bytes
}

// String says what t counts, the largest count first: "400 haves, 80 MB"
// (bytes in decimal units; left out when not known).
func (t Traffic) String() string {
	type count struct {
		n    int
		one  string
		many string
	}
	cs := []count{{t.Haves, "have", "haves"}, {t.Settles, "settle", "settles"}, {t.Refusals, "refusal", "refusals"}, {t.Filled, "filled", "filled"}}
	var parts []string
	for len(cs) > 0 {
		i := 0
		for j := range cs {
			if cs[j].n > cs[i].n {
				i = j
			}
		}
		if c := cs[i]; c.n > 0 {
			w := c.many
			if c.n == 1 {
				w = c.one
			}
			parts = append(parts, strconv.Itoa(c.n)+" "+w)
		}
		cs = append(cs[:i], cs[i+1:]...)
	}
	if t.Bytes > 0 {
		parts = append(parts, FormatBytes(t.Bytes))
	}
	return strings.Join(parts, ", ")
}

// NoisyRecord is a noisy episode of the node: consecutive windows each of
// which passed a threshold, counted from the event that passed it in the
// first (Seq, at stream time Since) through the newest (LastSeq, Last).
type NoisyRecord struct {
	Seq   uint64    `json:"seq"`
	Since time.Time `json:"since"`
	// SinceSeq is the sequence of the event at Since.
	SinceSeq uint64    `json:"since_seq"`
	LastSeq  uint64    `json:"last_seq"`
	Last     time.Time `json:"last"`
	Traffic
	// Warned is the traffic at the episode's last journal entry.
	Warned Traffic `json:"warned"`
}

// String is the episode as `fleet` and `state` say it: "400 haves, 80 MB
// in 2.9 s".
func (n *NoisyRecord) String() string {
	return fmt.Sprintf("%s in %s", n.Traffic, FormatSpan(n.Last.Sub(n.Since)))
}

// Shown reports whether n is news at now: its last event less than
// NoisyShow before now. False for a nil n.
func (n *NoisyRecord) Shown(now time.Time) bool {
	return n != nil && now.Sub(n.Last) < NoisyShow
}

// NoisyShow is how long after its last event `fleet` and the console
// flag a noisy episode (its journal entries stay until acknowledged).
const NoisyShow = 24 * time.Hour

// traffic counts the event, when it is one of the node's own (its kind
// is one the node user publishes, decoded or not), and journals a noisy
// episode's start and each doubling. Fold calls it after every other rule
// of the event, so that its journal entry is the event's last effect.
func (f *folder) traffic() {
	switch f.ev.Kind {
	case events.KindHave, events.KindSettle, events.KindRefusal, events.KindFilled:
	default:
		return
	}
	s, w, n := f.s, &f.s.traffic, f.s.Noisy
	// Windows never go back: an event stamped before the newest one
	// counted (a new stream leader whose clock is behind the old one's)
	// counts at that one's time.
	t, start := f.ev.Time, w.start()
	if t.Before(start) {
		t = start
	}
	if n != nil && t.Before(n.Last) {
		t = n.Last
	}
	if ws := t.Truncate(NoisyWindow); start.IsZero() || ws.After(start) {
		*w, start = trafficWindow{first: t, firstSeq: f.ev.Seq}, ws
	}
	w.add(f.ev.Kind, f.ev.Size)
	if n != nil && !n.Last.Before(start) {
		// The episode's last event is in this window: the window is
		// noisy, and its every event counts in the episode.
		n.add(f.ev.Kind, f.ev.Size, f.ev.Seq, t)
		f.warnNoisy(false)
		return
	}
	if w.Events() <= NoisyEvents && w.Bytes <= NoisyBytes {
		return
	}
	if n != nil && !n.Last.Before(start.Add(-NoisyWindow)) {
		// The window before was noisy: one episode.
		n.Traffic.plus(w.Traffic)
		n.LastSeq, n.Last = f.ev.Seq, t
		f.warnNoisy(false)
		return
	}
	s.Noisy = &NoisyRecord{Seq: f.ev.Seq, Since: w.first, SinceSeq: w.firstSeq, LastSeq: f.ev.Seq, Last: t, Traffic: w.Traffic}
	f.warnNoisy(true)
}

func (n *NoisyRecord) add(k events.Kind, size int, seq uint64, t time.Time) {
	n.Traffic.add(k, size)
	n.LastSeq, n.Last = seq, t
}

// warnNoisy journals the episode at its start, and when its events or
// bytes have doubled since its last entry.
func (f *folder) warnNoisy(start bool) {
	n := f.s.Noisy
	if !start && n.Events() < 2*n.Warned.Events() && n.Bytes < 2*n.Warned.Bytes {
		return
	}
	n.Warned = n.Traffic
	what := "noisy"
	if !start {
		what = "still noisy"
	}
	f.journal(events.LevelWarn, "%s: %s, over %d events or %s of its own events in %s; the stream keeps every one, "+
		"so a node that goes on fills the server's disk for the whole mesh. If its agent is not looping, its node credential may be stolen: "+
		"`meshfold auth revoke %s` (docs/operations.md, \"A node that floods the stream\")",
		what, n, NoisyEvents, FormatBytes(NoisyBytes), FormatSpan(NoisyWindow), "node-"+f.s.Node)
}

// FormatBytes says b in decimal units, as disk sizes are read: "812 B",
// "4.2 MB", "80 MB", "1.3 GB".
func FormatBytes(b int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB"}
	v, i := float64(b), 0
	for v >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	if i == 0 || v >= 10 {
		return strconv.FormatFloat(v, 'f', 0, 64) + " " + units[i]
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i]
}

// FormatSpan says d for an episode: "20 ms", "0.4 s", "3 s", "12 min",
// "2 h".
func FormatSpan(d time.Duration) string {
	switch {
	case d < 100*time.Millisecond:
		return strconv.Itoa(int(d.Round(time.Millisecond)/time.Millisecond)) + " ms"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Round(time.Second)/time.Second)) + " s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Round(time.Minute)/time.Minute)) + " min"
	}
	return strconv.Itoa(int(d.Round(time.Hour)/time.Hour)) + " h"
}
