package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/store"
)

// BenchmarkFleetTableLag measures what `meshfold fleet` (the table)
// pays to say how current it is, at scale: MESHFOLD_SCALE_NODES
// snapshots (100,000) as the reconciler stores them, and one want each
// for MESHFOLD_FLEET_LAG nodes (10,000) no snapshot holds yet, as nodes
// just started, in the stream. Runs
// alternate between the checkpoints at the stream's end ("current": the
// lag read alone, two requests a partition) and the checkpoints at 0
// ("lagging": every partition behind, each event past it read for its
// subject, and the live asks, stopped at the first "no reconciler": none
// runs here). Reported: the fleet process's CPU (user+system) and wall
// time, medians of three runs each, and the ratio lagging / current.
func BenchmarkFleetTableLag(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	n := scaleNodes(b)
	lagN := 10000
	if s := os.Getenv("MESHFOLD_FLEET_LAG"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("MESHFOLD_FLEET_LAG=%q: a count of nodes", s)
		}
		lagN = v
	}
	lagN = min(lagN, n)
	m := startMesh(b)
	ctx := context.Background()
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		b.Fatal(err)
	}
	all, sums := scaleSnapshots(b, n, true)
	byPart := map[int]map[string][]byte{}
	for node, data := range all {
		p := events.Partition(node, m.cfg.Partitions)
		if byPart[p] == nil {
			byPart[p] = map[string][]byte{}
		}
		byPart[p][node] = data
	}
	for p, states := range byPart {
		if err := snaps.PutSummarizedAt(ctx, p, states, sums, nil); err != nil {
			b.Fatal(err)
		}
	}
	subj := m.cfg.Subjects()
	want, err := events.Encode(events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now()))
	if err != nil {
		b.Fatal(err)
	}
	publishEvents(b, m.js, lagN, func(i int) (string, []byte, uint64) {
		// Nodes no snapshot holds yet (just started): each row is read
		// live, or named.
		return subj.Event(fmt.Sprintf("new-%06d", i), events.KindWant), want, uint64(i + 1)
	})
	checkpoints := func(seq uint64) {
		for p := range m.cfg.Partitions {
			if err := snaps.PutCheckpoint(ctx, p, seq); err != nil {
				b.Fatal(err)
			}
		}
	}
	table := func() (wall, cpu time.Duration, out string) {
		var o, e bytes.Buffer
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "--", "fleet", "--server", m.e.ClientURL())
		cmd.Env = append(os.Environ(), "MESHFOLD_HELPER_PROCESS=1")
		cmd.Stdout, cmd.Stderr = &o, &e
		t0 := time.Now()
		if err := testproc.StartChild(cmd); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatalf("fleet: %v\n%s", err, e.String())
		}
		return time.Since(t0), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), o.String()
	}
	lagLine := func(out string) string {
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, "-- as of ") {
				return strings.TrimSpace(l)
			}
		}
		return ""
	}
	checkpoints(uint64(lagN))
	table() // warm
	var curW, curC, lagW, lagC []time.Duration
	var curLine, lagLineS string
	for b.Loop() {
		for range 3 {
			checkpoints(uint64(lagN))
			w, c, out := table()
			curW, curC, curLine = append(curW, w), append(curC, c), lagLine(out)
			checkpoints(0)
			w, c, out = table()
			lagW, lagC, lagLineS = append(lagW, w), append(lagC, c), lagLine(out)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(float64(n), "nodes")
	b.ReportMetric(float64(lagN), "lagging-nodes")
	b.ReportMetric(ms(med(curC)), "current-cpu-ms")
	b.ReportMetric(ms(med(lagC)), "lagging-cpu-ms")
	b.ReportMetric(float64(med(lagC))/float64(med(curC)), "lagging/current-cpu")
	b.ReportMetric(ms(med(curW)), "current-ms")
	b.ReportMetric(ms(med(lagW)), "lagging-ms")
	b.Logf("%d nodes, %d with an event past the checkpoints: the table current %s (CPU %s), lagging %s (CPU %s); runs current %v / %v, lagging %v / %v\ncurrent: %s\nlagging: %s",
		n, lagN, med(curW).Round(time.Millisecond), med(curC).Round(time.Millisecond), med(lagW).Round(time.Millisecond), med(lagC).Round(time.Millisecond),
		curW, curC, lagW, lagC, curLine, lagLineS)
}
