package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// BenchmarkBuildRm100k times `meshfold build rm` as a user meets it at
// 100,000 nodes (MESHFOLD_SCALE_NODES), each with a want, a plan, a
// settle and two haves in the stream (500,000 events): a build that 1 %
// of the nodes want and run, refused after its whole check (each node's
// newest want, have and retire, each fleet's rollout), and beside it a
// raw read of the same stream's newest want and have of every node (a
// last-per-subject consumer per kind, nothing decoded): the floor of the
// check. It reports each in ms (median of three, alternated) and the
// ratio, and the CPU of the whole process (server and command) per run.
func BenchmarkBuildRm100k(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	n := scaleNodes(b)
	m := startMesh(b)
	ctx := context.Background()
	v1, v2 := pushExe(b, m, "web", "1"), pushExe(b, m, "web", "2")
	subj := m.cfg.Subjects()
	const perNode = 5
	publishEvents(b, m.js, n*perNode, func(i int) (string, []byte, uint64) {
		node, k := fmt.Sprintf("node-%06d", i%n), i/n
		build := v2
		if (i%n)%100 == 0 {
			build = v1
		}
		var p events.Payload
		kind := events.KindWant
		switch k {
		case 0:
			p = &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
				{Name: "web", Build: build, RunsAs: "web", Files: []events.File{{Path: "/etc/web/key", Mode: "0600"}}}}}
		case 1:
			kind, p = events.KindPlan, &events.Plan{Cause: uint64(i%n + 1), Want: uint64(i%n + 1), ProvisionerAccount: "prov",
				Modules: []events.PlanModule{{Name: "web", Build: build, RunsAs: "web"}}}
		case 2:
			kind, p = events.KindSettle, &events.Settle{Op: events.OpApply, Plan: uint64(n + i%n + 1)}
		default:
			kind, p = events.KindHave, &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"},
				{Name: "web", Build: build, State: events.Running, Account: "web", Restarts: k}}}
		}
		data, err := events.Encode(events.Stamp(p, time.Now()))
		if err != nil {
			b.Fatal(err)
		}
		return subj.Event(node, kind), data, uint64(i + 1)
	})
	raw := func() {
		count := 0
		for _, k := range []events.Kind{events.KindWant, events.KindHave} {
			if err := store.LastPerSubject(ctx, m.js, m.cfg.Name, subj.StoredKind(k), func(string, uint64, []byte) error {
				count++
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		if count != 2*n {
			b.Fatalf("raw read %d messages, want %d", count, 2*n)
		}
	}
	rm := func() {
		_, errs, code := m.cli(b, "build", "rm", v1)
		if code != exitConflict || !strings.Contains(errs, fmt.Sprintf("%d nodes want it", (n+99)/100)) {
			b.Fatalf("build rm: exit %d\n%s", code, errs)
		}
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	timed := func(f func()) (time.Duration, time.Duration) {
		c0, t0 := cpu(), time.Now()
		f()
		return time.Since(t0), cpu() - c0
	}
	b.ResetTimer()
	for range b.N {
		var rms, raws, rmCPU, rawCPU []time.Duration
		for range 3 {
			w, c := timed(rm)
			rms, rmCPU = append(rms, w), append(rmCPU, c)
			w, c = timed(raw)
			raws, rawCPU = append(raws, w), append(rawCPU, c)
		}
		med := func(d []time.Duration) time.Duration { return sortedDur(d)[len(d)/2] }
		b.ReportMetric(float64(med(rms).Milliseconds()), "rm-ms")
		b.ReportMetric(float64(med(raws).Milliseconds()), "raw-ms")
		b.ReportMetric(float64(med(rms))/float64(med(raws)), "ratio")
		b.ReportMetric(float64(med(rmCPU).Milliseconds()), "rm-cpu-ms")
		b.ReportMetric(float64(med(rawCPU).Milliseconds()), "raw-cpu-ms")
	}
}

func sortedDur(d []time.Duration) []time.Duration {
	out := append([]time.Duration(nil), d...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
