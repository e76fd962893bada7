package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newAuditCmd) }

type auditOpts struct {
	since, until, asOf string
	why                uint64
	out                outputFlag
	format             string
	timeout            time.Duration
}

func newAuditCmd(a *app) *cobra.Command {
	var o auditOpts
	cmd := &cobra.Command{
		Use:   "audit NODE",
		Short: "Replay a node's history: timeline, state as of a moment, why a plan, hold or knock happened",
		Long: `audit reads every event of NODE from the stream, in stream order, and replays
it through the reconciler's own fold. It only reads the stream, so it works
with the reconciler down.

Without --as-of or --why it prints the timeline, one event a line: stream
sequence, stream time, kind and a short summary (effects start with ←#cause).
An operator's name the server checked (a named operator's creds, 'meshfold
auth add-operator') reads "by alice (checked)", and "by_checked": true in
-o json; a name with no mark is self-declared (the shared operator's creds).

Bounds (--since, --until, --as-of) are a stream sequence or an RFC 3339 time.
A time covers the unit it is written in ("…T20:50:05Z" is that whole second),
so events sharing a timestamp are both in or both out, and a time copied from
the timeline includes its event. A bound that falls between events is said so
in a line starting with "--" (on stderr with -o json or yaml).

--as-of prints the folded state after every event at or before the bound.
--why SEQ explains the event at SEQ: for a knock, each owed item's refusal,
the plan that accepts it, the settle and the want that declared the path;
for a plan, its cause, its want and why each row is composed or held; for a
journal entry, its cause; for any other event, what it led to.

-o json prints one JSON document: the timeline's entries as an array, or one
state, or one explanation, with stable field names; -o yaml the same as one
YAML document (--json is -o json).`,
		Example: `  meshfold audit ace
  meshfold audit ace --since 2026-11-03T20:49:00Z --until 2026-11-03T20:55:00Z
  meshfold audit ace --as-of 1234
  meshfold audit ace --why 1240
  meshfold audit ace -o json | jq '.[] | select(.kind=="knock")'
  meshfold audit ace --as-of 1234 -o yaml`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeNodes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("why") && o.why == 0 {
				return withCode(exitUsage, errors.New("--why 0: stream sequences start at 1"))
			}
			return runAudit(store.WithRideOut(cmd.Context(), o.timeout), a, args[0], o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.since, "since", "", "first event: a stream sequence or an RFC 3339 time")
	fl.StringVar(&o.until, "until", "", "last event: a stream sequence or an RFC 3339 time")
	fl.StringVar(&o.asOf, "as-of", "", "print the state after folding every event at or before this sequence or time")
	fl.Uint64Var(&o.why, "why", 0, "explain the event at this stream sequence")
	o.out.add(cmd, "print one JSON document (-o json)")
	addReadTimeout(cmd, &o.timeout)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// parseBounds reads the bound flags; a nil bound is absent.
func (o auditOpts) parseBounds() (since, until, asOf *audit.Bound, err error) {
	parse := func(flag, s string) (*audit.Bound, error) {
		if s == "" {
			return nil, nil
		}
		b, err := audit.ParseBound(s)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("--%s: %w", flag, err))
		}
		return &b, nil
	}
	if since, err = parse("since", o.since); err != nil {
		return
	}
	if until, err = parse("until", o.until); err != nil {
		return
	}
	if asOf, err = parse("as-of", o.asOf); err != nil {
		return
	}
	modes := 0
	for _, on := range []bool{asOf != nil, o.why != 0, since != nil || until != nil} {
		if on {
			modes++
		}
	}
	if modes > 1 {
		err = withCode(exitUsage, errors.New("--as-of, --why and --since/--until do not go together"))
	}
	return
}

func runAudit(ctx context.Context, a *app, node string, o auditOpts) error {
	var err error
	if o.format, err = o.out.get(); err != nil {
		return err
	}
	if !events.ValidName(node) {
		return withCode(exitUsage, fmt.Errorf("node %q: %w", node, events.ErrBadName))
	}
	since, until, asOf, err := o.parseBounds()
	if err != nil {
		return err
	}
	nc, err := a.conn.connect("meshfold-audit", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{Progress: a.progress()})
	if err != nil {
		return err
	}
	// Read only as far as the output needs: up to a sequence bound, or
	// until the first event past a time bound.
	end := until
	if asOf != nil {
		end = asOf
	}
	h, err := r.History(ctx, node, query.Bounds{Until: end})
	if err != nil {
		return err
	}
	if len(h.Events) == 0 && h.First == nil {
		if v, ok := a.stateKnows(ctx, r, node); ok {
			// Its history aged out (--max-age): no mistyped name.
			fmt.Fprint(a.stderr, audit.NoteText(agedOutText(ctx, r, node, v)))
			return nil
		}
		cfg, err := r.Stream(ctx)
		if err != nil {
			return err
		}
		return &quietErr{msg: fmt.Sprintf("node %q has no events in stream %s at %s (a mistyped name, or another server? 'meshfold fleet --all' lists the nodes)",
			node, cfg.Name, serverURL(nc)), err: query.ErrUnknownNode}
	}
	begins := r.Begins(ctx, h)
	if begins != "" && (o.why != 0 || asOf != nil) {
		fmt.Fprint(a.stderr, audit.NoteText(begins))
	}
	switch {
	case o.why != 0:
		w, err := h.Why(o.why)
		if err != nil {
			return err
		}
		if o.format != outTable {
			return writeValue(a.stdout, o.format, w)
		}
		_, err = io.WriteString(a.stdout, w.Text())
		return err
	case asOf != nil:
		as := h.AsOf(*asOf)
		if o.format != outTable {
			return writeValue(a.stdout, o.format, as)
		}
		_, err = io.WriteString(a.stdout, as.Text())
		return err
	}
	from, to := 0, len(h.Events)
	notes := []string{begins}
	if since != nil {
		var n string
		from, n = h.Since(*since)
		notes = append(notes, n)
	}
	if until != nil {
		var n string
		to, n = h.Until(*until)
		notes = append(notes, n)
	}
	to = max(from, to)
	return printTimeline(a, h, from, to, notes, o.format)
}

// printTimeline prints entries [from, to) of h, and the bounds' notes:
// on stdout before the lines, or on stderr with -o json|yaml (stdout then holds
// only entries).
func printTimeline(a *app, h *audit.History, from, to int, notes []string, format string) error {
	asJSON := format != outTable
	noteOut := a.stdout
	if asJSON {
		noteOut = a.stderr
	}
	for _, n := range notes {
		if n != "" {
			if _, err := io.WriteString(noteOut, audit.NoteText(n)); err != nil {
				return err
			}
		}
	}
	entries := h.Timeline(from, to)
	if len(entries) == 0 {
		_, err := io.WriteString(noteOut, audit.NoteText(fmt.Sprintf("no event of %s in that range", h.Node)))
		return err
	}
	if asJSON {
		// One document, the entries in stream order (issue 25): a tool
		// reads it whole, as it reads --as-of's or --why's.
		return writeValue(a.stdout, format, entries)
	}
	width := audit.SeqWidth(entries)
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(e.Line(width))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(a.stdout, b.String())
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	// Text as written: a why's "<", ">" and "&" are not \u003c… (this is
	// no HTML page).
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// progress returns a progress reporter (query.Config.Progress: a replay
// of more than query.ProgressThreshold events) drawing a bar on stderr,
// or nil when stderr is not a terminal. golang.org/x/term decides: it asks the
// terminal driver (TCGETS), which a character device such as /dev/null
// fails, where a check of the file mode alone would take /dev/null for a
// terminal and litter a redirected run with control characters.
func (a *app) progress() func(node string, done, total int) {
	f, ok := a.stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return func(node string, done, total int) {
		if done < 0 {
			fmt.Fprint(f, "\r\033[K")
			return
		}
		const width = 30
		filled := width * done / max(total, 1)
		fmt.Fprintf(f, "\rreplaying %s [%s%s] %s/%s events", node, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
			strconv.Itoa(done), strconv.Itoa(total))
	}
}
