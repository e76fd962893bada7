package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

// rolloutGone is noRollout for the rollout reads and verbs, told what
// the stream's limits dropped: a fleet whose newest start aged out of
// the stream (--max-age, --max-bytes) while its later events remain (its
// records, its steps' outcomes, its ticks, the operators' verbs) is no
// mistyped name. It printed "no rollout of fleet web" (exit 2) while the
// rollout was still running (and `rollout ls` left the fleet out; it
// lists it now, its start gone: rolloutRemains.startGone): now the
// error says which rollout it was, why its view cannot be replayed
// (the start holds its targets, batches and wants), where the stream
// begins, and w gets what remains of it, one line per record or verb,
// and exit 1 (the view asked for cannot be had). A fleet none of whose
// rollout events remain, in a stream that dropped events, says a rollout
// started before the stream's beginning would be gone too. Any other
// error is returned as it is.
func (a *app) rolloutGone(ctx context.Context, nc *nats.Conn, w io.Writer, fleet string, err error) error {
	if !errors.Is(err, feed.ErrNoRollout) {
		return err
	}
	g, gerr := readRolloutRemains(ctx, a, nc, fleet)
	if gerr != nil || !g.dropped() {
		return noRollout(err, fleet)
	}
	if g.id == 0 {
		return withCode(exitUsage, &quietErr{err: err, msg: fmt.Sprintf("no rollout of fleet %q in the stream, which %s: a rollout started before that is gone from it "+
			"('meshfold rollout ls' lists the fleets that have one; 'meshfold apply -f FLEET.yaml' starts one)", fleet, g.keeps())})
	}
	for _, l := range g.lines {
		fmt.Fprintln(w, l)
	}
	return withCode(exitError, &quietErr{err: err, msg: fmt.Sprintf("fleet %s's rollout %d: its start (#%d) is gone from the stream, which %s: "+
		"its view needs the start (its targets, batches and wants) and cannot be replayed; %s of it remain (#%d to #%d, above). "+
		"'meshfold fleet' and 'meshfold state NODE' say what each node runs; a new 'meshfold apply' starts a rollout the stream holds whole",
		fleet, g.id, g.id, g.keeps(), plural(g.n, "event"), g.from, g.to)})
}

// rolloutRemains is what the stream still holds of a fleet's newest
// rollout whose start it dropped.
type rolloutRemains struct {
	first     uint64    // the stream's first sequence
	firstTime time.Time // and its time
	maxAge    time.Duration
	maxBytes  int64
	maxMsgs   int64
	id        uint64 // the rollout (its start's sequence); 0: none of the fleet's events remain
	n         int    // its events read
	from, to  uint64
	lines     []string
}

func (g rolloutRemains) limited() bool { return g.maxAge > 0 || g.maxBytes > 0 || g.maxMsgs > 0 }

// dropped reports whether the stream's limits dropped events: it has
// limits, and it begins past #1.
func (g rolloutRemains) dropped() bool { return g.first > 1 && g.limited() }

// startGone reports whether a rollout of the fleet remains whose start
// the stream's limits dropped: what rolloutGone says of it, and what
// 'rollout ls' lists as "start gone".
func (g rolloutRemains) startGone() bool { return g.id != 0 && g.dropped() }

// row is what 'rollout ls' says of a rollout whose start is gone.
func (g rolloutRemains) row() *startGone {
	sg := &startGone{StreamBegins: g.first, StreamBeginsAt: g.firstTime, StreamKeeps: g.limits(), Events: g.n, keeps: g.keeps()}
	for i := len(g.lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(g.lines[i], "#") { // not the ticks' count
			sg.Newest = g.lines[i]
			break
		}
	}
	return sg
}

// keeps says what the stream keeps and where it begins.
func (g rolloutRemains) keeps() string {
	begins := fmt.Sprintf("#%d", g.first)
	if !g.firstTime.IsZero() {
		begins += " (" + g.firstTime.UTC().Format(time.RFC3339) + ")"
	}
	return "keeps " + g.limits() + " and begins at " + begins
}

// limits says what the stream's limits keep: "1h0m0s of events
// (--max-age)".
func (g rolloutRemains) limits() string {
	var lim []string
	if g.maxAge > 0 {
		lim = append(lim, g.maxAge.String()+" of events (--max-age)")
	}
	if g.maxBytes > 0 {
		lim = append(lim, fmt.Sprintf("%d bytes (--max-bytes)", g.maxBytes))
	}
	if g.maxMsgs > 0 {
		lim = append(lim, fmt.Sprintf("%d events", g.maxMsgs))
	}
	return strings.Join(lim, " and ")
}

// readRolloutRemains reads the stream's limits and the fleet's rollout
// events it holds, of the rollout the newest of them names.
func readRolloutRemains(ctx context.Context, a *app, nc *nats.Conn, fleet string) (rolloutRemains, error) {
	var g rolloutRemains
	js, err := jetstream.New(nc)
	if err != nil {
		return g, err
	}
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return g, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return g, err
	}
	g.first, g.firstTime = info.State.FirstSeq, info.State.FirstTime
	g.maxAge, g.maxBytes, g.maxMsgs = info.Config.MaxAge, info.Config.MaxBytes, info.Config.MaxMsgs
	subj := scfg.Subjects()
	filter := subj.Rollout(fleet, "*")
	last, err := stream.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return g, nil
	}
	if err != nil {
		return g, err
	}
	g.id = rolloutOf(subj, last.Subject, last.Data)
	if g.id == 0 || g.id >= g.first {
		// A verb naming no rollout, or a start the stream holds (a
		// start published since the replay looked): nothing to say.
		g.id = 0
		return g, nil
	}
	tail, err := store.FollowRidingOut(ctx, js, store.TailConfig{Stream: scfg.Name, Subjects: subj, Filter: filter, Start: g.first})
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
		if rolloutOf(subj, x.Msg.Subject(), x.Msg.Data()) == g.id {
			g.n++
			if g.from == 0 {
				g.from = seq
			}
			g.to = seq
			if l, tick := remainsLine(subj, seq, x.Meta.Timestamp, x.Msg.Subject(), x.Msg.Data()); tick {
				ticks++
			} else if l != "" {
				g.lines = append(g.lines, l)
			}
		}
		if seq >= last.Sequence {
			break
		}
	}
	if ticks > 0 {
		g.lines = append(g.lines, fmt.Sprintf("(and %s: the controller's clock)", plural(ticks, "tick")))
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
