package audit_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// TestFleetSummaryRows checks that a node's fleet row made from its
// stored summary (reconcile.MarshalSummary, then UnmarshalSummary) is the
// row made from its whole view, after every input of every datadriven
// script of reconcile and reconcile/audit (pauses, retirements, failed
// applies, crash loops, owed and unfilled files, acks) and of the bench's
// scripted mix, at several times after it (ages cross the stale, stuck
// and flapping thresholds). A fleet row that reads a field the summary
// leaves out fails here: keep the field (View.FleetSummary) and bump
// reconcile.SummaryFormat.
func TestFleetSummaryRows(t *testing.T) {
	check := func(t testing.TB, where string, st *reconcile.State, at time.Time) {
		t.Helper()
		b, err := reconcile.MarshalSummary(st)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		for _, c := range b {
			if c < 0x20 || c >= 0x7f {
				t.Fatalf("%s: summary byte %#x is not printable ASCII: %s", where, c, b)
			}
		}
		sv, err := reconcile.UnmarshalSummary(b)
		if err != nil {
			t.Fatalf("%s: %v\n%s", where, err, b)
		}
		// What fleet read before: the snapshot, decoded.
		snap, err := reconcile.MarshalState(st)
		if err != nil {
			t.Fatal(err)
		}
		full, err := reconcile.UnmarshalStateShared(snap)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		for _, d := range []time.Duration{0, 30 * time.Second, 2 * time.Minute, 11 * time.Minute, 2 * time.Hour, 48 * time.Hour} {
			now := at.Add(d)
			want := shown(audit.FleetRowOfView(full.View(), now, 10*time.Minute), now)
			got := shown(audit.FleetRowOfView(sv, now, 10*time.Minute), now)
			if got != want {
				t.Fatalf("%s, at +%s: the summary's row differs from the snapshot's:\n got %s\nwant %s\nsummary %s", where, d, got, want, b)
			}
		}
	}
	var scripts []string
	for _, g := range []string{"testdata/*.txt", "../testdata/*.txt"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		scripts = append(scripts, m...)
	}
	if len(scripts) < 20 {
		t.Fatalf("only %d scripts found", len(scripts))
	}
	for _, path := range scripts {
		t.Run(filepath.Base(path), func(t *testing.T) {
			sc := &reconciletest.Script{Stream: reconciletest.New(base, time.Second), Node: "ace"}
			datadriven.RunTestAny(t, path, func(t testing.TB, d *datadriven.TestData) string {
				if d.Cmd == "node" {
					for _, a := range d.CmdArgs {
						if a.Key == "name" {
							*sc = reconciletest.Script{Stream: reconciletest.New(base, time.Second), Node: strings.Join(a.Vals, ",")}
						}
					}
					return d.Expected
				}
				if ev, ok := sc.Input(t, d); ok && sc.Stream.State(sc.Node) != nil {
					check(t, fmt.Sprintf("%s after #%d %s", d.Pos, ev.Seq, ev.Kind), sc.Stream.State(sc.Node), ev.Time)
				}
				return d.Expected // this test reads the states, not the output
			})
		})
	}
	t.Run("runtime", func(t *testing.T) {
		// Runtimes the scripts do not reach: a module that flaps, one
		// that crashed less often, an unhealthy one, a failed one.
		at := base.Add(time.Hour)
		crashes := []time.Time{at.Add(-3 * time.Minute), at.Add(-2 * time.Minute), at.Add(-time.Minute)}
		v := reconcile.View{Node: "ace", Seq: 9, HaveSeq: 8, HaveTime: at, Runtime: []reconcile.ModuleRuntime{
			{Module: "a", Build: "a:1", State: events.Running},
			{Module: "b", Build: "b:1", State: events.Running, Restarts: 3, Crashes: crashes},
			{Module: "c", Build: "c:1", State: events.Running, Restarts: 2, Crashes: crashes[1:]},
			{Module: "d", Build: "d:1", State: events.Running, Health: events.Unhealthy},
			{Module: "e", Build: "e:1", State: events.Failed, Restarts: 7, Exit: "status 1"},
		}}
		for _, d := range []time.Duration{0, 8 * time.Minute, time.Hour} {
			now := at.Add(d)
			want := shown(audit.FleetRowOfView(v, now, 10*time.Minute), now)
			if got := shown(audit.FleetRowOfView(v.FleetSummary(), now, 10*time.Minute), now); got != want {
				t.Fatalf("at +%s: the summary's row differs from the view's:\n got %s\nwant %s", d, got, want)
			}
			if d == 0 && !strings.Contains(want, `"flapping":[{"module":"b"`) {
				t.Fatalf("module b does not flap: %s", want)
			}
		}
	})
	t.Run("scripted", func(t *testing.T) {
		names := make([]string, 200)
		for i := range names {
			names[i] = fmt.Sprintf("n%03d", i)
		}
		s := reconciletest.Scripted(names, 20*len(names), 17, nil)
		end := s.TimeOf(s.Next())
		for _, n := range names {
			check(t, n, s.State(n), end)
		}
	})
}

// shown is everything fleet prints of r: its JSON line, its table line
// and the lines after the table, with journal warnings and source
// problems set as a reader sets them.
func shown(r audit.FleetRow, now time.Time) string {
	r.SetWarningSeqs([]uint64{1, r.SettledPlan + 1})
	r.SetSources([]audit.SourceProblem{{Module: "m", Path: "/p", State: "missing", Why: "none", Since: now.Add(-time.Hour)}})
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	rows := []audit.FleetRow{r}
	return string(b) + "\n" + r.Line(24) + "\n" + audit.FleetWarningsText(rows) + audit.FleetAckedText(rows) +
		audit.FleetFailedText(rows) + audit.FleetAppliesText(rows, now) + audit.FleetMissingText(rows) + audit.FleetStuckText(rows) + audit.FleetSourcesText(rows, now)
}
