package feed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// Remains is what the stream still holds of a fleet's newest rollout
// whose start its limits (--max-age, --max-bytes) dropped: the rollout
// cannot be replayed (its start holds its targets, batches and wants),
// and `rollout status`, `rollout ls` and the console's rollouts page say
// what remains of it, in the same words ([Remains.Note]).
type Remains struct {
	// First is the stream's first sequence and FirstTime its time;
	// MaxAge, MaxBytes and MaxMsgs its limits.
	First     uint64
	FirstTime time.Time
	MaxAge    time.Duration
	MaxBytes  int64
	MaxMsgs   int64
	// ID is the rollout (its start's sequence); 0: none of the fleet's
	// rollout events remain, or the newest names a start the stream
	// holds.
	ID uint64
	// N counts its events that remain, From and To the first and last
	// of them; Lines are one line each but ticks (counted on the last
	// line), as `rollout status` lists them.
	N        int
	From, To uint64
	Lines    []string
}

// Limited reports whether the stream has limits that drop events.
func (g Remains) Limited() bool { return g.MaxAge > 0 || g.MaxBytes > 0 || g.MaxMsgs > 0 }

// Dropped reports whether the stream's limits dropped events: it has
// limits, and it begins past #1.
func (g Remains) Dropped() bool { return g.First > 1 && g.Limited() }

// StartGone reports whether a rollout of the fleet remains whose start
// the stream's limits dropped: what `rollout ls` and the console list as
// "start gone".
func (g Remains) StartGone() bool { return g.ID != 0 && g.Dropped() }

// Keeps says what the stream keeps and where it begins: "keeps 1h0m0s
// of events (--max-age) and begins at #40 (2026-12-05T04:48:00Z)".
func (g Remains) Keeps() string {
	begins := fmt.Sprintf("#%d", g.First)
	if !g.FirstTime.IsZero() {
		begins += " (" + g.FirstTime.UTC().Format(time.RFC3339) + ")"
	}
	return "keeps " + g.Limits() + " and begins at " + begins
}

// Limits says what the stream's limits keep: "1h0m0s of events
// (--max-age)".
func (g Remains) Limits() string {
	var lim []string
	if g.MaxAge > 0 {
		lim = append(lim, g.MaxAge.String()+" of events (--max-age)")
	}
	if g.MaxBytes > 0 {
		lim = append(lim, fmt.Sprintf("%d bytes (--max-bytes)", g.MaxBytes))
	}
	if g.MaxMsgs > 0 {
		lim = append(lim, fmt.Sprintf("%d events", g.MaxMsgs))
	}
	return strings.Join(lim, " and ")
}

// Newest is the line of the newest of its events that remain but ticks;
// "" when only ticks remain.
func (g Remains) Newest() string {
	for i := len(g.Lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(g.Lines[i], "#") { // not the ticks' count
			return g.Lines[i]
		}
	}
	return ""
}

// Started is what a list says in its STARTED column of a rollout whose
// start is gone: "before" the stream's first event's time, or "-".
func (g Remains) Started() string {
	if g.FirstTime.IsZero() {
		return "-"
	}
	return "before " + g.FirstTime.UTC().Format(time.RFC3339)
}

// Note is the line a list of the fleets' rollouts says under its table
// of fleet's rollout whose start is gone ("start gone: fleet web's
// rollout 13: its start (#13) is gone from the stream, which keeps …").
func (g Remains) Note(fleet string) string {
	newest := "the newest of its events that remain: " + g.Newest()
	if g.Newest() == "" {
		newest = "only its ticks remain"
	}
	return fmt.Sprintf("start gone: fleet %s's rollout %d: its start (#%d) is gone from the stream, which %s; %s "+
		"('meshfold rollout status %s' lists the %s of it that remain)", fleet, g.ID, g.ID, g.Keeps(), newest, fleet, plural(g.N, "event"))
}

// Gone says why fleet's rollout cannot be shown, its start gone: what
// `rollout status` and the console's page of the fleet say, above the
// lines of what remains ([Remains.Lines]).
func (g Remains) Gone(fleet string) string {
	return fmt.Sprintf("fleet %s's rollout %d: its start (#%d) is gone from the stream, which %s: "+
		"its view needs the start (its targets, batches and wants) and cannot be replayed; %s of it remain (#%d to #%d). "+
		"'meshfold fleet' and 'meshfold state NODE' say what each node runs; a new 'meshfold apply' starts a rollout the stream holds whole",
		fleet, g.ID, g.ID, g.Keeps(), plural(g.N, "event"), g.From, g.To)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// ReadRemains reads the stream's limits and the fleet's rollout events
// it holds, of the rollout the newest of them names (stream is cfg's).
//
// Errors: the stream's info, reads and follow.
func ReadRemains(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cfg store.StreamConfig, fleet string) (Remains, error) {
	var g Remains
	info, err := stream.Info(ctx)
	if err != nil {
		return g, err
	}
	g.First, g.FirstTime = info.State.FirstSeq, info.State.FirstTime
	g.MaxAge, g.MaxBytes, g.MaxMsgs = info.Config.MaxAge, info.Config.MaxBytes, info.Config.MaxMsgs
	subj := cfg.Subjects()
	filter := subj.Rollout(fleet, ">") // named operators' verbs too
	last, err := stream.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return g, nil
	}
	if err != nil {
		return g, err
	}
	g.ID = rolloutOf(subj, last.Subject, last.Data)
	if g.ID == 0 || g.ID >= g.First {
		// A verb naming no rollout, or a start the stream holds (a
		// start published since the replay looked): nothing to say.
		g.ID = 0
		return g, nil
	}
	tail, err := store.FollowRidingOut(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: subj, Filter: filter, Start: g.First})
	if err != nil {
		return g, err
	}
	defer tail.Stop()
	ticks := 0
	for {
		var x store.Tailed
		select {
		case <-ctx.Done():
			return g, ctx.Err()
		case x = <-tail.C():
		}
		if x.Err != nil {
			return g, x.Err
		}
		seq := x.Meta.Sequence.Stream
		if rolloutOf(subj, x.Msg.Subject(), x.Msg.Data()) == g.ID {
			g.N++
			if g.From == 0 {
				g.From = seq
			}
			g.To = seq
			if l, tick := remainsLine(subj, seq, x.Meta.Timestamp, x.Msg.Subject(), x.Msg.Data()); tick {
				ticks++
			} else if l != "" {
				g.Lines = append(g.Lines, l)
			}
		}
		if seq >= last.Sequence {
			break
		}
	}
	if ticks > 0 {
		g.Lines = append(g.Lines, fmt.Sprintf("(and %s: the controller's clock)", plural(ticks, "tick")))
	}
	return g, nil
}

// rolloutOf returns the rollout a fleet's rollout event names (0: none,
// or not decodable).
func rolloutOf(subj events.Subjects, subject string, data []byte) uint64 {
	_, k, ok := subj.ParseRollout(subject)
	if !ok {
		return 0
	}
	p, err := rollout.Decode(rollout.Kind(k), data)
	if err != nil {
		return 0
	}
	switch p := p.(type) {
	case *rollout.Record:
		return p.Rollout
	case *rollout.Published:
		return p.Rollout
	case *rollout.Refused:
		return p.Rollout
	case *rollout.Tick:
		return p.Rollout
	case *rollout.Operator:
		return p.Rollout
	case *rollout.Nodes:
		return p.Rollout
	}
	return 0
}

// remainsLine is one remaining event's line; tick is set for a tick
// (counted, not listed).
func remainsLine(subj events.Subjects, seq uint64, at time.Time, subject string, data []byte) (line string, tick bool) {
	_, k, _ := subj.ParseRollout(subject)
	p, err := rollout.Decode(rollout.Kind(k), data)
	if err != nil {
		return "", false
	}
	head := fmt.Sprintf("#%d %s %s", seq, at.UTC().Format(time.RFC3339), k)
	switch p := p.(type) {
	case *rollout.Tick:
		return "", true
	case *rollout.Record:
		node := ""
		if p.Node != "" {
			node = " " + p.Node
		}
		return fmt.Sprintf("%s%s: %s: %s", head, node, p.What, events.Plain(p.Msg)), false
	case *rollout.Published:
		return fmt.Sprintf("%s: %s's %s want stored at #%d", head, p.Node, p.Step, p.Want), false
	case *rollout.Refused:
		return fmt.Sprintf("%s: %s's %s want: %s", head, p.Node, p.Step, events.ErrorText(p.Error)), false
	case *rollout.Operator:
		l := fmt.Sprintf("%s by %s", head, events.Text(p.By))
		if p.Reason != "" {
			l += ": " + events.Plain(p.Reason)
		}
		return l, false
	}
	return head, false
}
