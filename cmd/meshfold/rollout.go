package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

// Rollouts (DESIGN.md §11): apply starts one from a fleet file; the
// rollout verbs read one (ls, status, why) or act on it (pause, resume,
// promote, abort, revert: each an event).

func init() {
	register(newRolloutCmd)
}

func newRolloutCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Read and steer a fleet's rollouts (ls, status, why, pause, resume, promote, abort, revert)",
		Long: `rollout reads a fleet's rollouts, which 'meshfold apply' starts, and steers
them. Every read replays the rollout from the stream (its start, its events and
its targets' events), so what it shows is what the controller decided, and why.
Every verb is an event in the stream, with --by (a named operator's creds give
it, on a subject the server checks).`,
		Example: `  meshfold rollout ls
  meshfold rollout status web
  meshfold rollout why web ace
  meshfold rollout promote web --by alice`,
	}
	cmd.AddCommand(newRolloutLsCmd(a), newRolloutStatusCmd(a), newRolloutWhyCmd(a))
	for _, v := range []struct {
		kind        rollout.Kind
		short, long string
	}{
		{rollout.KindPromote, "Let a rollout go on past its canary", "promote lets the rollout go on past its canary batch once the canary is done:\nit ran the new build healthy for min_healthy (a canary whose agent is down is\nnot; status says why the batch waits). A promote before that is refused, as\nNomad refuses one: promote again once status says waiting-promote. A promote\nof a paused rollout is taken (the canary is no longer watched) and says on\nstderr that the next batch begins only at 'meshfold rollout resume'; status\nshows the promote and the pause."},
		{rollout.KindPause, "Stop a rollout's new steps", "pause stops new steps; failures, halts and reverts still happen."},
		{rollout.KindResume, "Let a paused rollout take new steps again", "resume ends a pause."},
		{rollout.KindAbort, "Stop deciding: targets keep the want they have", "abort stops the rollout: no more steps; the targets keep the want they have\nand are no longer judged."},
		{rollout.KindRevert, "Give every changed target its previous want back", "revert gives every target the rollout changed the want it had before, within\nthe rollout's max_unavailable: a target unavailable already (failed, being\nchanged, its agent down, paused, unhealthy) at once, the others as the budget\nallows (a revert spends it until its previous want settled and runs; status\nsays 'revert queued' and who spends it). A target whose want was changed by\nhand since is left alone. After an apply that superseded a rollout still going\non, a target that rollout had not finished (not done) gets the want it had\nbefore it, not its unfinished want ('rollout why FLEET NODE' says which)."},
	} {
		cmd.AddCommand(newRolloutVerbCmd(a, v.kind, v.short, v.long))
	}
	return cmd
}

// rolloutReader connects and returns a reader of the stream on that
// connection; close the connection when done.
func (a *app) rolloutReader(ctx context.Context) (*query.Reader, *nats.Conn, error) {
	nc, err := a.conn.connect("meshfold-rollout", a)
	if err != nil {
		return nil, nil, err
	}
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return r, nc, nil
}

func newRolloutLsCmd(a *app) *cobra.Command {
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the fleets' newest rollouts: phase, batch, targets done",
		Long: `ls lists each fleet's newest rollout: its phase, batch, targets done, who
applied it and when. A rollout whose start aged out of the stream (--max-age,
--max-bytes shorter than the rollout) cannot be replayed: its row says "start
gone", and a line under the table names its newest event that remains
('meshfold rollout status FLEET' lists them all). In -o json and -o yaml such
a row has its fleet, its rollout, an empty phase and a start_gone object:
{"stream_begins":40,"stream_begins_at":"2026-12-05T04:48:00Z",
"stream_keeps":"1h0m0s of events (--max-age)","events":4,
"newest":"#43 2026-12-05T04:50:00Z record ace: done: ace done"}.`,
		Example: `  meshfold rollout ls
  meshfold rollout ls -o json`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := out.get()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			r, nc, err := a.rolloutReader(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			fleets, err := r.RolloutFleets(ctx)
			if err != nil {
				return err
			}
			gone, err := r.RolloutFleetsWithoutStart(ctx)
			if err != nil {
				return err
			}
			rows := []lsRow{}
			now := time.Now()
			for _, f := range fleets {
				s, err := r.Rollout(ctx, f)
				if errors.Is(err, feed.ErrNoRollout) {
					gone = append(gone, f) // its start aged out since the list
					continue
				}
				if err != nil {
					return err
				}
				v := s.View()
				v.Targets = nil
				v.Unattended = s.Unattended(now)
				row := lsRow{View: v}
				if !v.Phase.Final() {
					row.NoController = controllerGone(ctx, r, f, now)
				}
				rows = append(rows, row)
			}
			for _, f := range gone {
				g, err := readRolloutRemains(ctx, a, nc, f)
				if err != nil {
					return fmt.Errorf("fleet %s's rollout events, its start gone: %w", f, err)
				}
				if !g.StartGone() {
					continue // what status calls no rollout
				}
				rows = append(rows, lsRow{View: rollout.View{Fleet: f, Rollout: g.ID}, StartGone: row(g)})
			}
			slices.SortFunc(rows, func(x, y lsRow) int { return strings.Compare(x.Fleet, y.Fleet) })
			if format != outTable {
				return writeValue(a.stdout, format, rows)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FLEET\tROLLOUT\tPHASE\tBATCH\tDONE\tTARGETS\tBY\tSTARTED")
			var notes []string
			for _, row := range rows {
				v := row.View
				if g := row.StartGone; g != nil {
					fmt.Fprintf(tw, "%s\t%d\tstart gone\t-\t-\t-\t-\t%s\n", v.Fleet, v.Rollout, g.started)
					notes = append(notes, g.note(v.Fleet))
					continue
				}
				total := 0
				for _, n := range v.Counts {
					total += n
				}
				phase := v.PhaseText()
				if row.NoController != "" {
					phase += ", no controller"
					notes = append(notes, row.NoController)
				} else if u := v.Unattended; u != nil {
					phase += fmt.Sprintf(", no controller for %s", now.Sub(u.Since).Round(time.Second))
					notes = append(notes, fmt.Sprintf("unattended: no rollout controller acts on fleet %s's rollout: 'meshfold rollout status %s' says since when and what it owes", v.Fleet, v.Fleet))
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d/%d\t%d\t%d\t%s\t%s\n", v.Fleet, v.Rollout, phase, v.Batch, v.Batches,
					v.Counts[rollout.Done], total, events.Text(v.By), v.Started.Format(time.RFC3339))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, l := range notes {
				fmt.Fprintln(a.stdout, l)
			}
			return nil
		},
	}
	out.add(cmd, "")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// lsRow is a row of 'rollout ls': the rollout's view without its
// targets, or, for a rollout whose start aged out of the stream, its
// fleet and id with StartGone set.
type lsRow struct {
	rollout.View
	StartGone *startGone `json:"start_gone,omitempty"`
	// NoController says no live controller holds the fleet's lease
	// (controllerGone); "" when one does.
	NoController string `json:"no_controller,omitempty"`
}

// MarshalJSON writes the view, or for a rollout whose start is gone only
// its fleet, id, an empty phase and start_gone: not a zero view's
// fields (a start time of year 1, params of zeros) that say nothing.
func (r lsRow) MarshalJSON() ([]byte, error) {
	if r.StartGone == nil {
		return json.Marshal(r.View)
	}
	return json.Marshal(struct {
		Fleet     string        `json:"fleet"`
		Rollout   uint64        `json:"rollout"`
		Phase     rollout.Phase `json:"phase"`
		StartGone *startGone    `json:"start_gone"`
	}{r.Fleet, r.Rollout, r.Phase, r.StartGone})
}

// startGone is what 'rollout ls' says of a rollout whose start the
// stream no longer holds.
type startGone struct {
	// StreamBegins is the stream's first sequence, StreamBeginsAt its
	// time; StreamKeeps what its limits keep ("1h0m0s of events
	// (--max-age)").
	StreamBegins   uint64    `json:"stream_begins"`
	StreamBeginsAt time.Time `json:"stream_begins_at,omitzero"`
	StreamKeeps    string    `json:"stream_keeps"`
	// Events counts the rollout's events that remain; Newest is the
	// newest of them but ticks, one line as 'rollout status' lists it.
	Events  int                       `json:"events"`
	Newest  string                    `json:"newest"`
	started string                    // the STARTED column (feed.Remains.Started)
	note    func(fleet string) string // the line under the table (feed.Remains.Note)
}

func newRolloutStatusCmd(a *app) *cobra.Command {
	var out outputFlag
	var timeout time.Duration
	var (
		pg     targetPaging
		all    bool
		status string
	)
	cmd := &cobra.Command{
		Use:   "status FLEET [-o table|json|yaml]",
		Short: "The delivery view: each target's want, plan, settle, build, health; each build's nodes",
		Long: `status replays the fleet's newest rollout and prints the delivery view: the
rollout's phase, batch and budget; per target its batch and status, the want
published, its plan and whether it settled, the builds it runs, healthy since
when, and why it failed or waits (a target whose agent is down or whose node is
paused says so, canary or not; one changing whose plan settled says what is not
healthy yet and its healthy_deadline, as 'rollout why' does); per build, on how
many of the fleet's nodes it runs. A 'waiting:' line says what holds the whole
rollout (a canary away), whole; a 'stalled:' line says why a rollout whose
budget is spent by nodes none of its steps changes (an agent down, a node
paused, a module unhealthy) takes no step, or why a revert's targets wait for
the budget and none of its steps is under way. After a revert each target's row
keeps its new want's plan, settle and healthy window. A target given its new
want and not done when the rollout was aborted, superseded or reverted is
'stopped': no longer judged (RUNNING still shows what its node runs), and the
budget of such a rollout counts only nodes away, unhealthy or still reverting
(while reverting, the budget the revert spends). The budget of a running rollout
leaves out its targets not yet given their want that are unavailable only
because a module is unhealthy or failed: they get it in their batch's turn
whatever the budget, so the line says how many it does not count. A target
'unreached' (its agent down at its healthy_deadline) that has taken its new
want since, after the rollout completed, says 'arrived since'. An
'unattended:' line says no rollout controller acts on the rollout: a step it
owes (a want decided, a min_healthy window's or healthy_deadline's end) has
waited 30s with no tick, outcome or record of a controller (serve or
reconcile down, its controller user revoked, rollouts off). Sooner, read
from the fleet's controller lease in the reconcilers' lease bucket, a first
line says no live controller holds it: "-- no controller holds fleet web's
lease since T (…ago; … last renewed it at …)", measured from the lease's
expiry; 'rollout ls' says "running, no controller" with the same line, and a
rollout verb given meanwhile is published with a warning. A rollout whose
start aged out of the stream (--max-age) cannot be replayed: status says so,
lists the events of it that remain, and exits 1.

A 'targets:' line near the top counts the targets of each status, most
pressing first ("300 targets: 2 failed, 20 changing, 258 pending, 20 done").
A rollout of more targets than a page (--limit, 50 unless told) is paged:
the page's rows are the most pressing first (failed, unreached, conflict,
waiting-approval, publishing, changing, pending, stopped, skipped, moved,
done; an agent down or a node paused before the others of its status), and
a line under the table says which page and how to see the rest. --page N
shows the Nth page, --status S[,S…] only the targets of those statuses,
--limit 0 or --all every target in the rollout's order (batch by batch). A
rollout that fits one page prints as it always did.

-o json and -o yaml give the whole view, every target, unless --limit,
--page or --status is given (the counts are the whole rollout's either
way). They give the rollout's params (resolved: defaults applied,
percentages as counts) with the fleet file's names and forms:
{"batch":2,"max_unavailable":1,"canary":1,"min_healthy":"5s",
"healthy_deadline":"1m0s","auto_revert":true}.`,
		Example: `  meshfold rollout status web                    # counts, then the 50 most pressing targets
  meshfold rollout status web --page 2           # the next 50
  meshfold rollout status web --status failed,unreached
  meshfold rollout status web --all              # every target, in batch order
  meshfold rollout status web -o json | jq '.targets[] | select(.status=="failed")'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := out.get()
			if err != nil {
				return err
			}
			if pg.limit < 0 || pg.page < 1 {
				return withCode(exitUsage, fmt.Errorf("--limit %d --page %d: a limit ≥ 0 (0: every row) and a page ≥ 1", pg.limit, pg.page))
			}
			if status != "" {
				if pg.statuses, err = rollout.ParseStatuses(status); err != nil {
					return withCode(exitUsage, fmt.Errorf("--status: %w", err))
				}
			}
			fl := cmd.Flags()
			pg.set = fl.Changed("limit") || fl.Changed("page") || status != ""
			if all && !fl.Changed("limit") {
				pg.limit = 0
			}
			ctx := store.WithRideOut(cmd.Context(), timeout)
			r, nc, err := a.rolloutReader(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			s, err := r.Rollout(ctx, args[0])
			if err != nil {
				remains := a.stdout
				if format != outTable {
					remains = a.stderr // stdout is for the view's JSON or YAML only
				}
				return a.rolloutGone(ctx, nc, remains, args[0], err)
			}
			v := s.View()
			now := time.Now()
			v.Unattended = s.Unattended(now)
			noPlanYet(ctx, a, r, &v, now)
			gone := ""
			if !v.Phase.Final() {
				gone = controllerGone(ctx, r, args[0], now)
			}
			if format != outTable {
				if pg.set {
					// Only what was asked for; the counts stay the
					// whole rollout's.
					v.Targets, _, _ = pg.of(v.Targets)
				}
				return writeValue(a.stdout, format, v)
			}
			if gone != "" {
				fmt.Fprintf(a.stdout, "-- %s\n", gone)
			}
			return writeRolloutView(a.stdout, v, now, pg)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&pg.limit, "limit", 50, "targets a page of the table holds (0: every target, unpaged)")
	fl.IntVar(&pg.page, "page", 1, "which page of the table to print (1: the most pressing targets)")
	fl.StringVar(&status, "status", "", "only the targets with these statuses, comma-separated ("+strings.Join(statusNames(), ", ")+")")
	fl.BoolVar(&all, "all", false, "every target, in the rollout's order, unless --limit is given")
	out.add(cmd, "")
	addReadTimeout(cmd, &timeout)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// shortBuild shortens a content-addressed build for a table column
// ("sha256:42a1e9ec2e0a…"); -o json and the builds lines keep it whole.
func shortBuild(b string) string {
	if h, ok := strings.CutPrefix(b, "sha256:"); ok && len(h) > 12 {
		return "sha256:" + h[:12] + "…"
	}
	return events.Text(b)
}

// holdersWait bounds the read of the lease bucket a rollout view makes
// to say a target's partition has no live reconciler.
const holdersWait = 3 * time.Second

// noPlanYet adds to the WHY of each target of v with a want published
// and no plan whose partition no live reconciler folds, why no plan
// comes (query.Reader.NoPlanYet), and returns those lines by node. A
// read that fails says so on stderr, except for credentials that may not
// read the lease bucket (issued before operators could) or a stream no
// reconciler ever ran on: those say nothing, as before.
func noPlanYet(ctx context.Context, a *app, r *query.Reader, v *rollout.View, now time.Time) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, holdersWait)
	defer cancel()
	lines, err := r.NoPlanYet(ctx, v, now)
	if err != nil && !query.Unreadable(err) {
		fmt.Fprintf(a.stderr, "note: whether the targets' partitions have a live reconciler could not be read: %v\n", err)
	}
	return lines
}

// targetPaging is how much of a rollout's targets `meshfold rollout
// status` prints, as fleetPaging is of the fleet's nodes.
type targetPaging struct {
	limit, page int
	statuses    []rollout.Status // only these (none: all)
	// set: --limit, --page or --status was given (JSON and YAML are
	// paged only then).
	set bool
}

// defaultTargetPaging is `rollout status` with no paging flag: the 50
// most pressing targets when they are more.
var defaultTargetPaging = targetPaging{limit: 50, page: 1}

// statusNames are the statuses --status takes.
func statusNames() []string {
	names := make([]string, len(rollout.TargetStatuses))
	for i, s := range rollout.TargetStatuses {
		names[i] = string(s)
	}
	return names
}

// of returns the targets of the page asked for (those with a status
// asked for, if any), the first's index among them and how many they
// are. A rollout that fits one page unfiltered keeps the rollout's
// order (batch by batch); paged or filtered, the most pressing come
// first (rollout.SortPressing).
func (pg targetPaging) of(targets []rollout.TargetView) (page []rollout.TargetView, first, total int) {
	if len(pg.statuses) > 0 {
		targets = slices.DeleteFunc(slices.Clone(targets), func(t rollout.TargetView) bool { return !slices.Contains(pg.statuses, t.Status) })
	}
	if pg.limit == 0 {
		if pg.page > 1 {
			return nil, len(targets), len(targets)
		}
		return targets, 0, len(targets)
	}
	if len(pg.statuses) > 0 || len(targets) > pg.limit || pg.page > 1 {
		targets = slices.Clone(targets)
		rollout.SortPressing(targets)
	}
	first = min(len(targets), (pg.page-1)*pg.limit)
	return targets[first:min(len(targets), first+pg.limit)], first, len(targets)
}

// line says which targets a paged or filtered table shows and how to see
// the rest; "" when it shows every target.
func (pg targetPaging) line(v rollout.View, page []rollout.TargetView, first, total int) string {
	if len(pg.statuses) == 0 && len(page) == len(v.Targets) {
		return ""
	}
	of := fmt.Sprintf("%d", total)
	if len(pg.statuses) > 0 {
		of += " " + strings.Join(statusStrings(pg.statuses), " or ")
	}
	if total == 0 {
		return fmt.Sprintf("-- no target is %s\n", strings.Join(statusStrings(pg.statuses), " or "))
	}
	return pageFooter(pg.page, pg.limit, total, first, len(page), of, "targets", "--all for every target")
}

func statusStrings(ss []rollout.Status) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// writeRolloutView prints the delivery view as text, as of now: the
// targets pg asks for.
func writeRolloutView(w io.Writer, v rollout.View, now time.Time, pg targetPaging) error {
	p := v.Params
	fmt.Fprintf(w, "fleet %s, rollout %d by %s, started %s: %s, batch %d of %d\n", v.Fleet, v.Rollout, events.Text(v.By),
		v.Started.Format(time.RFC3339), v.PhaseText(), v.Batch, v.Batches)
	if v.Unattended != nil {
		// Second, before anything it holds up: RUNNING alone had an
		// operator wait for ever on a controller that was down.
		fmt.Fprintf(w, "unattended: %s\n", v.Unattended.Text(now))
	}
	// How many targets have each status, whatever the page shows (a
	// fresh user's finding M7: 300 rows, no count, counted with awk).
	fmt.Fprintf(w, "targets: %s\n", v.CountsText())
	fmt.Fprintf(w, "budget: %s; canary %d, batch %d, min_healthy %s, healthy_deadline %s, auto_revert %v\n",
		v.Budget(), p.Canary, p.Batch, p.MinHealthy, p.HealthyDeadline, p.AutoRevert)
	for _, m := range []struct {
		what string
		m    *rollout.Mark
	}{{"promoted", v.Promote}, {"paused", v.Paused}, {"halted", v.Halt}, {"reverting", v.Revert}, {"ended", v.End}} {
		if m.m != nil {
			fmt.Fprintf(w, "%s at #%d %s", m.what, m.m.Seq, m.m.Time.Format(time.RFC3339))
			if m.m.By != "" {
				fmt.Fprintf(w, " by %s", events.Text(m.m.By))
				if m.m.Checked {
					fmt.Fprint(w, " (checked)") // a named operator's verb: the server checked the name
				}
			}
			if m.m.Node != "" {
				fmt.Fprintf(w, " (%s)", m.m.Node)
			}
			switch {
			case m.m.Reason != "" && m.what == "halted":
				// The fold's words, whose parts from a node are cut
				// already: whole, not cut again in the middle (a fresh
				// user's finding F1: a cut message inside a cut message
				// left out the key and the file).
				fmt.Fprintf(w, ": %s", events.Plain(m.m.Reason))
			case m.m.Reason != "":
				fmt.Fprintf(w, ": %s", events.ErrorText(m.m.Reason))
			}
			if m.what == "paused" && !v.Phase.Final() {
				// A promote taken while paused waits for the resume (a
				// fresh user's finding: nothing said so).
				fmt.Fprintf(w, "; no target gets its new want until 'meshfold rollout resume %s'", v.Fleet)
			}
			fmt.Fprintln(w)
		}
	}
	if v.Stalled != "" {
		fmt.Fprintf(w, "stalled: %s\n", events.Plain(v.Stalled)) // one line, whole (a fresh user's finding: only 'rollout why' said it)
	}
	if v.PromoteNote != "" {
		// A canary that runs nothing passed with nothing to judge (a
		// fresh user's finding U13): said before the promote.
		fmt.Fprintf(w, "before a promote: %s\n", events.Plain(v.PromoteNote))
	}
	for _, l := range v.Waiting {
		fmt.Fprintf(w, "waiting: %s\n", events.Plain(l)) // the rollout's own words: whole (a fresh user's finding: quoted and cut at 200 bytes)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tBATCH\tSTATUS\tWANT\tPLAN\tSETTLED\tRUNNING\tHEALTHY SINCE\tWHY")
	dash := func(n uint64) string {
		if n == 0 {
			return "-"
		}
		return fmt.Sprintf("#%d", n)
	}
	page, first, total := pg.of(v.Targets)
	for _, t := range page {
		var running []string
		for _, m := range t.Running {
			s := m.Module + "@" + shortBuild(m.Build) + " " + string(m.State)
			if m.Health != "" {
				s += "/" + string(m.Health)
			}
			running = append(running, s)
		}
		since := "-"
		if !t.HealthySince.IsZero() {
			since = t.HealthySince.Format(time.TimeOnly)
		}
		settled := "no"
		if t.Settled {
			settled = "yes"
		}
		status := string(t.Status)
		if t.RunsNothing && t.Status == rollout.Done {
			status += ", runs nothing now"
		}
		if t.Revert != nil {
			status += "; " + t.Revert.Text()
		}
		if t.Arrived {
			status += ", arrived since"
		}
		if t.Down {
			status += ", agent down"
		}
		if t.Paused != nil {
			status += ", paused"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Node, t.Batch, status, dash(t.Published), dash(t.Plan), settled,
			strings.Join(running, ", "), since, events.Plain(t.Why))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprint(w, pg.line(v, page, first, total))
	if len(v.Builds) == 0 {
		// No header over nothing (a fresh user's finding L9).
		fmt.Fprintln(w, "builds: none known to run yet (no have of the fleet's nodes)")
		return nil
	}
	fmt.Fprintln(w, "builds:")
	for _, b := range v.Builds {
		fmt.Fprintf(w, "  %s (by their newest haves)\n", b.Text())
	}
	return nil
}

func newRolloutWhyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "why FLEET NODE",
		Short: "Why a node of a fleet's rollout is where it is, event by event",
		Long: `why replays the fleet's newest rollout and says, line by line, where NODE is
in it: its batch and status, the step that gave it its new want (the
sequence of the event the rollout decided it at) and the want published
(the want's own sequence), its plan and settle, its health, and what it
waits for. A target whose want has no plan because no live reconciler folds
its partition (a reconciler killed, its lease not yet expired: a takeover
comes within the lease TTL) ends with a line saying so: "no plan yet of its
want #N: partition P's reconciler, reconciler r2 of group g, has not renewed
its lease since T …: another reconciler takes it over once the lease
expires, at T2". An "unattended:" line says no rollout controller acts on
the rollout. Exit 2 when NODE is not one of the fleet's nodes.`,
		Example: `  meshfold rollout why web ace
  meshfold rollout status web --status changing   # then why for one of them`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, nc, err := a.rolloutReader(cmd.Context())
			if err != nil {
				return err
			}
			defer nc.Close()
			s, err := r.Rollout(cmd.Context(), args[0])
			if err != nil {
				return a.rolloutGone(cmd.Context(), nc, a.stdout, args[0], err)
			}
			lines, ok := s.Why(args[1])
			if !ok {
				return withCode(exitUsage, fmt.Errorf("node %s is not one of fleet %s's nodes in rollout %d", args[1], args[0], s.Rollout.ID))
			}
			for _, l := range lines {
				fmt.Fprintln(a.stdout, l)
			}
			now := time.Now()
			v := s.View()
			if lines := noPlanYet(cmd.Context(), a, r, &v, now); lines[args[1]] != "" {
				fmt.Fprintln(a.stdout, lines[args[1]])
			}
			if gone := controllerGone(cmd.Context(), r, args[0], now); gone != "" && !v.Phase.Final() {
				fmt.Fprintln(a.stdout, gone)
			} else if u := s.Unattended(now); u != nil {
				fmt.Fprintf(a.stdout, "unattended: %s\n", u.Text(now))
			}
			return nil
		},
	}
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// verbReasons are the help's example --reason of each rollout verb.
var verbReasons = map[rollout.Kind]string{
	rollout.KindPromote: "checked the canary",
	rollout.KindPause:   "hold while the database migrates",
	rollout.KindResume:  "migration done",
	rollout.KindAbort:   "wrong build tagged, a new apply follows",
	rollout.KindRevert:  "latency up since the canary",
}

func newRolloutVerbCmd(a *app, kind rollout.Kind, short, long string) *cobra.Command {
	var (
		by, reason   string
		id           uint64
		timeout      time.Duration
		allowMissing bool // revert
	)
	cmd := &cobra.Command{
		Use:   string(kind) + " FLEET --by NAME [--reason TEXT] [--rollout ID]",
		Short: short,
		Long: long + `

It replays the fleet's newest rollout and, when the verb would change it,
publishes a ` + string(kind) + ` event on the fleet's rollout subject, bound to that
rollout (--rollout names the one meant; the event is ignored for another one,
as after a new apply). Prints the event's stream sequence. When the rollout
would ignore the verb (a promote before the canary is done, a resume of a
rollout not paused, anything on a finished rollout but revert) it says why,
publishes nothing and exits 1; exit 1 also if the publish failed, 2 on a usage
error.

--by: a named operator's creds ('meshfold auth add-operator NAME') give their
name, and the verb goes on the fleet's subject that ends in it,
<prefix>.rollout.FLEET.` + string(kind) + `.NAME, the only one the server lets them
publish it on: another --by is refused (exit 2), and the rollout's history
names who held the creds. The stream stores those subjects once an
administrator ran 'meshfold auth enable-named' (refused, saying so, before).
The shared operator's creds need --by, kept as typed.`,
		Example: "  meshfold rollout " + string(kind) + " web --by alice --reason \"" + verbReasons[kind] + "\"",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fleet := args[0]
			if !events.ValidName(fleet) {
				return withCode(exitUsage, &events.FieldError{Field: "FLEET", Value: fleet, Err: events.ErrBadName})
			}
			op := rollout.NewOperator(kind, id, by, reason)
			if err := rollout.Stamp(op, time.Now()).Validate(); err != nil {
				return withCode(exitUsage, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			nc, js, _, err := a.openPublisher(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			stream, scfg, err := a.stream.openStream(ctx, js)
			if err != nil {
				return err
			}
			// The verb is folded by the rule the controller folds it by:
			// one it would ignore is said and not published.
			s, err := feed.Replay(cmd.Context(), js, scfg, nil, fleet)
			if err != nil {
				return a.rolloutGone(ctx, nc, a.stderr, fleet, err)
			}
			if why := s.Ignores(kind, id); why != "" {
				hint := ""
				if kind == rollout.KindPromote && s.Rollout.Phase == rollout.Running {
					hint = fmt.Sprintf(" (promote once 'meshfold rollout status %s' says waiting-promote)", fleet)
				}
				return withCode(exitError, fmt.Errorf("%s %s: nothing published: the controller would ignore it: %s%s", kind, fleet, why, hint))
			}
			if kind == rollout.KindRevert && !allowMissing {
				if err := refuseRevertMissing(ctx, a, nc, s, fleet); err != nil {
					return err
				}
			}
			// Bound to the rollout checked: a newer apply meanwhile makes
			// the controller ignore it (DESIGN.md §11).
			op.Rollout = s.Rollout.ID
			var seq uint64
			if a.namedRolloutCreds(kind) {
				// On the named operator's subject, the only one its
				// creds may publish a verb on: the server checks the
				// name the rollout's history gives.
				if !store.CapturesNamedRollouts(stream, scfg) {
					return fmt.Errorf("%s %s: nothing published: these creds are operator %s's, and the stream %s does not store named operators' rollout verbs yet: "+
						"an administrator runs meshfold auth enable-named --dir DIR once every reconciler is upgraded (docs/operations.md, \"Named operators\")", kind, fleet, op.By, scfg.Name)
				}
				seq, err = publishRolloutNamed(ctx, js, scfg.Subjects(), fleet, op)
			} else {
				seq, err = publishRollout(ctx, js, scfg.Subjects(), fleet, kind, op)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s %s: #%d\n", kind, fleet, seq)
			if r, err := a.stream.reader(nc, query.Config{}); err == nil {
				if gone := controllerGone(ctx, r, fleet, time.Now()); gone != "" {
					fmt.Fprintf(a.stderr, "warning: %s %s is published, but %s: nothing acts on it until a controller runs again, which reads it then\n", kind, fleet, gone)
				}
			}
			if kind == rollout.KindPromote {
				if note := s.View().PromoteNote; note != "" {
					fmt.Fprintf(a.stderr, "note: %s\n", note) // promoted all the same: status said it before
				}
			}
			if note := s.Defers(kind, id); note != "" {
				fmt.Fprintf(a.stderr, "note: %s\n", note) // taken, and waiting (a promote while paused)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&by, "by", "", "who acts (required, but a named operator's creds give their name); kept in the stream for the audit")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if a.namedRolloutCreds(kind) {
			return a.settleBy(cmd, &by) // the server checks it
		}
		return a.settleByFor(cmd, &by, rolloutUnchecked)
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit (one line)")
	cmd.Flags().Uint64Var(&id, "rollout", 0, "the rollout meant (its id, the start's sequence); 0: whichever is newest when the verb runs")
	if kind == rollout.KindRevert {
		cmd.Flags().BoolVar(&allowMissing, "allow-missing-build", false, "revert even when a previous want names a bundle build the builds bucket no longer holds (those targets' reverts then fail to fetch it)")
		cmd.Long += `

A revert gives back previous wants whose bundle builds may have been removed
since ('meshfold build rm --force'): it is then refused (exit 1, nothing
published), naming each target and build: push the build again (the same
content gives the same build), then revert; --allow-missing-build reverts
anyway, and those targets' reverts fail to fetch it.`
		cmd.Example += "\n  meshfold rollout revert web --by alice --allow-missing-build   # a previous build was removed: revert the others anyway"
	}
	addPublishTimeout(cmd, &timeout)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishesRollout(cmd, string(kind))
}

// publishRollout publishes an operator's rollout event, riding out a
// stream electing a leader within ctx (store.RideOut; a fresh user's
// finding V2): every attempt carries one message id, so an attempt whose
// acknowledgement was lost is stored once.
func publishRollout(ctx context.Context, js jetstream.JetStream, subj events.Subjects, fleet string, k rollout.Kind, p any) (uint64, error) {
	id := nuid.Next()
	return store.RideOut(ctx, "", func(ctx context.Context) (uint64, error) {
		return feed.Publish(ctx, js, subj, fleet, k, p, id)
	})
}

// publishRolloutNamed is publishRollout of a named operator's verb, on
// its named subject (feed.PublishNamed).
func publishRolloutNamed(ctx context.Context, js jetstream.JetStream, subj events.Subjects, fleet string, op *rollout.Operator) (uint64, error) {
	id := nuid.Next()
	return store.RideOut(ctx, "", func(ctx context.Context) (uint64, error) {
		return feed.PublishNamed(ctx, js, subj, fleet, op, id)
	})
}

// namedRolloutCreds reports whether the verbs connect with a named
// operator's creds that may publish rollout verbs of kind on its named
// subjects only (events.Subjects.NamedRollout): creds issued by a build
// that names them. A named operator's creds issued before allow the
// plain subject, where the CLI's rule stands (settleByFor).
func (a *app) namedRolloutCreds(kind rollout.Kind) bool {
	named := a.namedOperator()
	if named == "" {
		return false
	}
	return credsMayPublish(a.conn.withEnv().creds, events.Subjects{Prefix: a.stream.prefix}.NamedRollout("fleet", string(kind), named))
}

// refuseRevertMissing refuses (exit 1: refused for the state of things,
// as a want of a build not stored is) a revert of s's rollout that would
// give a target a previous want naming a bundle build the builds bucket
// no longer holds (query.Reader.RevertMissing): its revert could not
// fetch it, and the module would stay down (a reviewer's finding).
func refuseRevertMissing(ctx context.Context, a *app, nc *nats.Conn, s *rollout.State, fleet string) error {
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	missing, err := r.RevertMissing(ctx, s)
	if err != nil {
		return fmt.Errorf("revert %s: could not check the previous wants' builds, so nothing was published: %w (--allow-missing-build reverts unchecked)", fleet, err)
	}
	if len(missing) == 0 {
		return nil
	}
	var b strings.Builder
	nodes := map[string]bool{}
	for i, m := range missing {
		nodes[m.Node] = true
		if i == useFirst {
			fmt.Fprintf(&b, "\n  … and %d more", len(missing)-useFirst)
			break
		}
		fmt.Fprintf(&b, "\n  target %s, previous want #%d: module %s, build %s: %v", m.Node, m.Prev, m.Module, events.Text(m.Build), m.Err)
	}
	return fmt.Errorf("revert %s: refused: %s would get back a build the builds bucket no longer holds (removed with 'meshfold build rm --force'?); nothing was published:%s\n"+
		"their reverts would fail with \"no such bundle\" and the module stay down: push each build again ('meshfold build push PATH' of the same content gives the same build), then revert; --allow-missing-build reverts anyway",
		fleet, plural(len(nodes), "target"), b.String())
}
