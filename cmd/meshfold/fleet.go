package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newFleetCmd) }

func newFleetCmd(a *app) *cobra.Command {
	var (
		out      outputFlag
		all      bool
		stale    time.Duration
		warnings time.Duration
		timeout  time.Duration
		pg       fleetPaging
	)
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "One line per node, what needs an operator first",
		Long: `fleet reads every node's stored snapshot in one pass and prints one line per
node: newest want and settled plan, unsettled plans, held modules, owed items,
the last knock (KNOCK ←#N: the event that caused it, as the timeline writes
an effect; JSON last_knock_cause), the age of the last have and what needs
an operator. Nodes are sorted so that what needs an operator comes first: an
unreadable snapshot, a failed module (its process exited and waits to restart:
a crash loop; the lines after the table name the files it waits for), a node
whose provisioner client is down while its plan declares a file
(provisioner-down: its lease ended, kill -9 included, within two lease TTLs;
the 'prov' line after the table says "no provisioner answered since T", how
its lease ended, and that the knocks wait for the next provisioner, which
answers them on start; JSON provisioner_down; the 'source' lines of such a
node are what that provisioner last saw), a failed apply (the agent could not
apply a plan; the lines after the table say why, per module: the newest failed
settle's error, cut), a file never filled, a file the provisioner could not
fill (no source, a failed helper, a secret sealed to another key or that
cannot be opened: the 'source' lines after the table say which and why, live
from the provisioners' reports; a why over 200 bytes is cut between words,
and 'meshfold state NODE' prints it whole), owed items, pending approvals,
unsettled plans, the provisioner account warning, a stale have (older than
--stale, or none), then journal warnings (entries of level warn or error in
the last --warnings, counted from the stream; 0 skips that read; the
'journal' lines after the table name the newest three of each node's,
'#SEQ level: message').
A warning older than its node's newest settled plan, on a node nothing else
flags, has cleared: the node converged since; it is counted apart (cleared)
and does not flag the node. A warning an operator acknowledged ('meshfold ack
NODE --by NAME': every warning of the node stored up to then, or up to --upto
SEQ) does not flag it either: the 'acked' lines after the table count them,
with who acknowledged them and when (JSON journal_warnings_acked and ack).

What is stuck is said too: a file a settled plan declares that was never
filled since its module was placed (a minute after that plan settled: is the
provisioner's source for it there?), owed items older than an hour ('meshfold
waive' clears one nobody will fill), a paused node (by whom, for how long), a
node retiring (its empty plan not settled yet: 'retire --force' forgets a node
whose agent is gone). Retired nodes are left out; --all lists them too.

A fleet longer than one page (--limit rows, 50 unless told) is paged: a
summary comes first, how many nodes share each need (a node counts under
each of its needs; 'nothing' counts the calm ones), then the page's rows,
most pressing first (the calm ones last, by name), and the lines after the
table for those rows only.
--page N shows the Nth page, --needs NEED only the nodes with that need
(a name of the summary), --limit 0 or --all every row. A fleet that fits
one page prints as it always did.

fleet is a snapshot view: it reads the states the reconciler stores at its
checkpoints (a changed state is put a few checkpoints later, so a second or
more after the event, and longer after a restart), not the live reconciler.
The table says how old they are ('-- as of the reconciler's snapshots,
checkpointed 3s ago') and whether the stream holds newer events; the nodes
with events past their snapshot (one just started, just retired, a settle
after a restart), at most 500, it reads live from the reconciler's state
service, and names them. When no reconciler answers for a partition's
nodes (every reconciler down, or one of a group before its partitions are
taken over), the table's first line says so, since when and for which
partitions ('-- NO RECONCILER ANSWERS for the nodes of partitions 3, 8 (of
16): their events since T are folded by none …'), and the rows of those
nodes are folded here: each node's snapshot with its events past it, read
from the stream (one read a partition), as the reconciler would fold them.
A row still older than its node's events (past the 500, or past 20000
events of a partition) is not counted stale-have: its have may be in
them; 'meshfold state NODE' folds one. Its last line says what the stream keeps
('-- stream MESH keeps all events', or '… keeps 2160h0m0s of events
(--max-age)': the retention a reconcile or serve --max-age/--max-bytes set).

-o json prints JSON lines, one object a node (nothing at all when no node
has a snapshot), every node unless --limit, --page or --needs says
otherwise; -o yaml one YAML document per node. Both print the snapshots as
stored, in one pass (the cost stays that of reading the bucket), and say on
stderr when they lag the stream; then the line of each node with events
newer than its snapshot says "behind":true and its newest event's
"newest_seq". 'meshfold state NODE -o json' reads one node live.`,
		Example: `  meshfold fleet                      # the summary, then the 50 most pressing nodes
  meshfold fleet --page 2             # the next 50
  meshfold fleet --needs failed       # only the crash-looping nodes, paged
  meshfold fleet --needs provisioner-down   # nodes whose knocks nobody answers
  meshfold fleet -o json | jq 'select(.provisioner_down) | {node, since: .provisioner_down.time}'
  meshfold fleet --limit 0            # every node, one line each
  meshfold fleet --all -o yaml
  meshfold fleet -o json | jq 'select(.stuck.paused)'`,
		Args: noArgs("for one node: meshfold state NODE"),
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
			if pg.limit < 0 || pg.page < 1 {
				return withCode(exitUsage, fmt.Errorf("--limit %d --page %d: a limit ≥ 0 (0: every row) and a page ≥ 1", pg.limit, pg.page))
			}
			if pg.needs != "" && pg.needs != audit.NeedNothing && !slices.Contains(audit.FleetNeeds, pg.needs) {
				return withCode(exitUsage, fmt.Errorf("--needs %q: one of %s, %s", pg.needs, strings.Join(audit.FleetNeeds, ", "), audit.NeedNothing))
			}
			fl := cmd.Flags()
			pg.set = fl.Changed("limit") || fl.Changed("page") || pg.needs != ""
			if all && !fl.Changed("limit") {
				pg.limit = 0
			}
			return runFleet(store.WithRideOut(cmd.Context(), timeout), a, format, all, stale, warnings, pg)
		},
	}
	fl := cmd.Flags()
	out.add(cmd, "print JSON lines, one node a line (-o json)")
	fl.BoolVar(&all, "all", false, "list retired nodes too, and every row unless --limit is given")
	fl.IntVar(&pg.limit, "limit", 50, "rows a page of the table holds (0: every row, unpaged)")
	fl.IntVar(&pg.page, "page", 1, "which page of the table to print (1: the most pressing nodes)")
	fl.StringVar(&pg.needs, "needs", "", "only the nodes with this need (a name the summary lists: failed, owed, stale-have, …; nothing: the calm ones)")
	fl.DurationVar(&stale, "stale", 10*time.Minute, "a have older than this is stale")
	fl.DurationVar(&warnings, "warnings", time.Hour, "count journal warnings and errors this far back (0: do not)")
	addReadTimeout(cmd, &timeout)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// fleetLagRead, when set (by a test), runs after `meshfold fleet` has read
// the checkpoints and before it reads the snapshots.
var fleetLagRead func()

// fleetNow is `meshfold fleet`'s clock (a test's to set).
var fleetNow = time.Now

// fleetPaging is how much of the fleet `meshfold fleet` prints.
type fleetPaging struct {
	limit, page int
	needs       string
	// set: --limit, --page or --needs was given (JSON and YAML are paged
	// only then).
	set bool
}

func runFleet(ctx context.Context, a *app, format string, all bool, stale, warnings time.Duration, pg fleetPaging) error {
	nc, err := a.conn.connect("meshfold-fleet", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	// Every node's row (with -o json, its line) is kept until printed:
	// the heap grows to hold them all, so collecting at each doubling
	// marks the same rows again and again. Collect at each fivefold growth instead (issue 27: decoding,
	// making and printing 100,000 rows in process took 18-20 collections
	// and 1.3-1.6 s of CPU, 5 and 0.97 s so; the heap's peak about a
	// fifth higher, 284-308 → 348-356 MB of the runtime's). An
	// operator's own GOGC is kept when it is off or already higher.
	if own := debug.SetGCPercent(400); own < 0 || own > 400 {
		debug.SetGCPercent(own)
	} else {
		defer debug.SetGCPercent(own)
	}
	now := fleetNow()
	// The journal's warnings and the provisioners' reports are read while
	// the snapshots are: at 100,000 nodes, one after the other was a
	// third of the time (issue 27).
	var (
		seqs       map[string][]uint64
		seqsErr    error
		sources    map[string][]audit.SourceProblem
		sourcesErr error
		lag        query.SnapshotLag // how current the snapshots are (fleetlag.go)
		lagErr     error
		feeds      map[string]time.Time // the agents that read no plan, since when (their leases)
		feedsErr   error
		tail       lagTail // -o json/yaml: the nodes with events past the checkpoints
		wg         sync.WaitGroup
	)
	if warnings > 0 {
		wg.Go(func() { seqs, seqsErr = r.WarningSeqs(ctx, now.Add(-warnings)) })
	}
	wg.Go(func() { sources, sourcesErr = r.Sources(ctx, "") })
	// Whether serve's store takes writes: a store that took none for 10
	// minutes showed a fleet all well (a fresh user's finding G1).
	var storeLine string
	wg.Go(func() {
		if st, err := query.RequestStoreStatus(ctx, nc, a.stream.prefix, storeAskTimeout); err == nil {
			storeLine = st.Headline(fleetNow())
		}
	})
	// An agent that lives and reads no plan says so in its lease, which
	// no snapshot holds (a fresh user's finding M8: 272 of 300 agents
	// followed no plan while fleet said "nothing 301").
	wg.Go(func() { feeds, feedsErr = r.FeedsLost(ctx, "") })
	// The checkpoints (and each partition's newest event) are read before
	// the snapshots, as the console's start reads them: every state
	// stored is put before the checkpoint that covers it, so a snapshot
	// read after a checkpoint covers its node's events up to it, and the
	// events past it are read below (the rows older than them live). Read
	// beside the snapshots, a node's new state and a checkpoint past its
	// event could land after its snapshot was read and before the
	// checkpoint was: its old row was then shown, and the line said the
	// stream held no newer event (a reviewer's finding). It costs the
	// lag's round trip (two small requests a partition, at once) before
	// the snapshot pass.
	lag, lagErr = r.Lag(ctx)
	// The checkpoints' ages are taken once they are read: taken from
	// now, a checkpoint put while the read waited (a reconciler's
	// takeover, seconds into an outage) was younger than the command,
	// and the line said "checkpointed -6s ago" (a fresh user's finding
	// m3: fleet started 0.2 s after a kill -9 answered 10.3 s later).
	lagAt := fleetNow()
	if fleetLagRead != nil {
		fleetLagRead()
	}
	// The JSON and YAML lines are the snapshots as stored; a node with
	// events past its partition's checkpoint has its line say so
	// ("behind"). Nothing is read when no partition lags.
	if lagErr == nil && format != outTable && len(lag.Behind()) > 0 {
		wg.Go(func() { tail.nodes, tail.complete, tail.err = r.TailNodes(ctx, lag, fleetTailMax) })
	}
	// annotate sets on a row what is read beside the snapshots: its
	// journal warnings (when counted), then the files its provisioner
	// could not fill. Only once both reads are done.
	annotate := func(row *audit.FleetRow) {
		if warnings > 0 && seqsErr == nil {
			row.SetWarningSeqs(seqs[row.Node])
		}
		if ps := sources[row.Node]; len(ps) > 0 {
			row.SetSources(ps)
		}
		if since, ok := feeds[row.Node]; ok {
			row.SetFeedLost(since)
		}
		if len(tail.nodes) > 0 {
			if seq, ok := tail.nodes[row.Node]; ok {
				row.SetNewest(seq)
			}
		}
	}
	var (
		rows   []audit.FleetRow
		chunks []*fleetJSONChunk
		// knockErr is the first error of a knock's check on the
		// streamed path (a *error once set).
		knockErr atomic.Pointer[error]
	)
	w := bufio.NewWriterSize(a.stdout, 1<<16)
	if format == outJSON && !pg.set {
		// Every row: each batch's rows are annotated, encoded and keyed
		// for the table's order on the decoding workers, and only their
		// JSON and keys kept. A knock no provisioner answered is a
		// source problem of its node, as in the table (a fresh user's
		// finding 2): the answers are read in one pass beside the
		// snapshots, and a row whose newest knock no answer covers reads
		// its knock (a get each for the first 200, then one pass
		// over every node's newest knock and plan: query.KnockCheck).
		var (
			knocks    *query.KnockCheck
			knocksErr error
		)
		wg.Go(func() { knocks, knocksErr = r.KnockCheck(ctx, now) })
		read := make(chan struct{})
		go func() {
			wg.Wait()
			close(read)
		}()
		stream := func(row *audit.FleetRow) {
			annotate(row)
			if knocks == nil || row.LastKnockCause == 0 || row.Retired || row.Error != "" {
				return
			}
			p, ok, err := knocks.Check(ctx, row.Node, row.LastKnockCause)
			if err != nil {
				knockErr.CompareAndSwap(nil, &err)
			} else if ok {
				row.SetSources(audit.AddUnanswered(row.Sources, p))
			}
		}
		var arena lineArena
		defer arena.free() // once the lines are written
		chunks, err = query.FleetRowsEach(ctx, r, now, stale, func(rows []audit.FleetRow) *fleetJSONChunk {
			<-read
			return encodeFleetChunk(&arena, rows, stream, all)
		})
		defer func() {
			if knocksErr != nil { // read once wg is done, below
				fmt.Fprintf(a.stderr, "note: whether the provisioners answered their knocks could not be read: %v\n", knocksErr)
			}
		}()
	} else {
		rows, err = r.FleetRows(ctx, now, stale)
	}
	wg.Wait()
	if err != nil {
		return err
	}
	if warnings > 0 {
		if seqsErr != nil {
			return seqsErr
		}
		counts := map[string]int{events.FleetNode: len(seqs[events.FleetNode])}
		// The fleet-wide journal: events no node's journal can hold (on
		// subjects that name no valid node, aged out before folded).
		if n := counts[events.FleetNode]; n > 0 {
			cfg, err := r.Stream(ctx)
			if err != nil {
				return err
			}
			entries, them := fmt.Sprintf("%d entries", n), "them"
			if n == 1 {
				entries, them = "1 entry", "it"
			}
			fmt.Fprintf(a.stderr, "note: the fleet journal (%s) has %s at warn or error in the last %s: meshfold audit cannot show %s; read %s with nats stream get or subscribe\n",
				cfg.Subjects().Event(events.FleetNode, events.KindJournal), entries, warnings, them, them)
		}
	}
	// Why files are unfilled, as the provisioners report it (live).
	if sourcesErr != nil {
		fmt.Fprintf(a.stderr, "note: why files are unfilled (the provisioners' reports) could not be read: %v\n", sourcesErr)
	}
	if feedsErr != nil {
		fmt.Fprintf(a.stderr, "note: whether the agents read their plans (their leases) could not be read: %v\n", feedsErr)
	}
	if storeLine != "" && format != outTable {
		fmt.Fprintf(a.stderr, "note: %s\n", storeLine)
	}
	if lagErr != nil {
		fmt.Fprintf(a.stderr, "note: whether the snapshots are as new as the stream could not be read: %v\n", lagErr)
	} else if format != outTable {
		fmt.Fprint(a.stderr, lagNote(lag, lagAt, tail))
	}
	if e := knockErr.Load(); e != nil {
		fmt.Fprintf(a.stderr, "note: whether the provisioners answered their knocks could not be read: %v\n", *e)
	}
	if chunks != nil {
		// Nothing is buffered in w: the lines go to stdout from where
		// they are.
		return writeFleetChunks(a.stdout, chunks)
	}
	for i := range rows {
		annotate(&rows[i])
	}
	var lagLine, firstLine string
	if format == outTable && lagErr == nil {
		// The table reads live the nodes whose events are newer than
		// their snapshot (with no reconciler to ask, folds them here),
		// and says how current it is (fleetlag.go).
		var fl *fleetLag
		rows, fl = refreshLagging(ctx, r, rows, lag, now, stale, annotate)
		lagLine, firstLine = fl.text(lagAt), fl.first(fleetNow())
	}
	if format == outTable {
		// What the stream keeps (its retention: --max-age, --max-bytes
		// of whichever reconciler set them), from the lookup the reads
		// above made: no meshfold command said it (a fresh user's
		// finding m4).
		if cfg, err := r.Stream(ctx); err == nil {
			lagLine += fmt.Sprintf("-- stream %s keeps %s\n", cfg.Name, cfg.Keeps())
		}
	}
	if !all {
		rows = slices.DeleteFunc(rows, func(r audit.FleetRow) bool { return r.Retired })
	}
	// A knock no provisioner answered is a source problem of its node
	// (query.Reader.Unanswered): nothing fills its files.
	knocked := map[string]uint64{}
	for _, row := range rows {
		if row.LastKnockCause > 0 && !row.Retired && row.Error == "" {
			knocked[row.Node] = row.LastKnockCause
		}
	}
	if un, err := r.Unanswered(ctx, knocked, now); err != nil {
		fmt.Fprintf(a.stderr, "note: whether the provisioners answered their knocks could not be read: %v\n", err)
	} else {
		for i := range rows {
			if p, ok := un[rows[i].Node]; ok {
				rows[i].SetSources(audit.AddUnanswered(rows[i].Sources, p))
			}
		}
	}
	if format != outTable {
		audit.SortFleet(rows)
		if pg.set {
			rows, _, _ = pg.of(rows)
		}
		if format == outJSON {
			err = writeJSONLines(w, rows)
		} else {
			for _, r := range rows {
				if err = writeValue(w, format, r); err != nil {
					break
				}
			}
		}
	} else {
		audit.SortFleet(rows)
		noteWarnings(ctx, a, r, rows, pg)
		if storeLine != "" {
			w.WriteString("-- NOTHING IS STORED: " + storeLine + "\n")
		}
		err = printFleet(w, rows, now, pg, firstLine, lagLine)
	}
	if err != nil {
		return err
	}
	return w.Flush()
}

// of returns the rows of the page asked for (those with the need asked
// for, if any), the first's index among them, and how many they are.
func (pg fleetPaging) of(rows []audit.FleetRow) (page []audit.FleetRow, first, total int) {
	if pg.needs != "" {
		rows = slices.DeleteFunc(slices.Clone(rows), func(r audit.FleetRow) bool {
			if pg.needs == audit.NeedNothing { // the calm ones, as the summary counts them
				return len(r.Attention) > 0
			}
			return !slices.Contains(r.Attention, pg.needs)
		})
	}
	if pg.limit == 0 {
		if pg.page > 1 {
			return nil, len(rows), len(rows)
		}
		return rows, 0, len(rows)
	}
	first = min(len(rows), (pg.page-1)*pg.limit)
	return rows[first:min(len(rows), first+pg.limit)], first, len(rows)
}

// fleetJSONChunk is a batch of rows as `fleet -o json` keeps them: their
// JSON lines one after the other in b, each ending at its ends entry, and
// each one's place in the table's order (audit.FleetKeyOf).
type fleetJSONChunk struct {
	b    []byte
	ends []int
	keys []audit.FleetKey
	err  error // the first row that could not be encoded
}

// encodeFleetChunk annotates each of rows, leaves out the retired unless
// all, and encodes and keys the others, their lines in arena.
func encodeFleetChunk(arena *lineArena, rows []audit.FleetRow, annotate func(*audit.FleetRow), all bool) *fleetJSONChunk {
	c := &fleetJSONChunk{b: arena.alloc(len(rows) * 1024), ends: make([]int, 0, len(rows)), keys: make([]audit.FleetKey, 0, len(rows))}
	defer func() { arena.trim(c.b) }()
	for i := range rows {
		row := &rows[i]
		annotate(row)
		if row.Retired && !all {
			continue
		}
		if c.b, c.err = row.AppendJSON(c.b); c.err != nil {
			return c
		}
		c.b = append(c.b, '\n')
		c.ends = append(c.ends, len(c.b))
		c.keys = append(c.keys, audit.FleetKeyOf(row))
	}
	return c
}

// writeFleetChunks writes the lines of chunks in the table's order (the
// rows' audit.SortFleet order, rows of one node in the order read) to w:
// with writev when w is a file (stdout), through a buffer otherwise. A
// row that could not be encoded fails it before anything is written.
func writeFleetChunks(w io.Writer, chunks []*fleetJSONChunk) error {
	n := 0
	for _, c := range chunks {
		if c.err != nil {
			return c.err
		}
		n += len(c.keys)
	}
	// The keys in one array, sorted by audit.FleetKeysOrder.
	keys := make([]audit.FleetKey, 0, n)
	lines := make([][]byte, 0, n)
	for _, c := range chunks {
		start := 0
		for _, end := range c.ends {
			lines = append(lines, c.b[start:end])
			start = end
		}
		keys = append(keys, c.keys...)
		c.keys = nil
	}
	order := audit.FleetKeysOrder(keys)
	sorted := make([][]byte, len(order))
	for k, i := range order {
		sorted[k] = lines[i]
	}
	if f, ok := w.(*os.File); ok {
		return writeFileLines(f, sorted)
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	if err := writeEachLine(bw, sorted); err != nil {
		return err
	}
	return bw.Flush()
}

// writeEachLine writes lines one after the other to w.
func writeEachLine(w io.Writer, lines [][]byte) error {
	for _, l := range lines {
		if _, err := w.Write(l); err != nil {
			return err
		}
	}
	return nil
}

// writeJSONLines writes rows as JSON lines, as writeJSON writes each
// (audit.FleetRow.AppendJSON: encoding/json's bytes without its
// reflection), in order, encoded on one worker per CPU in chunks and
// written in order: at 100,000 nodes encoding one by one was a fifth of
// the command.
func writeJSONLines(w io.Writer, rows []audit.FleetRow) error {
	const chunk = 512
	workers := runtime.GOMAXPROCS(0)
	type part struct {
		b    []byte
		err  error
		done chan struct{}
	}
	parts := make([]*part, (len(rows)+chunk-1)/chunk)
	for i := range parts {
		parts[i] = &part{done: make(chan struct{})}
	}
	next := make(chan int, len(parts))
	for i := range parts {
		next <- i
	}
	close(next)
	// Chunks' buffers are used again once written: growing a new one
	// for each chunk was a fifth of the encoding. No more than ahead
	// chunks are encoded and not yet written, so that a few buffers
	// serve them all (unbounded, the workers ran ahead of the writer and
	// held the whole output: 91 MB at 100,000 nodes).
	var bufs sync.Pool
	ahead := make(chan struct{}, 4*workers)
	for range workers {
		go func() {
			for {
				ahead <- struct{}{}
				i, ok := <-next
				if !ok {
					<-ahead
					return
				}
				p := parts[i]
				if b, ok := bufs.Get().(*[]byte); ok {
					p.b = (*b)[:0]
				} else {
					p.b = make([]byte, 0, chunk*1024)
				}
				for k := i * chunk; k < min(len(rows), (i+1)*chunk); k++ {
					if p.b, p.err = rows[k].AppendJSON(p.b); p.err != nil {
						break
					}
					p.b = append(p.b, '\n')
				}
				close(p.done)
			}
		}()
	}
	var err error
	for _, p := range parts {
		<-p.done
		if err == nil {
			err = p.err
		}
		if err == nil {
			_, err = w.Write(p.b)
		}
		b := p.b
		bufs.Put(&b)
		p.b = nil
		<-ahead
	}
	return err
}

// noteWarnings reads, for the rows of the page flagged with journal
// warnings, the newest audit.MaxWarningNotes of them, so that the lines
// after the table name them. A failed read is said on stderr; the line
// then gives the count and where to read them.
func noteWarnings(ctx context.Context, a *app, r *query.Reader, rows []audit.FleetRow, pg fleetPaging) {
	page, _, _ := pg.of(rows)
	want := map[string]bool{}
	for _, p := range page {
		if p.Warnings > 0 && len(p.WarningSeqs) > 0 {
			want[p.Node] = true
		}
	}
	for i := range rows {
		if !want[rows[i].Node] {
			continue
		}
		seqs := rows[i].WarningSeqs
		for k := len(seqs) - 1; k >= 0 && len(rows[i].WarningNotes) < audit.MaxWarningNotes; k-- {
			j, err := r.JournalAt(ctx, seqs[k])
			if err != nil {
				fmt.Fprintf(a.stderr, "note: journal warning #%d of %s not read: %v\n", seqs[k], rows[i].Node, err)
				break
			}
			rows[i].WarningNotes = append(rows[i].WarningNotes, audit.WarningNote(rows[i].Node, seqs[k], j))
		}
	}
}

// printFleet prints the table; firstLine (fleetLag.first: no reconciler
// answers) comes before it, lagLine (fleetLag.text) after its count line.
func printFleet(w io.Writer, rows []audit.FleetRow, now time.Time, pg fleetPaging, firstLine, lagLine string) error {
	needs := 0
	for _, r := range rows {
		if len(r.Attention) > 0 {
			needs++
		}
	}
	page, first, total := pg.of(rows)
	paged := pg.needs != "" || len(page) < len(rows)
	var b strings.Builder
	b.WriteString(firstLine)
	if paged {
		// More than a page: what the whole fleet needs first, counted.
		b.WriteString(audit.FleetSummaryText(audit.CountNeeds(rows)))
		b.WriteString("\n")
	}
	width := 4
	for _, r := range page {
		width = max(width, len(r.Node))
	}
	width = min(width, 24)
	b.WriteString(audit.FleetHeader(width) + "\n")
	for _, r := range page {
		b.WriteString(r.Line(width) + "\n")
	}
	verb := "need"
	if needs == 1 {
		verb = "needs"
	}
	fmt.Fprintf(&b, "-- %s, %d %s an operator", plural(len(rows), "node"), needs, verb)
	if firstLine != "" {
		// Never "0 need an operator" alone while nothing folds (the
		// M8 bullet of a fresh user's findings).
		b.WriteString(", and no reconciler answers (the first line)")
	}
	b.WriteString("\n")
	if paged {
		b.WriteString(pageLine(pg, page, first, total))
	}
	b.WriteString(lagLine)
	cleared := 0
	for _, r := range rows {
		cleared += r.ClearedWarnings
	}
	if cleared > 0 {
		fmt.Fprintf(&b, "-- %s cleared: older than their node's newest settled plan, on nodes nothing else flags (JSON journal_warnings_cleared; meshfold audit NODE shows them)\n", plural(cleared, "journal warning"))
	}
	b.WriteString(audit.FleetNoisyText(page))
	b.WriteString(audit.FleetFeedLostText(page, now))
	b.WriteString(audit.FleetWarningsText(page))
	b.WriteString(audit.FleetAckedText(page))
	b.WriteString(audit.FleetFailedText(page))
	b.WriteString(audit.FleetAppliesText(page, now))
	b.WriteString(audit.FleetMissingText(page))
	b.WriteString(audit.FleetStuckText(page))
	b.WriteString(audit.FleetSourcesText(page, now))
	_, err := io.WriteString(w, b.String())
	return err
}

// pageLine says which rows a paged table shows and how to see the rest.
func pageLine(pg fleetPaging, page []audit.FleetRow, first, total int) string {
	of := fmt.Sprintf("%d", total)
	if pg.needs != "" {
		of += " needing " + pg.needs
	}
	if total == 0 {
		// No row at all: no page is past anything (a fresh user's
		// finding m7: "page 1 is past the last row (0 needing …)").
		if pg.needs != "" {
			return fmt.Sprintf("-- no node needs %s\n", pg.needs)
		}
		return "-- no node\n"
	}
	return pageFooter(pg.page, pg.limit, total, first, len(page), of, "rows", "--limit 0 for every row")
}

// pageFooter is the line under a paged table (fleet's, rollout status'):
// which rows of total the page of n rows from first shows, of saying
// total as the reader should read it, rows naming them, and how to see
// the next page and every row (all).
func pageFooter(page, limit, total, first, n int, of, rows, all string) string {
	if n == 0 {
		return fmt.Sprintf("-- page %d is past the last row (%s)\n", page, of)
	}
	pages := 1
	if limit > 0 {
		pages = (total + limit - 1) / limit
	}
	s := fmt.Sprintf("-- page %d of %d: %s %d-%d of %s, most pressing first", page, pages, rows, first+1, first+n, of)
	if page < pages {
		s += fmt.Sprintf("; --page %d for the next", page+1)
	}
	return s + "; " + all + "\n"
}

// plural returns "1 word" or "N words".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
