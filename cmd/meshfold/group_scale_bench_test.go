package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// procCluster is a storetest.ProcCluster as an outside benchmark's
// server: its URL names every server, its CPU is theirs summed.
type procCluster struct{ *storetest.ProcCluster }

func (c procCluster) URL() string { return c.URLs() }

func (c procCluster) CPU() time.Duration {
	var sum time.Duration
	for _, d := range c.CPUs() {
		sum += d
	}
	return sum
}

// CPUs is each server's CPU time so far, in server order.
func (c procCluster) CPUs() []time.Duration {
	out := make([]time.Duration, c.N())
	for i := range out {
		out[i] = c.ProcCluster.CPU(i)
	}
	return out
}

// groupServers and groupInstances are issue 27 item 3's shape: a
// 3-server cluster, one group of 4 `meshfold reconcile` instances.
const groupServers, groupInstances = 3, 4

// BenchmarkGroupScale is issue 27's item 3: a group of 4 `meshfold
// reconcile` processes (the binary, one group, members pre-joined so
// that each acquires its 4 of the 16 partitions at once) on a cluster of
// 3 nats-server processes on loopback (storetest.StartProcCluster: own
// ports and store directories), the stream, snapshot and lease buckets
// at 3 replicas as docs/operations.md runs a cluster (`--replicas 3`;
// the product's default for a new stream is 1 even on a cluster), the
// default lease TTL (15 s). The history is the bench's mix,
// enginetest.Simulate over MESHFOLD_SCALE_NODES nodes (100,000), 20
// events a node, sealed with the stream's keys (the effects are stored:
// the fold must publish nothing).
//
// The figure is the cold catch-up, from no snapshot until every
// partition's checkpoint reaches its last input, against the better of
// two raw ordered reads of the same stream with encoding/json
// (enginetest.RawDecodeStd) on the same cluster in the same run
// (`ratio`, goal ≥ 0.85); with each instance's CPU per event it folded
// (its partitions' messages: `iN-cpu-ns/folded-event`), and each
// server's CPU per event over the catch-up and over the raw read. The
// load average (/proc/loadavg) is logged before and after.
//
// MESHFOLD_BENCH_BINS=PATH,PATH,… runs the catch-up (and its raw reads)
// once with each meshfold binary listed, in that order, on the one
// stream loaded: before-and-after figures, interleaved, at the cost of
// one load (5 min at 100,000 nodes on a loaded machine).
//
// MESHFOLD_BENCH_PROFILES=DIR writes CPU profiles of every instance and
// every server over 20 s from 10 s into the catch-up (which slows it:
// do not take that run's figures).
//
//	make bench-scale    # or, alone, at 10,000 nodes:
//	MESHFOLD_SCALE_NODES=10000 go test ./cmd/meshfold -run '^$' -bench '^BenchmarkGroupScale$' -benchtime 1x -timeout 60m
func BenchmarkGroupScale(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	n := scaleNodes(b)
	pc := procCluster{storetest.StartProcCluster(b, groupServers)}
	defer pc.Stop()
	s := startOutsideOn(b, pc, store.StreamConfig{Replicas: groupServers})
	if s.cfg.Replicas != groupServers {
		b.Fatalf("stream replicas %d, want %d", s.cfg.Replicas, groupServers)
	}
	t0 := time.Now()
	h := enginetest.Simulate(20*n, n)
	srv0 := pc.CPU()
	s.load(b, h)
	publishCPU := float64((pc.CPU() - srv0).Nanoseconds()) / float64(s.msgs)
	h = nil
	b.Logf("%d nodes: %d messages generated, sealed and published on %d servers (R%d) in %s; the servers' CPU %.0f ns a message published",
		n, s.msgs, groupServers, s.cfg.Replicas, time.Since(t0).Round(time.Second), publishCPU)
	name := fmt.Sprintf("group-%d-of-%d-nodes", groupInstances, n)
	bins := []string{""}
	if list := os.Getenv("MESHFOLD_BENCH_BINS"); list != "" {
		bins = strings.Split(list, ",")
	}
	for i, bin := range bins {
		sub := name
		if bin != "" {
			sub = fmt.Sprintf("%s-run%d-%s", name, i+1, filepath.Base(bin))
		}
		b.Run(sub, func(b *testing.B) {
			s.bin = bin
			s.groupCatchUp(b, pc, groupInstances)
			b.ReportMetric(publishCPU, "publish-servers-cpu-ns/event")
		})
	}
}

// groupCatchUp is BenchmarkGroupScale's timed part on s, k instances.
func (s *outsideServer) groupCatchUp(b *testing.B, pc procCluster, k int) {
	b.Helper()
	b.Logf("load average before the raw read: %s", loadAvg())
	rawSrv0 := pc.CPUs()
	std := s.rawBest(b, enginetest.RawDecodeStdFirst)
	rawSrv := cpuSince(pc.CPUs(), rawSrv0)
	s.forget(b)
	s.openBuckets(b)
	ttl := engine.DefaultLeaseTTL
	var names []string
	for i := range k {
		names = append(names, fmt.Sprintf("i%d", i))
	}
	preJoin(b, s.js, s.cfg, ttl, names)
	before := s.lastSeq(b)
	runtime.GC()
	b.Logf("load average before the catch-up: %s", loadAvg())
	srv0 := pc.CPUs()
	var procs []*benchProc
	for _, name := range names {
		procs = append(procs, s.startProc(b, "--group", "bench", "--instance", name,
			"--lease-ttl", ttl.String(), "--replicas", fmt.Sprint(s.cfg.Replicas)))
	}
	var profiled sync.WaitGroup
	if dir := os.Getenv("MESHFOLD_BENCH_PROFILES"); dir != "" {
		const from, span = 10 * time.Second, 20 * time.Second
		base := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_"))
		for i, p := range procs {
			profiled.Go(func() { p.cpuProfileAt(from, span, fmt.Sprintf("%s.%s.cpu.pb.gz", base, names[i])) })
		}
		for i := range pc.N() {
			profiled.Go(func() {
				time.Sleep(from)
				path := fmt.Sprintf("%s.server-%s.cpu.pb.gz", base, pc.Name(i))
				prof, err := pc.CPUProfile(i, span)
				if err == nil {
					err = os.WriteFile(path, prof, 0o644)
				}
				if err != nil {
					b.Logf("no CPU profile of server %s: %v", pc.Name(i), err)
				}
			})
		}
	}
	took, cpus := s.waitCaughtUp(b, 30*time.Minute, procs...)
	srv := cpuSince(pc.CPUs(), srv0)
	b.Logf("load average after the catch-up: %s", loadAvg())
	profiled.Wait()

	// What each instance folded: the messages of the partitions it holds
	// (every one of them, from no snapshot), and whether its share moved
	// during the run (each logs the partitions it owns when they change).
	owner := s.leaseOwners(b)
	perPart := s.partitionCounts(b)
	folded := make([]float64, k)
	var moved, restarts, foldedTotal float64
	for i, p := range procs {
		for part, inst := range owner {
			if inst == names[i] {
				folded[i] += float64(perPart[part])
			}
		}
		if owned, _ := p.metric("meshfold_partitions_owned"); int(owned) != s.cfg.Partitions/k {
			b.Logf("instance %s holds %v partitions at the end, not %d", names[i], owned, s.cfg.Partitions/k)
		}
		r, _ := p.metric("meshfold_partition_restarts_total")
		f, _ := p.metric("meshfold_events_folded_total")
		restarts, foldedTotal = restarts+r, foldedTotal+f
		data, _ := os.ReadFile(p.log)
		moved += float64(max(0, strings.Count(string(data), `msg="partitions owned"`)-1))
	}
	var rusage time.Duration
	for _, p := range procs {
		rusage += p.stop()
	}
	published := s.lastSeq(b) - before
	if published != 0 {
		b.Errorf("the effects were stored, yet the fold published %d messages", published)
	}

	n := float64(s.msgs)
	rate := n / took.Seconds()
	std.report(b, "raw", "ratio", rate)
	b.ReportMetric(n, "events")
	b.ReportMetric(rate, "fold-events/s")
	var sum time.Duration
	for i, c := range cpus {
		sum += c
		b.ReportMetric(float64(c.Nanoseconds())/folded[i], names[i]+"-cpu-ns/folded-event")
		b.ReportMetric(folded[i], names[i]+"-events")
	}
	// The instances' CPU summed, over every message (comparable with the
	// raw reader's raw-cpu-ns/event), and their whole CPU (rusage at exit:
	// start, the fold, the last snapshot).
	b.ReportMetric(float64(sum.Nanoseconds())/n, "fold-cpu-ns/event")
	b.ReportMetric(float64(rusage.Nanoseconds())/n, "fold-rusage-cpu-ns/event")
	var srvSum, rawSum time.Duration
	for i := range srv {
		srvSum, rawSum = srvSum+srv[i], rawSum+rawSrv[i]
		b.ReportMetric(float64(srv[i].Nanoseconds())/n, "fold-server-"+pc.Name(i)+"-cpu-ns/event")
		b.ReportMetric(float64(rawSrv[i].Nanoseconds())/n/2, "raw-server-"+pc.Name(i)+"-cpu-ns/event")
	}
	b.ReportMetric(float64(srvSum.Nanoseconds())/n, "fold-servers-cpu-ns/event")
	b.ReportMetric(float64(rawSum.Nanoseconds())/n/2, "raw-servers-cpu-ns/event")
	b.ReportMetric(restarts, "partition-restarts")
	b.ReportMetric(moved, "ownership-changes")
	b.ReportMetric(foldedTotal/n, "folded-total/event")
	b.ReportMetric(float64(published), "published")
	b.Logf("%d instances on %d servers: %.0f events in %s, %.0f events/s, %.3f of the raw read's %.0f events/s; partition restarts %.0f, ownership changes %.0f",
		k, pc.N(), n, took.Round(time.Millisecond), rate, rate/std.rate, std.rate, restarts, moved)
}

// openBuckets creates the buckets every reconcile process opens at its
// start (the node leases, the sealed secrets, the fill statuses) as the
// first instance of a deployment did long before a catch-up: on a loaded
// cluster, four instances creating the same R3 buckets at once took
// 12 s and more to start, and one still had not after 19 s, when its
// pre-joined membership expired and the others took its partitions.
func (s *outsideServer) openBuckets(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := store.OpenNodeLeases(ctx, s.js, s.cfg); err != nil {
		tb.Fatal(err)
	}
	if _, err := store.OpenSecrets(ctx, s.js, s.cfg, true); err != nil {
		tb.Fatal(err)
	}
	if _, err := store.OpenFillStatus(ctx, s.js, s.cfg, true); err != nil {
		tb.Fatal(err)
	}
}

// cpuSince is now − then, element by element.
func cpuSince(now, then []time.Duration) []time.Duration {
	out := make([]time.Duration, len(now))
	for i := range now {
		out[i] = now[i] - then[i]
	}
	return out
}

// loadAvg is the machine's load average, the first three fields of
// /proc/loadavg (1, 5 and 15 minutes), or why not.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error()
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return strings.TrimSpace(string(data))
	}
	return strings.Join(f[:3], " ")
}

// leaseOwners is, per partition, the instance holding its lease in s's
// lease bucket (lease.<partition>, a JSON value naming the instance).
func (s *outsideServer) leaseOwners(tb testing.TB) map[int]string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := s.js.KeyValue(ctx, s.cfg.Name+engine.LeaseBucketSuffix)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[int]string{}
	for p := range s.cfg.Partitions {
		e, err := kv.Get(ctx, fmt.Sprintf("lease.%d", p))
		if err != nil {
			tb.Fatalf("lease of partition %d: %v", p, err)
		}
		var l struct{ Instance string }
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			tb.Fatalf("lease of partition %d: %v", p, err)
		}
		out[p] = l.Instance
	}
	return out
}

// partitionCounts is the number of messages each partition of s's
// stream holds (a consumer's pending count over the partition's
// subjects).
func (s *outsideServer) partitionCounts(tb testing.TB) map[int]uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := map[int]uint64{}
	for p := range s.cfg.Partitions {
		c, err := s.js.CreateConsumer(ctx, s.cfg.Name, jetstream.ConsumerConfig{
			FilterSubject: fmt.Sprintf("%d.%s.*.*", p, s.cfg.Prefix), AckPolicy: jetstream.AckNonePolicy,
			MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute})
		if err != nil {
			tb.Fatal(err)
		}
		info := c.CachedInfo()
		out[p] = info.NumPending
		if err := s.js.DeleteConsumer(ctx, s.cfg.Name, info.Name); err != nil {
			tb.Logf("delete the counting consumer of partition %d: %v", p, err)
		}
	}
	return out
}

// cpuProfileAt writes a CPU profile of the process over span, from from
// after its start, to path; it logs why not instead.
func (p *benchProc) cpuProfileAt(from, span time.Duration, path string) {
	time.Sleep(time.Until(p.start.Add(from)))
	if !p.alive() {
		p.tb.Logf("no CPU profile: the process ended")
		return
	}
	prof, err := p.get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(span.Seconds())))
	if err == nil {
		err = os.WriteFile(path, prof, 0o644)
	}
	if err != nil {
		p.tb.Logf("no CPU profile: %v", err)
		return
	}
	p.tb.Logf("CPU profile: %s", path)
}
