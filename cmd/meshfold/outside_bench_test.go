package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The outside benchmarks of issue 17: `meshfold reconcile` processes (the
// binary built from this module) against a separate nats-server process
// (storetest.StartProcServer), each figure beside its raw JetStream
// baseline measured on the same server in the same run. The CPU of each
// process is read from /proc/<pid>/stat, so the server's share and the
// reconciler's are apart; the memory of a reconciler is read from its
// /metrics (go_gc_heap_live_bytes after forced collections) and
// /proc/<pid>/status (VmRSS). docs/architecture.md, "Catch-up speed
// (issue 17)", says how each figure is measured.
//
//	go test ./cmd/meshfold -run '^$' -bench Outside -benchtime 1x -timeout 60m
//
// MESHFOLD_BENCH_PROFILES=DIR also writes the heap profile of each
// loaded reconciler (memory-*) into DIR, sampled every 4 KiB (which
// slows every process of the run a little), and a CPU profile of the
// first 5 s of each one-process catch-up (which the profile slows: do not
// take that run's figures), the server's too. MESHFOLD_BENCH_LOGS=DIR
// keeps every reconcile process's log there. MESHFOLD_BENCH_HEAP=DIR
// writes the heap profiles of the reconciler and the server at the end
// of each one-process catch-up (after the timed part).

// The sizes of issue 17: 10,000 nodes, histories of 1M and 100k events.
const outsideNodes, bigEvents, smallEvents = 10_000, 1_000_000, 100_000

var (
	benchBinOnce sync.Once
	benchBinDir  string
	benchBinErr  error
)

// meshfoldBinary builds this module's meshfold once per test process
// (without the race detector, as shipped) and returns its path;
// removeBenchBinary, from TestMain, removes it.
//
// MESHFOLD_BENCH_BIN=PATH uses the binary at PATH instead (a build of
// another commit, for before-and-after figures of one run's harness).
func meshfoldBinary(tb testing.TB) string {
	tb.Helper()
	if bin := os.Getenv("MESHFOLD_BENCH_BIN"); bin != "" {
		return bin
	}
	benchBinOnce.Do(func() {
		if benchBinDir, benchBinErr = os.MkdirTemp("", "meshfold-bench-bin"); benchBinErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(benchBinDir, "meshfold"), "github.com/meshfold/meshfold/cmd/meshfold").CombinedOutput()
		if err != nil {
			benchBinErr = fmt.Errorf("build meshfold: %v\n%s", err, out)
		}
	})
	if benchBinErr != nil {
		tb.Fatal(benchBinErr)
	}
	return filepath.Join(benchBinDir, "meshfold")
}

func removeBenchBinary() {
	if benchBinDir != "" {
		os.RemoveAll(benchBinDir)
	}
}

// outsideServer is a nats-server process with meshfold's stream (the
// defaults: MESH, 16 partitions), the stream's effect key (so that a
// history sealed with it is recognised as stored) and a signing key file
// every reconciler of the benchmark signs with.
type outsideServer struct {
	srv     benchServer
	js      jetstream.JetStream
	cfg     store.StreamConfig
	key     []byte
	seed    string
	signer  *store.Signer
	snaps   *store.Snapshots
	targets map[int]uint64 // refreshed by refresh
	msgs    int            // the stream's messages, refreshed by refresh
	// heapProfiled makes startProc's processes sample their heap every
	// 4 KiB, with MESHFOLD_BENCH_PROFILES: only memory's, since the
	// sampling costs a catch-up a sixth of its CPU (and its profile).
	heapProfiled bool
	// last is the last catchUp's ratio to the raw read and CPU per event,
	// and its ratio without either side's fixed costs (0: not measured);
	// the server's CPU per event over the refold, and the raw reader's
	// and the server's over the raw read.
	last struct{ ratio, cpuNs, netRatio, netCPU, srvNs, rawNs, rawSrvNs float64 }
	// pairRaw makes catchUp time one raw read (encoding/json) right
	// before its refold, and no faster-decoding one: a pair, both sides
	// single samples a second apart (BenchmarkReconcileScale's refolds).
	// Unset, the raw reads are rawRead's (the better of two of each).
	pairRaw bool
	// quiet makes catchUp report no metric of its own (its caller
	// reports medians over several), only log and fail.
	quiet bool
	// profileSecs, when set, is how long catchUp's CPU profiles last
	// (MESHFOLD_BENCH_PROFILES) instead of profileSeconds: a size's
	// whole refold.
	profileSecs int
	// tag is added to the names of the files catchUp's profiles are
	// written to, so that several refolds of one benchmark keep each its
	// own.
	tag string
	// bin, when set, is the meshfold binary startProc runs instead of
	// meshfoldBinary's (BenchmarkGroupScale's MESHFOLD_BENCH_BINS).
	bin string
}

// benchServer is the server side of an outside benchmark: one
// nats-server process (*storetest.ProcServer) or a cluster of them
// (procCluster).
type benchServer interface {
	// URL is the client URL (a cluster's: every server's, comma
	// separated).
	URL() string
	// CPU is the server processes' CPU time so far, summed.
	CPU() time.Duration
	Connect(testing.TB, ...nats.Option) (*nats.Conn, jetstream.JetStream)
	// Stop kills every server process (by pid) and reaps it.
	Stop()
}

func startOutsideServer(tb testing.TB) *outsideServer {
	tb.Helper()
	return startOutsideOn(tb, storetest.StartProcServer(tb), store.StreamConfig{Partitions: benchPartitions(tb)})
}

// benchPartitions is MESHFOLD_BENCH_PARTITIONS, the partition count of
// the stream an outside benchmark creates on one server; 0 (unset: the
// product's default, 16) when not set.
func benchPartitions(tb testing.TB) int {
	v := os.Getenv("MESHFOLD_BENCH_PARTITIONS")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("MESHFOLD_BENCH_PARTITIONS=%q: want a partition count ≥ 1", v)
	}
	return n
}

// startOutsideOn is startOutsideServer on srv, the stream created with
// want (its zero fields the defaults).
func startOutsideOn(tb testing.TB, srv benchServer, want store.StreamConfig) *outsideServer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := &outsideServer{srv: srv}
	_, s.js = s.srv.Connect(tb)
	var err error
	if _, s.cfg, err = store.EnsureStream(ctx, s.js, want); err != nil {
		tb.Fatal(err)
	}
	if s.key, err = store.EffectKey(ctx, s.js, s.cfg, nil); err != nil {
		tb.Fatal(err)
	}
	s.seed = filepath.Join(tb.TempDir(), "reconciler-signing.nk")
	kp, _, err := store.LoadOrCreateSigningKey(s.seed)
	if err != nil {
		tb.Fatal(err)
	}
	if s.signer, err = store.NewSigner(kp); err != nil {
		tb.Fatal(err)
	}
	if s.snaps, err = store.OpenSnapshots(ctx, s.js, s.cfg); err != nil {
		tb.Fatal(err)
	}
	return s
}

// load publishes h sealed with the server's keys, then refreshes.
func (s *outsideServer) load(tb testing.TB, h *enginetest.History) {
	tb.Helper()
	h.Seal(s.key, s.signer).Load(tb, s.js)
	s.refresh(tb)
}

// refresh reads the stream's message count and each partition's last
// input sequence.
func (s *outsideServer) refresh(tb testing.TB) {
	tb.Helper()
	st, err := s.js.Stream(context.Background(), s.cfg.Name)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	s.msgs = int(info.State.Msgs)
	s.targets = enginetest.InputTargets(tb, s.js, s.cfg)
}

// lastSeq is the stream's last sequence.
func (s *outsideServer) lastSeq(tb testing.TB) uint64 {
	tb.Helper()
	st, err := s.js.Stream(context.Background(), s.cfg.Name)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return info.State.LastSeq
}

// forget deletes the snapshot and lease buckets (a refold from the
// stream's first message, as after an operator deleted the snapshots;
// the effect key lives apart and stays) and opens a new snapshot bucket.
func (s *outsideServer) forget(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	for _, b := range []string{s.cfg.Name + store.SnapshotBucketSuffix, s.cfg.Name + engine.LeaseBucketSuffix} {
		if err := s.js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			tb.Fatal(err)
		}
	}
	var err error
	if s.snaps, err = store.OpenSnapshots(ctx, s.js, s.cfg); err != nil {
		tb.Fatal(err)
	}
}

// raw is a raw baseline's figures: the rate of reading every message of
// the stream, and the CPU per message of the benchmark process (the
// reader) and of the server.
type raw struct {
	rate, cpuNs, serverNs float64
	// waitNs: the time the reader's threads were runnable but waited
	// for a CPU (runDelay), per message.
	waitNs, serverWaitNs float64
	// took is the read's time; first, the part of it before its first
	// message (0 where the read does not say).
	took, first time.Duration
}

// rawRead measures the two raw baselines on s: the issue's, an ordered
// read decoding with encoding/json (enginetest.RawDecodeStd), then one
// decoding as the fold does (enginetest.RawDecode, a faster decoder).
func (s *outsideServer) rawRead(tb testing.TB) (std, fast raw) {
	tb.Helper()
	return s.rawBest(tb, enginetest.RawDecodeStdFirst), s.rawBest(tb, noFirst(enginetest.RawDecode))
}

// rawReadFunc is one raw read of every message of a stream
// (enginetest.RawDecodeStdFirst; RawDecode through noFirst), which sets
// the time to its first message where it can.
type rawReadFunc func(testing.TB, jetstream.JetStream, store.StreamConfig, int, *time.Duration) time.Duration

// noFirst is read as a rawReadFunc that does not note its first message.
func noFirst(read func(testing.TB, jetstream.JetStream, store.StreamConfig, int) time.Duration) rawReadFunc {
	return func(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int, _ *time.Duration) time.Duration {
		return read(tb, js, cfg, want)
	}
}

// rawOne measures one raw read of s's stream by read.
func (s *outsideServer) rawOne(tb testing.TB, read rawReadFunc) raw {
	tb.Helper()
	runtime.GC()
	self0, srv0, wait0, swait0 := selfCPU(tb), s.srv.CPU(), runDelay(os.Getpid()), s.serverRunDelay()
	var first time.Duration
	took := read(tb, s.js, s.cfg, s.msgs, &first)
	self, srv, wait, swait := selfCPU(tb)-self0, s.srv.CPU()-srv0, runDelay(os.Getpid())-wait0, s.serverRunDelay()-swait0
	n := float64(s.msgs)
	return raw{rate: n / took.Seconds(), cpuNs: float64(self.Nanoseconds()) / n, serverNs: float64(srv.Nanoseconds()) / n,
		waitNs: float64(wait.Nanoseconds()) / n, serverWaitNs: float64(swait.Nanoseconds()) / n, took: took, first: first}
}

// rawBest is the better of two rawOne reads: one read alone was now and
// then disturbed (a rate a third of the next part's), which made a ratio
// of 2.4; the better one is also the stricter baseline.
func (s *outsideServer) rawBest(tb testing.TB, read rawReadFunc) raw {
	tb.Helper()
	a, b := s.rawOne(tb, read), s.rawOne(tb, read)
	if b.rate > a.rate {
		return b
	}
	return a
}

// report reports r's figures, the names prefixed with prefix (raw,
// rawfast), and the ratio of fold (events/s) to its rate as ratio.
func (r raw) report(b *testing.B, prefix, ratio string, fold float64) {
	b.ReportMetric(r.rate, prefix+"-events/s")
	b.ReportMetric(r.cpuNs, prefix+"-cpu-ns/event")
	b.ReportMetric(r.serverNs, prefix+"-server-cpu-ns/event")
	b.ReportMetric(r.waitNs, prefix+"-runq-ns/event")
	b.ReportMetric(r.serverWaitNs, prefix+"-server-runq-ns/event")
	b.ReportMetric(fold/r.rate, ratio)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// countAPI counts the JetStream API requests made on s's server (seen
// by a subscription of this process), by their subject's kind (its
// tokens past $JS.API, up to the stream's or bucket's name; a get's
// filter, its partition left out, after a space), until the func it
// returns is called, which returns the counts.
// MESHFOLD_BENCH_API_LOG=1 logs them after each catch-up.
func (s *outsideServer) countAPI(tb testing.TB) func() map[string]int {
	var mu sync.Mutex
	counts := map[string]int{}
	sub, err := s.js.Conn().Subscribe("$JS.API.>", func(m *nats.Msg) {
		t := strings.Split(m.Subject, ".")
		get := len(t) > 5 && t[2] == "STREAM" && t[3] == "MSG"
		if n := 5 + b2i(get); len(t) > n {
			t = t[:n]
		}
		k := strings.Join(t[2:], ".")
		if get {
			// A get's filter, its partition number left out.
			var req struct {
				Subj string `json:"last_by_subj"`
			}
			_ = json.Unmarshal(m.Data, &req)
			if _, rest, ok := strings.Cut(req.Subj, "."); ok {
				k += " " + rest
			}
		}
		mu.Lock()
		counts[k]++
		mu.Unlock()
	})
	if err != nil {
		tb.Fatal(err)
	}
	return func() map[string]int {
		_ = s.js.Conn().Flush()
		_ = sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(counts)
	}
}

// serverRunDelay is runDelay of s's server; 0 for a cluster.
func (s *outsideServer) serverRunDelay() time.Duration {
	if srv, ok := s.srv.(*storetest.ProcServer); ok {
		return runDelay(srv.Pid())
	}
	return 0
}

// runDelay is the time pid's live threads have spent runnable but
// waiting for a CPU (the kernel's run queue: the second field of
// /proc/<pid>/task/*/schedstat); 0 where the kernel does not say.
// Against CPU time it says how much of a process's wall time the rest
// of the machine took from it.
func runDelay(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			sum += n
		}
	}
	return time.Duration(sum)
}

func selfCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchProc is a `meshfold reconcile` process of a benchmark, in its
// own process group, its output in a log file; its metrics (and pprof)
// listener on a loopback port.
type benchProc struct {
	tb      testing.TB
	cmd     *exec.Cmd
	log     string
	metrics string
	start   time.Time
	exited  chan struct{}
	werr    error
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	return storetest.FreeAddr(tb)
}

// startProc starts `meshfold reconcile` against s with s's signing key, a
// 20 ms snapshot interval (the end of a catch-up is seen through the
// checkpoints) and --metrics with --pprof; extra flags follow.
func (s *outsideServer) startProc(tb testing.TB, extra ...string) *benchProc {
	tb.Helper()
	p := &benchProc{tb: tb, log: filepath.Join(tb.TempDir(), "reconcile.log"), metrics: freeAddr(tb), exited: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"reconcile", "--server", s.srv.URL(), "--signing-key", s.seed,
		"--snapshot-interval", "20ms", "--metrics", p.metrics, "--pprof"}, extra...)
	bin := s.bin
	if bin == "" {
		bin = meshfoldBinary(tb)
	}
	p.cmd = exec.Command(bin, args...)
	if s.heapProfiled && os.Getenv("MESHFOLD_BENCH_PROFILES") != "" {
		// A heap profile that samples every 4 KiB rather than 512 KiB:
		// a state is a few KiB.
		p.cmd.Env = append(os.Environ(), "GODEBUG=memprofilerate=4096")
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.start = time.Now()
	if err := testproc.StartChild(p.cmd); err != nil {
		tb.Fatal(err)
	}
	go func() { p.werr = p.cmd.Wait(); close(p.exited) }()
	tb.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		if dir := os.Getenv("MESHFOLD_BENCH_LOGS"); dir != "" {
			keepLog(tb, p.log, filepath.Join(dir, fmt.Sprintf("%s.%d.log", strings.ReplaceAll(tb.Name(), "/", "_"), p.cmd.Process.Pid)))
		}
	})
	return p
}

// startUp is the time from the process's start to the last of its
// partitions' first session starts up to until after its start, as its
// debug log stamps them (to the millisecond), whether it logged any, and
// the log lines of the sessions that ended before until, each with its
// error (the engine's "partition session ended; restarting from its
// snapshot" warning, or a lease lost): a restart mid-refold is not
// start-up, and an earlier build's figure counted up to it. A session
// that fails before its first start line is logged (its snapshot read,
// say) is among them too.
func (p *benchProc) startUp(until time.Duration) (d time.Duration, ok bool, ended []string) {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return 0, false, nil
	}
	first := map[string]time.Time{}
	for line := range strings.SplitSeq(string(data), "\n") {
		end := strings.Contains(line, `msg="partition session ended`) || strings.Contains(line, `msg="partition lease lost`)
		if !end && !strings.Contains(line, `msg="partition session"`) {
			continue
		}
		v, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || t.Sub(p.start) > until {
			continue
		}
		if end {
			ended = append(ended, line)
			continue
		}
		_, rest, _ := strings.Cut(line, " partition=")
		part, _, _ := strings.Cut(rest, " ")
		if f, seen := first[part]; !seen || t.Before(f) {
			first[part] = t
		}
	}
	var last time.Time
	for _, t := range first {
		if t.After(last) {
			last = t
		}
	}
	if last.IsZero() {
		return 0, false, ended
	}
	return last.Sub(p.start), true, ended
}

// phases is the times from p's start, as its debug log stamps them (to
// the millisecond), of its "reconciler running" line (exec, package
// init, the connection and the serve's checks) and of the last
// partition's "partition refolded and checkpointed" (a recovery's end,
// its final checkpoint written); 0 for one not logged.
func (p *benchProc) phases() (running, refolded time.Duration) {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		isRun := strings.Contains(line, `msg="reconciler running"`)
		if !isRun && !strings.Contains(line, `msg="partition refolded and checkpointed"`) {
			continue
		}
		v, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			continue
		}
		if d := t.Sub(p.start); isRun && running == 0 {
			running = d
		} else if !isRun && d > refolded {
			refolded = d
		}
	}
	return running, refolded
}

// keepLog copies a process's log from to to (MESHFOLD_BENCH_LOGS=DIR
// keeps every benchmark process's log there); it logs why not instead.
func keepLog(tb testing.TB, from, to string) {
	data, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, data, 0o644)
	}
	if err != nil {
		tb.Logf("log not kept: %v", err)
	}
}

func (p *benchProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// fail ends the benchmark with what the process logged last.
func (p *benchProc) fail(format string, args ...any) {
	p.tb.Helper()
	data, _ := os.ReadFile(p.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	p.tb.Fatalf("meshfold reconcile (pid %d): %s; its log ends:\n%s", p.cmd.Process.Pid, fmt.Sprintf(format, args...), data)
}

// cpu is the process's CPU time so far (it must be running).
func (p *benchProc) cpu() time.Duration {
	p.tb.Helper()
	d, err := storetest.ProcCPU(p.cmd.Process.Pid)
	if err != nil {
		p.fail("%v", err)
	}
	return d
}

// rss is the process's resident set size, VmRSS of /proc/<pid>/status.
func (p *benchProc) rss() float64 {
	p.tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.fail("%v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				p.fail("VmRSS %q", v)
			}
			return kb * 1024
		}
	}
	p.fail("no VmRSS in /proc/%d/status", p.cmd.Process.Pid)
	return 0
}

// get fetches path from the process's metrics listener.
func (p *benchProc) get(path string) ([]byte, error) {
	// Past a profile's or trace's length (cpuProfileFor's may last a
	// minute: a 100,000-node refold's).
	hc := &http.Client{Timeout: 30*time.Second + time.Duration(max(profileSeconds(), 60))*time.Second}
	resp, err := hc.Get("http://" + p.metrics + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return body, err
}

// metric returns the sum of the samples of the named metric on /metrics
// (every label set), and whether there was one.
func (p *benchProc) metric(name string) (float64, bool) {
	body, err := p.get("/metrics")
	if err != nil {
		return 0, false
	}
	var sum float64
	found := false
	for line := range strings.SplitSeq(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// metricWhere is [benchProc.metric] summed over the label sets whose
// line holds any of labels (`kind="plan"`).
func (p *benchProc) metricWhere(name string, labels ...string) (float64, bool) {
	body, err := p.get("/metrics")
	if err != nil {
		return 0, false
	}
	var sum float64
	found := false
	for line := range strings.SplitSeq(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok || !slices.ContainsFunc(labels, func(l string) bool { return strings.Contains(rest, l) }) {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// waitMetric polls the process's metrics until cond holds of name's
// value (up to a minute).
func (p *benchProc) waitMetric(name string, cond func(float64) bool) float64 {
	p.tb.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		if v, ok := p.metric(name); ok && cond(v) {
			return v
		}
		if !p.alive() {
			p.fail("exited (%v) before %s was reached", p.werr, name)
		}
		if time.Now().After(deadline) {
			v, _ := p.metric(name)
			p.fail("%s is %v after a minute", name, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// heap forces collections (the heap profile's gc=1, twice: the strings
// interned by package unique go a cycle later) and returns the live heap
// the last one marked, go_gc_heap_live_bytes. With
// MESHFOLD_BENCH_PROFILES set, the last profile is written there as
// <name>.heap.pb.gz.
func (p *benchProc) heap(name string) float64 {
	p.tb.Helper()
	var prof []byte
	for range 3 {
		var err error
		if prof, err = p.get("/debug/pprof/heap?gc=1"); err != nil {
			p.fail("%v", err)
		}
	}
	if dir := os.Getenv("MESHFOLD_BENCH_PROFILES"); dir != "" && name != "" {
		path := filepath.Join(dir, name+".heap.pb.gz")
		if err := os.WriteFile(path, prof, 0o644); err != nil {
			p.tb.Fatal(err)
		}
		p.tb.Logf("heap profile of %s: %s", name, path)
	}
	v, ok := p.metric("go_gc_heap_live_bytes")
	if !ok {
		p.fail("no go_gc_heap_live_bytes on /metrics")
	}
	return v
}

// cpuProfile writes a CPU profile of the process's first
// MESHFOLD_BENCH_PROFILE_SECONDS (default 5; from the moment its metrics
// listener answers) to path; it logs why not instead.
func (p *benchProc) cpuProfile(path string) { p.cpuProfileFor(path, profileSeconds()) }

// cpuProfileFor is cpuProfile over secs seconds.
func (p *benchProc) cpuProfileFor(path string, secs int) {
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := p.get("/metrics"); err == nil {
			break
		}
		if time.Now().After(deadline) || !p.alive() {
			p.tb.Logf("no CPU profile: the metrics listener did not answer")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	prof, err := p.get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs))
	if err == nil {
		err = os.WriteFile(path, prof, 0o644)
	}
	if err != nil {
		p.tb.Logf("no CPU profile: %v", err)
		return
	}
	p.tb.Logf("CPU profile: %s", path)
}

// trace writes a Go execution trace of the process's first
// MESHFOLD_BENCH_PROFILE_SECONDS (default 5; from the moment its metrics
// listener answers) to path, for `go tool trace` (where it waits: the
// goroutines' blocking profiles); it logs why not instead.
func (p *benchProc) trace(path string) {
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := p.get("/metrics"); err == nil {
			break
		}
		if time.Now().After(deadline) || !p.alive() {
			p.tb.Logf("no trace: the metrics listener did not answer")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.tb.Logf("trace: metrics answered %s after the process started", time.Since(p.start))
	tr, err := p.get(fmt.Sprintf("/debug/pprof/trace?seconds=%d", profileSeconds()))
	if err == nil {
		err = os.WriteFile(path, tr, 0o644)
	}
	if err != nil {
		p.tb.Logf("no trace: %v", err)
		return
	}
	p.tb.Logf("trace: %s", path)
}

// freeHeap is the heap the runtime holds free and has not returned to
// the system (go_memstats_heap_idle_bytes − …_heap_released_bytes): part
// of the RSS that no live object uses.
func (p *benchProc) freeHeap() float64 {
	p.tb.Helper()
	idle, ok1 := p.metric("go_memstats_heap_idle_bytes")
	released, ok2 := p.metric("go_memstats_heap_released_bytes")
	if !ok1 || !ok2 {
		p.fail("no go_memstats_heap_idle_bytes or _released_bytes on /metrics")
	}
	return idle - released
}

// logMemory logs the Go runtime's account of the process's memory
// beside its RSS (go_memstats_*, MiB): where RSS goes that no live object
// holds (free heap kept, fragmentation within spans, stacks, the
// runtime's own structures) and the next collection's goal.
func (p *benchProc) logMemory(name string) {
	p.tb.Helper()
	var parts []string
	for _, m := range []string{"heap_alloc", "heap_inuse", "heap_idle", "heap_released", "next_gc", "stack_inuse", "mspan_inuse", "gc_sys", "other_sys", "sys"} {
		v, _ := p.metric("go_memstats_" + m + "_bytes")
		parts = append(parts, fmt.Sprintf("%s %.1f", m, v/(1<<20)))
	}
	p.tb.Logf("%s: rss %.1f MiB; go_memstats MiB: %s", name, p.rss()/(1<<20), strings.Join(parts, ", "))
	// The same read right after a collection, in one request: the heap
	// profile's runtime.MemStats.
	body, err := p.get("/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		p.fail("%v", err)
	}
	parts = parts[:0]
	for line := range strings.SplitSeq(string(body), "\n") {
		for _, f := range []string{"HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "NextGC", "HeapObjects"} {
			if v, ok := strings.CutPrefix(line, "# "+f+" = "); ok {
				n, _ := strconv.ParseFloat(v, 64)
				if f != "HeapObjects" {
					n /= 1 << 20
				}
				parts = append(parts, fmt.Sprintf("%s %.1f", f, n))
			}
		}
	}
	p.tb.Logf("%s: after a collection (MiB): %s; rss %.1f MiB", name, strings.Join(parts, ", "), p.rss()/(1<<20))
}

// stop sends SIGTERM, waits for the exit (up to a minute) and returns the
// process's whole CPU time (its rusage). A non-zero exit fails tb.
func (p *benchProc) stop() time.Duration {
	p.tb.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && p.alive() {
		p.fail("SIGTERM: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.fail("still running a minute after SIGTERM")
	}
	if p.werr != nil {
		p.fail("exit: %v", p.werr)
	}
	st := p.cmd.ProcessState
	return st.UserTime() + st.SystemTime()
}

// waitCaughtUp waits (polling every 5 ms, up to timeout) until every
// partition's checkpoint in s's snapshot bucket reaches s.targets, as
// engine's benchmarks see the end of a catch-up, and returns the time
// since any process of procs started (the earliest) and the CPU time of
// each process at that moment.
func (s *outsideServer) waitCaughtUp(tb testing.TB, timeout time.Duration, procs ...*benchProc) (time.Duration, []time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for part, want := range s.targets {
		for {
			ck, err := s.snaps.Checkpoint(context.Background(), part)
			if err != nil {
				tb.Fatal(err)
			}
			if ck >= want {
				if os.Getenv("MESHFOLD_BENCH_TRACE") != "" {
					tb.Logf("partition %d checkpointed at #%d %s after the process started", part, ck, time.Since(procs[0].start))
				}
				break
			}
			for _, p := range procs {
				if !p.alive() {
					p.fail("exited (%v) before partition %d's checkpoint reached #%d (at #%d)", p.werr, part, want, ck)
				}
			}
			if time.Now().After(deadline) {
				procs[0].fail("partition %d's checkpoint at #%d after %s, want #%d", part, ck, timeout, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	start := procs[0].start
	for _, p := range procs[1:] {
		if p.start.Before(start) {
			start = p.start
		}
	}
	took := time.Since(start)
	cpus := make([]time.Duration, len(procs))
	for i, p := range procs {
		cpus[i] = p.cpu()
	}
	return took, cpus
}

// catchUp is figures 1 and 2: the raw baseline on s, then k reconcile
// processes (k > 1: one group, members pre-joined so that each acquires
// its share at once) folding s's stream from no snapshot until every
// partition's checkpoint reaches its last input, with the processes' and
// the server's CPU over that time; then SIGTERM to each. The stream must
// hold nothing a fold would publish when stored (it is checked). It
// returns the fold's rate (events/s) and leaves its ratio to the raw read
// (encoding/json) and the processes' CPU per event in s.last.
func (s *outsideServer) catchUp(b *testing.B, k int, stored bool) (foldRate float64) {
	b.Helper()
	metric := b.ReportMetric
	if s.quiet {
		metric = func(float64, string) {}
	}
	var std, fast raw
	if s.pairRaw {
		std = s.rawOne(b, enginetest.RawDecodeStdFirst)
	} else {
		std, fast = s.rawRead(b)
	}
	s.forget(b)
	var names []string
	if k > 1 {
		const ttl = 5 * time.Second
		for i := range k {
			names = append(names, fmt.Sprintf("i%d", i))
		}
		preJoin(b, s.js, s.cfg, ttl, names)
	}
	before := s.lastSeq(b)
	apiCounts := s.countAPI(b)
	runtime.GC()
	srv0, swait0 := s.srv.CPU(), s.serverRunDelay()
	var procs []*benchProc
	if k == 1 {
		// At debug level the process logs each partition's session
		// start (its states read, before its consumer): the end of its
		// start-up, read by startUp. Nothing is logged per event.
		procs = append(procs, s.startProc(b, "--log-level", "debug"))
	}
	for _, name := range names {
		procs = append(procs, s.startProc(b, "--group", "bench", "--instance", name, "--lease-ttl", "5s"))
	}
	var profiled chan struct{}
	if dir := os.Getenv("MESHFOLD_BENCH_PROFILES"); dir != "" && k == 1 {
		profiled = make(chan struct{})
		name := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_")+s.tag)
		var wg sync.WaitGroup
		secs := profileSeconds()
		if s.profileSecs > 0 {
			secs = s.profileSecs
		}
		wg.Go(func() { procs[0].cpuProfileFor(name+".cpu.pb.gz", secs) })
		wg.Go(func() { s.serverProfileFor(b, name+".server.cpu.pb.gz", time.Duration(secs)*time.Second) })
		go func() { wg.Wait(); close(profiled) }()
	}
	if dir := os.Getenv("MESHFOLD_BENCH_TRACE"); dir != "" && k == 1 && profiled == nil {
		profiled = make(chan struct{})
		name := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_")+s.tag)
		go func() { procs[0].trace(name + ".trace"); close(profiled) }()
	}
	took, cpus := s.waitCaughtUp(b, 20*time.Minute, procs...)
	if profiled != nil {
		<-profiled
	}
	if dir := os.Getenv("MESHFOLD_BENCH_HEAP"); dir != "" && k == 1 {
		s.heapProfiles(b, procs[0], filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_")+s.tag))
	}
	srv, swait := s.srv.CPU()-srv0, s.serverRunDelay()-swait0
	api := apiCounts()
	for _, p := range procs {
		if owned, _ := p.metric("meshfold_partitions_owned"); int(owned) != s.cfg.Partitions/k {
			p.fail("folded %v partitions, want %d: a partition was handed over", owned, s.cfg.Partitions/k)
		}
	}
	var runq time.Duration
	for _, p := range procs {
		runq += runDelay(p.cmd.Process.Pid)
	}
	var rusage time.Duration
	for _, p := range procs {
		rusage += p.stop()
	}
	var sum time.Duration
	for _, c := range cpus {
		sum += c
	}
	n := float64(s.msgs)
	published := s.lastSeq(b) - before
	if stored && published != 0 {
		b.Errorf("the effects were stored, yet the fold published %d messages", published)
	}
	if !s.quiet {
		std.report(b, "raw", "ratio", n/took.Seconds())
		if !s.pairRaw {
			fast.report(b, "rawfast", "ratio-fast", n/took.Seconds())
		}
	}
	metric(n, "events")
	metric(n/took.Seconds(), "fold-events/s")
	metric(float64(sum.Nanoseconds())/n, "fold-cpu-ns/event")
	// The processes' whole CPU (their rusage at exit: start, the fold,
	// the last snapshot) against the raw reader's (this process's rusage
	// over its read): what contention exposes.
	metric(float64(rusage.Nanoseconds())/n, "fold-rusage-cpu-ns/event")
	metric(float64(rusage.Nanoseconds())/n/std.cpuNs, "cpu-ratio")
	if k > 1 {
		metric(float64(sum.Nanoseconds())/n/float64(k), "fold-cpu-ns/event/instance")
	}
	metric(float64(srv.Nanoseconds())/n, "fold-server-cpu-ns/event")
	// The reconcilers' threads' time runnable but waiting for a CPU,
	// from their start (beside raw-runq-ns/event, the reader's).
	metric(float64(runq.Nanoseconds())/n, "fold-runq-ns/event")
	metric(float64(swait.Nanoseconds())/n, "fold-server-runq-ns/event")
	metric(float64(published), "published")
	// What else the fold asked of the server: gets of single messages
	// of the stream (each partition's last message, a fence's), and
	// snapshot puts (up to the processes' exit).
	gets := 0
	for k, n := range api {
		if k == "DIRECT.GET."+s.cfg.Name || strings.HasPrefix(k, "STREAM.MSG.GET."+s.cfg.Name+" ") || k == "STREAM.MSG.GET."+s.cfg.Name {
			gets += n
		}
	}
	metric(float64(gets), "fold-stream-gets")
	metric(float64(s.snapshotPuts(b)), "snapshot-puts")
	if os.Getenv("MESHFOLD_BENCH_API_LOG") != "" {
		b.Logf("API requests by kind: %v", api)
	}
	s.last.ratio, s.last.cpuNs = n/took.Seconds()/std.rate, float64(sum.Nanoseconds())/n
	s.last.netRatio, s.last.netCPU = 0, 0
	s.last.srvNs, s.last.rawNs, s.last.rawSrvNs = float64(srv.Nanoseconds())/n, std.cpuNs, std.serverNs
	if k == 1 {
		// The refold and the raw read without their fixed costs: the
		// process's start-up up to its last partition's session start
		// (exec, connection, stream, buckets and lease checks, each
		// partition's snapshot reads), and the raw read's start up to
		// its first message (its consumers created). What is left grows
		// with the events; at 1,000 nodes the fixed part is a large share
		// of a 0.2–0.4 s refold (docs/architecture.md, "A cold refold's
		// fixed costs").
		up0 := startupCPU(b, s.bin)
		s.last.netCPU = (float64(sum.Nanoseconds()) - float64(up0.Nanoseconds())) / n
		metric(float64(up0.Microseconds())/1000, "startup-cpu-ms")
		metric(s.last.netCPU, "fold-cpu-net-ns/event")
		up, ok, ended := procs[0].startUp(took)
		if s.pairRaw {
			// Where a pair's time went (issue 27, the 1,000-node
			// refold's fixed costs): the raw read and its first
			// message; the refold's process running, its last session
			// start, its last partition's recovery checkpointed (its
			// log), and the bench seeing every checkpoint.
			running, refolded := procs[0].phases()
			b.Logf("pair%s: raw %s (first %s); refold %s: running %s, sessions %s, checkpointed %s; CPU reconciler %s, server %s",
				s.tag, std.took.Round(time.Millisecond), std.first.Round(100*time.Microsecond), took.Round(time.Millisecond),
				running, up, refolded, sum.Round(time.Millisecond), srv.Round(time.Millisecond))
		}
		// Sessions that ended before the refold did, each restarted
		// from its snapshot (or stopped on a lost lease), and why.
		metric(float64(len(ended)), "fold-session-restarts")
		for _, line := range ended {
			b.Logf("session ended mid-refold: %s", line)
		}
		if ok && std.first > 0 && std.first < std.took {
			s.last.netRatio = (std.took - std.first).Seconds() / (took - up).Seconds()
			metric(float64(up.Microseconds())/1000, "fold-startup-ms")
			metric(float64(std.first.Microseconds())/1000, "raw-first-ms")
			metric(s.last.netRatio, "ratio-net")
		}
	}
	return n / took.Seconds()
}

// heapProfiles writes the heap profiles of p and of s's server, as they
// stand (no collection forced), to name.heap.pb.gz and
// name.server.heap.pb.gz; it logs why not instead. Taken after a timed
// part, they cost its figures nothing.
func (s *outsideServer) heapProfiles(tb testing.TB, p *benchProc, name string) {
	srv, ok := s.srv.(*storetest.ProcServer)
	if !ok {
		tb.Logf("no heap profiles: the server is a cluster")
		return
	}
	for _, h := range []struct {
		path string
		get  func() ([]byte, error)
	}{
		{name + ".heap.pb.gz", func() ([]byte, error) { return p.get("/debug/pprof/heap") }},
		{name + ".server.heap.pb.gz", srv.HeapProfile},
	} {
		prof, err := h.get()
		if err == nil {
			err = os.WriteFile(h.path, prof, 0o644)
		}
		if err != nil {
			tb.Logf("no heap profile %s: %v", h.path, err)
		}
	}
}

// serverProfile writes a CPU profile of s's server over the next
// MESHFOLD_BENCH_PROFILE_SECONDS (default 5) to path; it logs why not
// instead.
func (s *outsideServer) serverProfile(tb testing.TB, path string) {
	s.serverProfileFor(tb, path, time.Duration(profileSeconds())*time.Second)
}

// serverProfileFor is serverProfile over the next d.
func (s *outsideServer) serverProfileFor(tb testing.TB, path string, d time.Duration) {
	srv, ok := s.srv.(*storetest.ProcServer)
	if !ok {
		tb.Logf("no server CPU profile: the server is a cluster")
		return
	}
	prof, err := srv.CPUProfile(d)
	if err == nil {
		err = os.WriteFile(path, prof, 0o644)
	}
	if err != nil {
		tb.Logf("no server CPU profile: %v", err)
		return
	}
	tb.Logf("server CPU profile: %s", path)
}

// preJoin puts the member keys of names in the group bench's lease
// bucket (created with ttl) before the members start, so that each sees
// all of them at its first look and acquires only its share (as engine's
// benchmarks do).
func preJoin(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, ttl time.Duration, names []string) {
	tb.Helper()
	ctx := context.Background()
	if _, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "bench", Instance: "probe", TTL: ttl}); err != nil {
		tb.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, cfg.Name+engine.LeaseBucketSuffix)
	if err != nil {
		tb.Fatal(err)
	}
	for _, n := range names {
		if _, err := kv.Put(ctx, "member.bench."+n, []byte(`{"group":"bench","instance":"`+n+`"}`)); err != nil {
			tb.Fatal(err)
		}
	}
}

// startupCPU is the CPU time a reconcile process takes from its start
// until every partition's first load is over, on an empty stream of the
// same configuration (its own server): the process's fixed cost, which
// a refold's CPU per event holds once (measured once per run, bin's).
var startup struct {
	mu  sync.Mutex
	cpu map[string]time.Duration
}

func startupCPU(b *testing.B, bin string) time.Duration {
	b.Helper()
	startup.mu.Lock()
	defer startup.mu.Unlock()
	if d, ok := startup.cpu[bin]; ok {
		return d
	}
	s := startOutsideServer(b)
	defer s.srv.Stop()
	s.bin = bin
	p := s.startProc(b, "--log-level", "debug")
	// The heap's release follows the last partition's first load.
	p.waitMetric("meshfold_heap_releases_total", func(v float64) bool { return v >= 1 })
	d := p.cpu()
	p.stop()
	if startup.cpu == nil {
		startup.cpu = map[string]time.Duration{}
	}
	startup.cpu[bin] = d
	return d
}

// idle is the memory of a reconcile process idle on an empty stream of
// the same configuration (its own server), measured once per run.
var idle struct {
	once            sync.Once
	heap, rss, free float64
}

func idleMemory(b *testing.B) (heap, rss float64) {
	b.Helper()
	idle.once.Do(func() {
		s := startOutsideServer(b)
		p := s.startProc(b)
		p.waitMetric("meshfold_partitions_owned", func(v float64) bool { return int(v) == s.cfg.Partitions })
		idle.heap, idle.rss = p.heap(""), p.rss()
		idle.free = p.freeHeap()
		p.stop()
	})
	return idle.heap, idle.rss
}

// memory is figure 3: a fresh reconcile process loads s's nodes from the
// snapshots the previous fold left and catches up; then its live heap and
// RSS, minus those of an idle process, per node.
func (s *outsideServer) memory(b *testing.B, name string) (heapPerNode float64) {
	b.Helper()
	heapPerNode, _ = s.memoryOf(b, name, outsideNodes)
	return heapPerNode
}

// memoryOf is memory for a stream of nodes nodes; it returns the heap
// and the RSS per node.
func (s *outsideServer) memoryOf(b *testing.B, name string, want int) (heapPerNode, rssPerNode float64) {
	b.Helper()
	s.ensureFolded(b)
	idleHeap, idleRSS := idleMemory(b)
	s.heapProfiled = true
	p := s.startProc(b)
	s.heapProfiled = false
	s.waitCaughtUp(b, 10*time.Minute, p)
	nodes := p.waitMetric("meshfold_nodes", func(v float64) bool { return v >= float64(want) })
	heap, rss := p.heap(name), p.rss()
	free := p.freeHeap()
	p.logMemory(name)
	unsettled, _ := p.metric("meshfold_plans_unsettled")
	p.stop()
	b.ReportMetric(nodes, "nodes")
	heapPerNode, rssPerNode = (heap-idleHeap)/nodes, (rss-idleRSS)/nodes
	b.ReportMetric(heapPerNode, "heap-B/node")
	b.ReportMetric(rssPerNode, "rss-B/node")
	b.ReportMetric((free-idle.free)/nodes, "rss-free-B/node")
	b.ReportMetric(idleHeap, "idle-heap-B")
	b.ReportMetric(idleRSS, "idle-rss-B")
	b.ReportMetric(unsettled/nodes, "unsettled-plans/node")
	return heapPerNode, rssPerNode
}

// ensureFolded folds s's stream once, untimed, unless its snapshots
// already cover it: memory measures a load from snapshots, and run alone
// (-bench Outside/memory-1M) it would otherwise measure a refold.
func (s *outsideServer) ensureFolded(b *testing.B) {
	b.Helper()
	s.refresh(b)
	for part, want := range s.targets {
		ck, err := s.snaps.Checkpoint(context.Background(), part)
		if err != nil {
			b.Fatal(err)
		}
		if ck < want {
			p := s.startProc(b)
			s.waitCaughtUp(b, 10*time.Minute, p)
			p.stop()
			return
		}
	}
}

// recovery is figure 5: tail (haves that cause nothing) is published
// while no reconciler runs, then a reconcile process restarts from the
// snapshots: the time from its start until every partition's checkpoint
// covers the tail (recoveryRun), reported.
func (s *outsideServer) recovery(b *testing.B, tail []*nats.Msg) time.Duration {
	b.Helper()
	r := s.recoveryRun(b, tail)
	b.ReportMetric(float64(r.took.Microseconds())/1000, "restart-ms")
	// The CPU the restart took, the reconciler's and the server's, to
	// the last checkpoint's store: on a shared machine steadier than its
	// time.
	b.ReportMetric(float64(r.cpu.Microseconds())/1000, "restart-cpu-ms")
	b.ReportMetric(float64(r.srvCPU.Microseconds())/1000, "restart-server-cpu-ms")
	if r.startUp > 0 {
		b.ReportMetric(float64(r.startUp.Microseconds())/1000, "restart-startup-ms")
	}
	return r.took
}

// restartRun is one restart's figures (recoveryRun).
type restartRun struct {
	// took is the time from the process's start to the store of the
	// last partition's checkpoint past the tail, as the server stamped
	// it; cpu and srvCPU, the reconciler's and the server's CPU to then.
	took, cpu, srvCPU time.Duration
	// startUp is the time from the process's start to its last
	// partition's session start (its debug log; 0 when not logged): the
	// part of took before any partition's consumer exists.
	startUp time.Duration
}

// recoveryRun publishes tail, then starts a reconcile process on the
// snapshots and returns its restart's figures (restartRun). The end is
// read from a watch of the checkpoint keys alone: polls of the bucket
// while the process restarts would compete with what they measure.
func (s *outsideServer) recoveryRun(b *testing.B, tail []*nats.Msg) restartRun {
	b.Helper()
	// Snapshots must cover the history first (run alone, -bench
	// 'ReconcileScale/restart', the refold before it is skipped).
	s.ensureFolded(b)
	(&enginetest.History{Msgs: tail}).Load(b, s.js)
	s.refresh(b)
	before := s.lastSeq(b)
	var profiled sync.WaitGroup
	dir := os.Getenv("MESHFOLD_BENCH_PROFILES")
	name := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_"))
	if dir != "" {
		// The server's profile covers the restart's first second from
		// just before the process starts: a longer one would take in
		// the pass over every state that follows the checkpoints.
		profiled.Go(func() { s.serverProfileFor(b, name+".server.cpu.pb.gz", time.Second) })
	}
	stamps := s.watchCheckpoints(b)
	// MESHFOLD_BENCH_API_LOG=1 counts the API requests made from the
	// process's start to the last checkpoint, by kind, and logs them:
	// what a restart asks of the server.
	var apiCounts func() map[string]int
	if os.Getenv("MESHFOLD_BENCH_API_LOG") != "" {
		apiCounts = s.countAPI(b)
	}
	srv0 := s.srv.CPU()
	// At debug level the process logs each partition's session start
	// (startUp); nothing is logged per event.
	p := s.startProc(b, "--log-level", "debug")
	samples := sampleCPU(s.srv, p)
	if dir != "" {
		profiled.Go(func() { p.cpuProfile(name + ".cpu.pb.gz") })
	}
	if tdir := os.Getenv("MESHFOLD_BENCH_TRACE"); tdir != "" && dir == "" {
		tname := filepath.Join(tdir, strings.ReplaceAll(b.Name(), "/", "_"))
		profiled.Go(func() { p.trace(fmt.Sprintf("%s.%d.trace", tname, p.cmd.Process.Pid)) })
	}
	at := stamps(b)
	cpuAt := samples(at)
	if apiCounts != nil {
		b.Logf("API requests by kind to the last checkpoint: %v", apiCounts())
	}
	if !p.alive() {
		p.fail("exited (%v) during its restart", p.werr)
	}
	profiled.Wait()
	p.stop()
	if published := s.lastSeq(b) - before; published != 0 {
		b.Errorf("the restart published %d messages, want none", published)
	}
	r := restartRun{took: at.Sub(p.start), cpu: cpuAt.proc, srvCPU: cpuAt.srv - srv0}
	if up, ok, _ := p.startUp(r.took); ok {
		r.startUp = up
	}
	if testing.Verbose() {
		b.Logf("restart timeline: %s", p.timeline())
	}
	return r
}

// timeline is the times from the process's start of its log's first
// lines of each kind (to the millisecond): the metrics listener, the
// reconciler running, each partition's session start and, at debug
// level, each lazy partition's checkpoint past its tail.
func (p *benchProc) timeline() string {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	var out []string
	for line := range strings.SplitSeq(string(data), "\n") {
		v, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		v, rest, _ := strings.Cut(v, " ")
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			continue
		}
		_, msg, _ := strings.Cut(rest, "msg=")
		if len(msg) > 160 {
			msg = msg[:160]
		}
		out = append(out, fmt.Sprintf("\n  %5d ms %s", t.Sub(p.start).Milliseconds(), msg))
	}
	return strings.Join(out, "")
}

// watchCheckpoints watches s's checkpoint keys from now on; the returned
// func waits (up to 30 s) until every partition's checkpoint has reached
// its target (s.targets) and returns when the server stored the last of
// them (the entries' own timestamps): the end of a restart, whatever the
// benchmark's polls were doing then.
func (s *outsideServer) watchCheckpoints(tb testing.TB) func(testing.TB) time.Time {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := s.js.KeyValue(ctx, s.snaps.Bucket())
	if err != nil {
		tb.Fatal(err)
	}
	w, err := kv.Watch(ctx, "checkpoint.>", jetstream.UpdatesOnly())
	if err != nil {
		tb.Fatal(err)
	}
	targets := maps.Clone(s.targets)
	return func(tb testing.TB) time.Time {
		tb.Helper()
		defer cancel()
		defer func() { _ = w.Stop() }()
		var last time.Time
		timeout := time.After(30 * time.Second)
		for len(targets) > 0 {
			select {
			case e := <-w.Updates():
				if e == nil {
					continue
				}
				part, err := strconv.Atoi(strings.TrimPrefix(e.Key(), "checkpoint."))
				if err != nil {
					continue
				}
				seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
				if want, ok := targets[part]; !ok || err != nil || seq < want {
					continue
				}
				delete(targets, part)
				if e.Created().After(last) {
					last = e.Created()
				}
			case <-timeout:
				tb.Fatalf("no checkpoint past the target seen for partitions %v", slices.Sorted(maps.Keys(targets)))
			}
		}
		return last
	}
}

// cpuSample is the server's and a reconcile process's CPU so far at a
// time.
type cpuSample struct {
	at        time.Time
	srv, proc time.Duration
}

// sampleCPU reads srv's and p's CPU every 2 ms (/proc, no request to the
// server) until the returned func is called; that returns the first
// sample at or after at (the last one if none is).
func sampleCPU(srv benchServer, p *benchProc) func(at time.Time) cpuSample {
	var (
		mu   sync.Mutex
		all  []cpuSample
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	pid := p.cmd.Process.Pid
	go func() {
		defer close(done)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			c, err := storetest.ProcCPU(pid)
			if err == nil {
				x := cpuSample{at: time.Now(), srv: srv.CPU(), proc: c}
				mu.Lock()
				all = append(all, x)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func(at time.Time) cpuSample {
		close(stop)
		<-done
		for _, x := range all {
			if !x.at.Before(at) {
				return x
			}
		}
		if len(all) == 0 {
			return cpuSample{at: at}
		}
		return all[len(all)-1]
	}
}

// folded starts a server with a sealed history of events over nodes,
// folds it once with a reconcile process (untimed) so that snapshots
// cover it, and returns the server and the history's tailHaves.
func folded(b *testing.B, events, nodes int) (*outsideServer, []*nats.Msg) {
	b.Helper()
	s := startOutsideServer(b)
	h := enginetest.Simulate(events, nodes)
	s.load(b, h)
	tail := tailHaves(h)
	p := s.startProc(b)
	s.waitCaughtUp(b, 10*time.Minute, p)
	p.stop()
	return s, tail
}

// tailHaves is the haves among the last 4,000 messages of h: a tail that
// repeats what the nodes reported, which a restart folds without
// publishing.
func tailHaves(h *enginetest.History) []*nats.Msg {
	return tailsHaves(h, 1)[0]
}

// tailsHaves is k tails like tailHaves', from k disjoint runs of 4,000
// messages at h's end, the last first: restarts that each name other
// nodes, whose states were stored where the history's fold put them,
// not where the restart before rewrote them.
func tailsHaves(h *enginetest.History, k int) [][]*nats.Msg {
	tails := make([][]*nats.Msg, k)
	for i := range k {
		end := len(h.Msgs) - 4000*i
		tails[i] = (&enginetest.History{Msgs: h.Msgs[end-4000 : end]}).Kinds(events.KindHave).Msgs
	}
	return tails
}

// BenchmarkOutside is issue 17's figures 1, 2, 3 and 5, measured from
// outside. Its parts, in order (each reports its raw baseline or its
// reference beside the figure):
//
//   - recovery-1000nodes-10k, recovery-1000nodes-1M: figure 5 as the
//     issue states it, a restart's time over a tail of haves after 10k
//     and after 1M events of 1,000 nodes, and their ratio.
//
//   - memory-100k, recovery-100k: a 100k-event history of 10,000 nodes,
//     folded once (untimed) to leave snapshots; a fresh process's heap
//     and RSS per node; a restart's time over a tail of haves.
//
//   - catchup-stored: figure 1 with the effects stored, 1M events over
//     10,000 nodes (the history sealed with the stream's keys).
//
//   - recovery-1M (with the ratio to recovery-100k, figure 5) and
//     memory-1M, on the snapshots catchup-stored left.
//
//   - group-1, group-2, group-4: figure 2 on the same stream, its
//     snapshots deleted before each.
//
//   - catchup-unstored: figure 1 with a stream of 1M wants and haves
//     whose effects were never stored (a first refold that publishes
//     the plans).
//
//   - memory-unsettled-6, memory-unsettled-15: 10,000 nodes down (no
//     settle) while 6 or 15 wants each keep coming: the heap is bounded
//     by reconcile.MaxUnsettled plans a node, not by the wants.
//
//     go test ./cmd/meshfold -run '^$' -bench Outside -benchtime 1x -timeout 60m
func BenchmarkOutside(b *testing.B) {
	var heap100k float64
	// Figure 5 as the issue states it, 1,000 nodes: restart after 10k
	// events, then after 1M.
	var recovery10k time.Duration
	for _, events := range []int{10_000, bigEvents} {
		s, tail := folded(b, events, 1_000)
		name := "recovery-1000nodes-10k"
		if events == bigEvents {
			name = "recovery-1000nodes-1M"
		}
		b.Run(name, func(b *testing.B) {
			took := s.recovery(b, tail)
			if events == bigEvents && recovery10k > 0 {
				b.ReportMetric(float64(recovery10k.Microseconds())/1000, "restart-10k-ms")
				b.ReportMetric(took.Seconds()/recovery10k.Seconds(), "ratio")
			} else {
				recovery10k = took
			}
		})
		s.srv.Stop()
	}

	var recovery100k time.Duration
	small, tail := folded(b, smallEvents, outsideNodes)
	{
		b.Run("memory-100k", func(b *testing.B) { heap100k = small.memory(b, "memory-100k") })
		b.Run("recovery-100k", func(b *testing.B) { recovery100k = small.recovery(b, tail) })
	}
	small.srv.Stop()

	big := startOutsideServer(b)
	{
		h := enginetest.Simulate(bigEvents, outsideNodes)
		big.load(b, h)
		tail := tailHaves(h)
		h = nil
		b.Run("catchup-stored", func(b *testing.B) { big.catchUp(b, 1, true) })
		b.Run("recovery-1M", func(b *testing.B) {
			took := big.recovery(b, tail)
			if recovery100k > 0 {
				b.ReportMetric(float64(recovery100k.Microseconds())/1000, "restart-100k-ms")
				b.ReportMetric(took.Seconds()/recovery100k.Seconds(), "ratio")
			}
		})
		b.Run("memory-1M", func(b *testing.B) {
			heap := big.memory(b, "memory-1M")
			if heap100k > 0 {
				// Flat from 100k to 1M events: the figure 3.
				b.ReportMetric(heap/heap100k, "heap-ratio-to-100k")
			}
		})
		for _, k := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("group-%d", k), func(b *testing.B) { big.catchUp(b, k, true) })
		}
	}
	big.srv.Stop()

	b.Run("catchup-unstored", func(b *testing.B) {
		s := startOutsideServer(b)
		s.load(b, enginetest.SimulateInputs(bigEvents, outsideNodes))
		s.catchUp(b, 1, false)
		s.srv.Stop()
	})

	for _, wants := range []int{6, 15} {
		b.Run(fmt.Sprintf("memory-unsettled-%d", wants), func(b *testing.B) {
			s := startOutsideServer(b)
			s.load(b, enginetest.SimulateDown(outsideNodes, wants))
			p := s.startProc(b)
			s.waitCaughtUp(b, 10*time.Minute, p)
			p.stop()
			s.memory(b, fmt.Sprintf("memory-unsettled-%d", wants))
			b.ReportMetric(float64(wants), "wants/node")
			s.srv.Stop()
		})
	}
}
