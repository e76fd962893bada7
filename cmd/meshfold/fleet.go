package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
)

func init() { register(newFleetCmd) }

func newFleetCmd(a *app) *cobra.Command {
	var (
		out      outputFlag
		all      bool
		stale    time.Duration
		warnings time.Duration
	)
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "One line per node, what needs an operator first",
		Long: `fleet reads every node's stored snapshot in one pass and prints one line per
node: newest want and settled plan, unsettled plans, held modules, owed items,
the last knock (KNOCK ←#N: the event that caused it, as the timeline writes
an effect; JSON last_knock_cause), the age of the last have and what needs
an operator. Nodes are sorted so that what needs an operator comes first: an
unreadable snapshot, a failed module (its process exited and waits to
restart: a crash loop; the lines after the table name the files it waits
for), a failed apply (the agent could not apply a plan; the lines after
the table say why, per module: the newest failed settle's error, cut), a
file never filled, a file the provisioner could not fill (no source,
a failed helper, a secret sealed to another key or that cannot be opened: the
'source' lines after the table say which and why, live from the provisioners'
reports), owed items, pending approvals, unsettled plans, the provisioner
account warning, a stale have (older than --stale, or none), then journal
warnings (entries of level warn or error in the last --warnings, counted
from the stream; 0 skips that read). A warning older than its node's newest
settled plan, on a node nothing else flags, has cleared: the node converged
since; it is counted apart (cleared) and does not flag the node.

What is stuck is said too: a file a settled plan declares that was never
filled since its module was placed (a minute after that plan settled: is the
provisioner's source for it there?), owed items older than an hour ('meshfold
waive' clears one nobody will fill), a paused node (by whom, for how long), a
node retiring (its empty plan not settled yet: 'retire --force' forgets a node
whose agent is gone). Retired nodes are left out; --all lists them too.

Snapshots are as fresh as the reconciler's last checkpoint. -o json prints
JSON lines, one node a line; -o yaml one YAML document per node.`,
		Example: `  meshfold fleet
  meshfold fleet --all -o yaml
  meshfold fleet -o json | jq 'select(.stuck.paused)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := out.get()
			if err != nil {
				return err
			}
			if stale < 0 {
				return withCode(exitUsage, fmt.Errorf("--stale %s: must not be negative", stale))
			}
			if warnings < 0 {
				return withCode(exitUsage, fmt.Errorf("--warnings %s: must not be negative (0 skips the read)", warnings))
			}
			return runFleet(cmd.Context(), a, format, all, stale, warnings)
		},
	}
	fl := cmd.Flags()
	out.add(cmd, "print JSON lines, one node a line (-o json)")
	fl.BoolVar(&all, "all", false, "list retired nodes too")
	fl.DurationVar(&stale, "stale", 10*time.Minute, "a have older than this is stale")
	fl.DurationVar(&warnings, "warnings", time.Hour, "count journal warnings and errors this far back (0: do not)")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

func runFleet(ctx context.Context, a *app, format string, all bool, stale, warnings time.Duration) error {
	nc, err := a.conn.connect("meshfold-fleet", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	now := time.Now()
	nvs, err := r.Fleet(ctx)
	if err != nil {
		return err
	}
	rows := fleetRows(nvs, now, stale)
	if warnings > 0 {
		seqs, err := r.WarningSeqs(ctx, now.Add(-warnings))
		if err != nil {
			return err
		}
		counts := map[string]int{events.FleetNode: len(seqs[events.FleetNode])}
		for i := range rows {
			rows[i].SetWarningSeqs(seqs[rows[i].Node])
		}
		// The fleet-wide journal: events no node's journal can hold (on
		// subjects that name no valid node, aged out before folded).
		if n := counts[events.FleetNode]; n > 0 {
			cfg, err := r.Stream(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "note: the fleet journal (%s) has %d entries at warn or error in the last %s: meshfold audit cannot show them; read them with nats stream get or subscribe\n",
				cfg.Subjects().Event(events.FleetNode, events.KindJournal), n, warnings)
		}
	}
	// Why files are unfilled, as the provisioners report it (live).
	sources, err := r.Sources(ctx, "")
	if err != nil {
		fmt.Fprintf(a.stderr, "note: why files are unfilled (the provisioners' reports) could not be read: %v\n", err)
	}
	for i := range rows {
		if ps := sources[rows[i].Node]; len(ps) > 0 {
			rows[i].SetSources(ps)
		}
	}
	if !all {
		rows = slices.DeleteFunc(rows, func(r audit.FleetRow) bool { return r.Retired })
	}
	audit.SortFleet(rows)
	if format != outTable {
		for _, r := range rows {
			if err := writeValue(a.stdout, format, r); err != nil {
				return err
			}
		}
		return nil
	}
	return printFleet(a.stdout, rows, now)
}

// fleetRows makes each node's row at now.
func fleetRows(nvs []query.NodeView, now time.Time, stale time.Duration) []audit.FleetRow {
	rows := make([]audit.FleetRow, len(nvs))
	for i, nv := range nvs {
		rows[i] = nv.Row(now, stale)
	}
	return rows
}

func printFleet(w io.Writer, rows []audit.FleetRow, now time.Time) error {
	width := 4
	for _, r := range rows {
		width = max(width, len(r.Node))
	}
	width = min(width, 24)
	var b strings.Builder
	b.WriteString(audit.FleetHeader(width) + "\n")
	needs := 0
	for _, r := range rows {
		b.WriteString(r.Line(width) + "\n")
		if len(r.Attention) > 0 {
			needs++
		}
	}
	noun := "nodes"
	if len(rows) == 1 {
		noun = "node"
	}
	fmt.Fprintf(&b, "-- %d %s, %d need an operator\n", len(rows), noun, needs)
	cleared := 0
	for _, r := range rows {
		cleared += r.ClearedWarnings
	}
	if cleared > 0 {
		fmt.Fprintf(&b, "-- %d journal warnings cleared: older than their node's newest settled plan, on nodes nothing else flags (JSON journal_warnings_cleared; meshfold audit NODE shows them)\n", cleared)
	}
	b.WriteString(audit.FleetFailedText(rows))
	b.WriteString(audit.FleetAppliesText(rows, now))
	b.WriteString(audit.FleetStuckText(rows))
	b.WriteString(audit.FleetSourcesText(rows, now))
	_, err := io.WriteString(w, b.String())
	return err
}
