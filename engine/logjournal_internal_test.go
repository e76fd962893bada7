package engine

import (
	"bytes"
	"log/slog"
	"regexp"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// TestLogJournalLineUnchanged: logJournal, which hands its record to the
// handler itself, writes the line slog.Logger's Info and Warn wrote for
// it (the time aside), at each journal level, through a handler with
// attributes of its own, and nothing below the handler's level.
func TestLogJournalLineUnchanged(t *testing.T) {
	t.Parallel()
	times := regexp.MustCompile(`(?m)^time=\S+ `)
	for _, minLevel := range []slog.Level{slog.LevelInfo, slog.LevelWarn} {
		for _, lv := range []events.Level{events.LevelInfo, events.LevelWarn, events.LevelError} {
			var got, want bytes.Buffer
			opts := &slog.HandlerOptions{Level: minLevel}
			r := &Reconciler{log: slog.New(slog.NewTextHandler(&got, opts)).With("partition", 3)}
			j := &events.Journal{Level: lv, Msg: `plan names no provisioner account while what runs names "prov": the node will refuse
every filled write`, Cause: 1234}
			r.logJournal(reconcile.Effect{Node: "ace", Kind: events.KindJournal, Payload: j})
			r.logJournal(reconcile.Effect{Node: "ace", Kind: events.KindPlan, Payload: &events.Plan{}}) // not a journal entry: no line

			old := slog.New(slog.NewTextHandler(&want, opts)).With("partition", 3)
			log := old.Info
			if lv == events.LevelWarn || lv == events.LevelError {
				log = old.Warn
			}
			log("journaled", "node", "ace", "level", j.Level, "cause", j.Cause, "msg", j.Msg)

			g, w := times.ReplaceAllString(got.String(), ""), times.ReplaceAllString(want.String(), "")
			if g != w {
				t.Errorf("handler at %s, journal level %s:\n got %q\nwant %q", minLevel, lv, g, w)
			}
			if lv == events.LevelInfo && minLevel == slog.LevelWarn && g != "" {
				t.Errorf("an info entry logged under a warn handler: %q", g)
			}
		}
	}
}
