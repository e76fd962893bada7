package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/rollout/feed"
)

// rolloutGone is noRollout for the rollout reads and verbs, told what
// the stream's limits dropped: a fleet whose newest start aged out of
// the stream (--max-age, --max-bytes) while its later events remain (its
// records, its steps' outcomes, its ticks, the operators' verbs) is no
// mistyped name. It printed "no rollout of fleet web" (exit 2) while the
// rollout was still running (and `rollout ls` left the fleet out; it
// lists it now, its start gone: feed.Remains.StartGone): now the
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
	if gerr != nil || !g.Dropped() {
		return noRollout(err, fleet)
	}
	if g.ID == 0 {
		return withCode(exitUsage, &quietErr{err: err, msg: fmt.Sprintf("no rollout of fleet %q in the stream, which %s: a rollout started before that is gone from it "+
			"('meshfold rollout ls' lists the fleets that have one; 'meshfold apply -f FLEET.yaml' starts one)", fleet, g.Keeps())})
	}
	for _, l := range g.Lines {
		fmt.Fprintln(w, l)
	}
	return withCode(exitError, &quietErr{err: err, msg: g.Gone(fleet)})
}

// row is what 'rollout ls' says of a rollout whose start is gone.
func row(g feed.Remains) *startGone {
	return &startGone{StreamBegins: g.First, StreamBeginsAt: g.FirstTime, StreamKeeps: g.Limits(), Events: g.N, Newest: g.Newest(), started: g.Started(), note: g.Note}
}

// readRolloutRemains reads the stream's limits and the fleet's rollout
// events it holds, of the rollout the newest of them names
// (feed.ReadRemains).
func readRolloutRemains(ctx context.Context, a *app, nc *nats.Conn, fleet string) (feed.Remains, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return feed.Remains{}, err
	}
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return feed.Remains{}, err
	}
	return feed.ReadRemains(ctx, js, stream, scfg, fleet)
}
