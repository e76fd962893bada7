package main

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/segmentio/encoding/json"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// chaosScale is the size of TestChaos: MESHFOLD_CHAOS=full (make chaos)
// runs issue 12's figures; make test runs a short version.
type chaosScale struct {
	events, nodes, kills, restarts, malformed, probes int
	full                                              bool
}

func scaleOfChaos() chaosScale {
	if os.Getenv("MESHFOLD_CHAOS") == "full" {
		return chaosScale{events: 50000, nodes: 200, kills: 30, restarts: 10, malformed: 10000, probes: 400, full: true}
	}
	return chaosScale{events: 1500, nodes: 20, kills: 2, restarts: 1, malformed: 500, probes: 60}
}

// TestChaos runs `meshfold serve` as its own process under load from
// nodes that publish with acknowledgements (retrying until acknowledged),
// kills it with SIGKILL (by pid) at random moments, restarts it
// gracefully on its data directory, then floods it with malformed events
// among valid wants while it measures want→plan latency and serve's RSS.
// At the end every effect is stored once, none is missing against a
// clean fold of the stream's inputs, every node's snapshot equals that
// fold, and no acknowledged event is lost.
func TestChaos(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts a serve process: not in -short")
	}
	sc := scaleOfChaos()
	dir := t.TempDir()
	addr := storetest.FreeAddr(t) // held while serve restarts
	serve := func() *meshfoldProcess {
		return startMeshfold(t, "serve", "--data", dir, "--listen", addr, "--snapshot-interval", "200ms", "--log-level", "warn")
	}
	srv := serve()
	var srvMu sync.Mutex // guards srv

	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var stream jetstream.Stream
	var cfg store.StreamConfig
	waitUntil(t, ctx, "the stream", func() bool {
		var err error
		stream, cfg, err = store.OpenStream(ctx, js, store.StreamConfig{})
		return err == nil
	})
	pub := store.NewPublisher(js, cfg.Subjects())

	var mu sync.Mutex
	acked := map[uint64]string{}
	publish := func(node string, p events.Payload) uint64 {
		id := nuid.Next()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		ack, err := pub.AppendRetrying(pctx, node, events.Stamp(p, time.Now()), store.WithMsgID(id))
		if err != nil {
			t.Errorf("append %s %s: %v", node, p.Kind(), err)
			return 0
		}
		mu.Lock()
		acked[ack.Seq] = id
		mu.Unlock()
		return ack.Seq
	}
	node := func(i int) string { return fmt.Sprintf("n%03d", i%sc.nodes) }
	input := func(i int) (string, events.Payload) {
		n := node(i)
		switch i % 10 {
		case 0, 1, 2:
			return n, &events.Want{Modules: []events.WantModule{
				{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
				{Name: "app", Build: "a:" + strconv.Itoa(i%7), RunsAs: "app", Files: []events.File{{Path: "/etc/app/key", Mode: "0600"}}},
				{Name: "db", Build: "d:" + strconv.Itoa(i%3), RunsAs: "db", RequiresApproval: true}}}
		case 3, 4, 5, 6:
			return n, &events.Have{Modules: []events.HaveModule{{Name: "app", Build: "a:" + strconv.Itoa(i%7), State: events.Running, Account: "app"}}}
		case 7, 8:
			return n, &events.Refusal{Module: "app", Path: "/etc/app/key", Reason: events.ReasonNoAccount, Writer: "prov"}
		}
		return n, &events.Approve{Module: "db", Build: "d:" + strconv.Itoa(i%3), By: "ops"}
	}

	// Phase 1: the load, with kills and restarts at random moments.
	rng := rand.New(rand.NewPCG(12, uint64(time.Now().UnixNano())))
	disruptions := make([]bool, 0, sc.kills+sc.restarts) // true: SIGKILL
	for range sc.kills {
		disruptions = append(disruptions, true)
	}
	for range sc.restarts {
		disruptions = append(disruptions, false)
	}
	rng.Shuffle(len(disruptions), func(i, j int) { disruptions[i], disruptions[j] = disruptions[j], disruptions[i] })
	at := map[int]bool{}
	for len(at) < len(disruptions) {
		at[1+rng.IntN(sc.events-1)] = true
	}
	points := slices.Sorted(func(yield func(int) bool) {
		for k := range at {
			if !yield(k) {
				return
			}
		}
	})
	disrupt := func(kill bool) {
		srvMu.Lock()
		defer srvMu.Unlock()
		sig := syscall.SIGTERM
		if kill {
			sig = syscall.SIGKILL
		}
		_ = srv.cmd.Process.Signal(sig) // by pid: the process this test started
		select {
		case <-srv.done:
		case <-time.After(time.Minute):
			t.Fatalf("serve pid %d did not exit on %v", srv.cmd.Process.Pid, sig)
		}
		srv = serve()
	}
	const workers = 4
	var next, done sync.WaitGroup
	work := make(chan int)
	for range workers {
		next.Add(1)
		go func() {
			defer next.Done()
			for i := range work {
				publish(input(i))
			}
		}()
	}
	di := 0
	start := time.Now()
	for i := range sc.events {
		if di < len(points) && i == points[di] {
			done.Add(1)
			go func(kill bool) { defer done.Done(); disrupt(kill) }(disruptions[di])
			di++
		}
		work <- i
	}
	close(work)
	next.Wait()
	done.Wait()
	t.Logf("load: %d events of %d nodes in %s, %d SIGKILLs and %d restarts of serve", sc.events, sc.nodes,
		time.Since(start).Round(time.Millisecond), sc.kills, sc.restarts)

	// Phase 2: a flood of malformed events among good wants, once the
	// reconciler has caught up with the load (a want's plan is there).
	var planMu sync.Mutex
	planAt := map[uint64]time.Time{} // cause → when its plan was seen
	sub, err := nc.Subscribe(cfg.Subjects().Event("*", events.KindPlan), func(m *nats.Msg) {
		now := time.Now()
		var p events.Plan
		if json.Unmarshal(m.Data, &p) == nil {
			planMu.Lock()
			planAt[p.Cause] = now
			planMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// One sentinel want per partition: each partition has folded the load
	// (a refold after the last kill included) once its plan is there.
	sentinels := map[string]uint64{}
	for i := 0; len(sentinels) < cfg.Partitions; i++ {
		n := fmt.Sprintf("sentinel%d", i)
		if p := cfg.Subjects().Partition(n); !slices.ContainsFunc(slices.Collect(maps.Keys(sentinels)), func(o string) bool { return cfg.Subjects().Partition(o) == p }) {
			sentinels[n] = publish(n, &events.Want{Modules: []events.WantModule{}})
		}
	}
	waitUntil(t, ctx, "every partition to catch up with the load", func() bool {
		for n, seq := range sentinels {
			m, err := store.LastMsg(ctx, stream, cfg.Subjects(), n, events.KindPlan)
			if err != nil || m.Event.Payload == nil || m.Event.Payload.(*events.Plan).Cause != seq {
				return false
			}
		}
		return true
	})
	floodStart := time.Now()
	var rss rssMax
	stopRSS := rss.sample(srv.cmd.Process.Pid)
	var flood sync.WaitGroup
	flood.Add(1)
	go func() {
		defer flood.Done()
		for i := range sc.malformed {
			var subject, data string
			switch i % 4 {
			case 0:
				subject, data = fmt.Sprintf("mesh.bad%02d.want", i%50), `{"v":1,"at":`
			case 1:
				subject, data = fmt.Sprintf("mesh.bad%02d.have", i%50), `{"v":1,"at":"2026-12-01T12:00:00Z","modules":[{"name":"X","state":"up"}]}`
			case 2:
				subject, data = fmt.Sprintf("mesh.BAD%d.want", i), `{}`
			default:
				subject, data = fmt.Sprintf("mesh.bad%02d.refusal", i%50), `{"v":1,"at":"2026-12-01T12:00:00Z","module":"m","path":"/`+strings.Repeat("p", 300)+`","reason":"undeclared","plan":0,"writer":"w"}`
			}
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, err := js.Publish(pctx, subject, []byte(data))
			cancel()
			if err != nil {
				t.Errorf("malformed publish: %v", err)
				return
			}
		}
	}()
	sent := map[uint64]time.Time{}
	for j := range sc.probes {
		n := node(j)
		t0 := time.Now()
		seq := publish(n, &events.Want{Modules: []events.WantModule{{Name: "probe", Build: "p:" + strconv.Itoa(j)}}})
		sent[seq] = t0
	}
	flood.Wait()
	floodTook := time.Since(floodStart)
	var lat []time.Duration
	waitUntil(t, ctx, "the probes' plans", func() bool {
		planMu.Lock()
		defer planMu.Unlock()
		lat = lat[:0]
		for seq, t0 := range sent {
			at, ok := planAt[seq]
			if !ok {
				return false
			}
			lat = append(lat, at.Sub(t0))
		}
		return true
	})
	stopRSS()
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100]
	t.Logf("flood: %d malformed events among %d wants in %s: want→plan p50 %s, p99 %s; serve's RSS at most %d MiB",
		sc.malformed, sc.probes, floodTook.Round(time.Millisecond), lat[len(lat)/2].Round(time.Microsecond), p99.Round(time.Microsecond), rss.max.Load()>>20)
	// The bounds are issue 12's, for the full run (make chaos, no race
	// detector, nothing else running); the short run under make test
	// shares two cores with the whole suite and only reports them.
	if sc.full {
		if p99 > time.Second {
			t.Errorf("want→plan p99 %s during the flood, over 1 s", p99)
		}
		if rss.max.Load() > 512<<20 {
			t.Errorf("serve's RSS reached %d MiB, over 512", rss.max.Load()>>20)
		}
	}

	// The checks, once the reconciler has folded and checkpointed
	// everything.
	chaosVerify(t, ctx, js, stream, cfg, acked)
}

// rssMax samples a process's resident set size and keeps the largest.
type rssMax struct{ max atomic.Int64 }

func (r *rssMax) sample(pid int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v, ok := vmRSS(pid); ok {
				for old := r.max.Load(); v > old && !r.max.CompareAndSwap(old, v); old = r.max.Load() {
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// vmRSS reads VmRSS of pid from /proc, in bytes.
func vmRSS(pid int) (int64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// waitUntil waits until cond holds, for as long as ctx's deadline leaves.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	limit := 2 * time.Minute
	if dl, ok := ctx.Deadline(); ok {
		limit = time.Until(dl)
	}
	waitfor.Until(t, limit, what, cond)
}

// chaosVerify reads the whole stream and checks it against a clean fold
// of its inputs: every effect the fold makes is stored exactly once
// (a plan may be missing only when a later plan of its node is stored:
// superseded, never published after it), nothing else is stored, every
// node's snapshot equals the fold, and every acknowledged append is in the
// stream with its message id.
func chaosVerify(t *testing.T, ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cfg store.StreamConfig, acked map[uint64]string) {
	t.Helper()
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	key, err := store.EffectKey(ctx, js, cfg, snaps)
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		seq   uint64
		msgID string
		ev    events.Event
	}
	readAll := func() []stored {
		var out []stored
		cons, err := js.OrderedConsumer(ctx, cfg.Name, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		last, err := store.StreamLastSeq(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		for len(out) == 0 || out[len(out)-1].seq < last {
			batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for m := range batch.Messages() {
				n++
				meta, _ := m.Metadata()
				ev, err := cfg.Subjects().DecodeEvent(m.Subject(), m.Data(), meta.Sequence.Stream, meta.Timestamp)
				if err != nil {
					ev = events.Event{Seq: meta.Sequence.Stream} // a bad subject: no node's
				}
				out = append(out, stored{seq: meta.Sequence.Stream, msgID: m.Headers().Get(jetstream.MsgIDHeader), ev: ev})
			}
			if n == 0 {
				break
			}
		}
		return out
	}
	var msgs []stored
	var states map[string]*reconcile.State
	var want map[string]reconcile.Effect
	for stable := false; !stable; {
		msgs = readAll()
		states, want = map[string]*reconcile.State{}, map[string]reconcile.Effect{}
		for _, m := range msgs {
			if m.ev.Node == "" || m.ev.Node == events.FleetNode || !slices.Contains(events.InputKinds, m.ev.Kind) {
				continue
			}
			st := states[m.ev.Node]
			if st == nil {
				st = reconcile.NewState(m.ev.Node)
				states[m.ev.Node] = st
			}
			for _, e := range st.Fold(m.ev) {
				want[e.ID()] = e
			}
		}
		waitUntil(t, ctx, "the reconciler to checkpoint every node", func() bool {
			for node, st := range states {
				b, _, err := snaps.GetNode(ctx, node)
				if err != nil {
					return false
				}
				got, err := reconcile.UnmarshalState(b)
				if err != nil || got.Seq < st.Seq {
					return false
				}
			}
			return true
		})
		last, _ := store.StreamLastSeq(ctx, stream)
		stable = last == msgs[len(msgs)-1].seq
	}
	got := map[string]int{}
	lastPlan := map[string]uint64{} // node → the newest stored plan's cause
	for _, m := range msgs {
		k := m.ev.Kind
		if m.ev.Node == events.FleetNode || (k != events.KindPlan && k != events.KindKnock && k != events.KindJournal) || m.ev.Node == "" {
			continue
		}
		id, ok := store.EffectIDOf(key, m.msgID)
		if !ok {
			t.Errorf("effect message %d has id %q, not one the reconciler signs", m.seq, m.msgID)
			continue
		}
		got[id]++
		if p, ok := m.ev.Payload.(*events.Plan); ok {
			lastPlan[m.ev.Node] = max(lastPlan[m.ev.Node], p.Cause)
		}
	}
	dups, missing, superseded, unexpected := 0, 0, 0, 0
	for id, n := range got {
		if n > 1 {
			dups++
			t.Errorf("effect %s stored %d times", id, n)
		}
		if _, ok := want[id]; !ok {
			unexpected++
			t.Errorf("effect %s stored, but the fold of the stream does not make it", id)
		}
	}
	for id, e := range want {
		if got[id] > 0 {
			continue
		}
		if e.Kind == events.KindPlan && lastPlan[e.Node] > e.Cause {
			superseded++
			continue
		}
		missing++
		t.Errorf("effect %s lost: the fold makes it, the stream lacks it", id)
	}
	equal := 0
	for node, st := range states {
		b, _, err := snaps.GetNode(ctx, node)
		if err != nil {
			t.Errorf("node %s: no snapshot: %v", node, err)
			continue
		}
		live, err := reconcile.UnmarshalState(b)
		if err != nil {
			t.Errorf("node %s: %v", node, err)
			continue
		}
		// The snapshot may be ahead of the stream read (effects folded
		// since): compare at the same sequence.
		if live.Seq != st.Seq {
			t.Errorf("node %s: snapshot at %d, the fold at %d", node, live.Seq, st.Seq)
			continue
		}
		a, _ := json.Marshal(live)
		b2, _ := json.Marshal(st)
		if string(a) != string(b2) {
			t.Errorf("node %s: snapshot\n%s\nfold of the stream\n%s", node, a, b2)
			continue
		}
		equal++
	}
	bySeq := map[uint64]string{}
	for _, m := range msgs {
		bySeq[m.seq] = m.msgID
	}
	lost := 0
	for seq, id := range acked {
		if bySeq[seq] != id {
			lost++
			t.Errorf("acknowledged append %d (%s) is not in the stream", seq, id)
		}
	}
	t.Logf("checks: %d messages; effects stored %d, duplicates %d, missing %d, superseded plans %d, unexpected %d; states equal %d/%d; acknowledged %d, lost %d",
		len(msgs), len(got), dups, missing, superseded, unexpected, equal, len(states), len(acked), lost)
}
