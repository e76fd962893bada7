package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/encoding/json"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// rig is an embedded server with the stream, and the reconcilers a test
// starts on it.
type rig struct {
	t      *testing.T
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    store.StreamConfig
	pub    *store.Publisher
	// wait bounds each wait for a plan; 0: 20 s.
	wait time.Duration

	mu    sync.Mutex
	acked map[uint64]string // every input append acknowledged: sequence → message id
}

func newRig(t *testing.T, cfg store.StreamConfig) *rig {
	_, _, js, stream, eff := storetest.StartStream(t, cfg)
	return &rig{t: t, js: js, stream: stream, cfg: eff, pub: store.NewPublisher(js, eff.Subjects())}
}

// running is a reconciler started by the rig.
type running struct {
	r      *engine.Reconciler
	cancel context.CancelFunc
	done   chan error
}

// start runs a reconciler; stop it with stop (graceful) or let a fault
// end it (wait).
func (g *rig) start(faults engine.Faults) *running {
	g.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := engine.NewReconciler(ctx, g.js, engine.ReconcilerConfig{Stream: g.cfg, Faults: faults,
		SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(g.t)})
	if err != nil {
		g.t.Fatal(err)
	}
	rn := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rn.done <- r.Run(ctx) }()
	g.t.Cleanup(func() { cancel(); <-rn.done })
	return rn
}

func (rn *running) stop(t *testing.T) {
	t.Helper()
	rn.stopWithin(t, stopWait)
}

// stopWithin is stop bounded by d.
func (rn *running) stopWithin(t *testing.T, d time.Duration) {
	t.Helper()
	rn.cancel()
	select {
	case err := <-rn.done:
		rn.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("graceful stop: %v", err)
		}
	case <-time.After(d):
		t.Fatalf("reconciler did not stop within %v", d)
	}
}

// stopWait bounds a stop, and Run's end (wait): a final snapshot whose
// replicated stream is electing a leader rides the election out
// (electionRideOut, 20 s) before it gives up, which took 27-30 s on a
// loaded 2-core machine. With one replica such a stop rides out none
// (noRideOut): TestUnsavedSnapshots and TestStopAgainstAKilledServer
// bound it by deadStopWait.
const stopWait = time.Minute

// wait returns Run's error, failing the test if it does not end.
func (rn *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-rn.done:
		rn.done <- err
		return err
	case <-time.After(stopWait):
		t.Fatal("reconciler did not end")
		return nil
	}
}

var at0 = time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)

// appendIDs numbers the rig's appends: each carries a message id, so a
// retry after a lost acknowledgement (a cluster changing leaders) is
// stored once.
var appendIDs atomic.Uint64

func (g *rig) append(node string, p events.Payload) uint64 {
	g.t.Helper()
	seq, err := g.tryAppend(context.Background(), node, p, g.t.Logf)
	if err != nil {
		g.t.Fatal(err)
	}
	return seq
}

// tryAppend is append that returns its failure, for a goroutine the test
// starts (which must not call t.Fatal); logf, if not nil, hears each
// retry.
func (g *rig) tryAppend(ctx context.Context, node string, p events.Payload, logf func(string, ...any)) (uint64, error) {
	events.Stamp(p, at0)
	id := fmt.Sprintf("test-%d", appendIDs.Add(1))
	var ack store.Ack
	err := tryRetry(ctx, fmt.Sprintf("append %s %s", node, p.Kind()), logf, func(ctx context.Context) error {
		var err error
		ack, err = g.pub.Append(ctx, node, p, store.WithMsgID(id))
		return err
	})
	if err != nil {
		return 0, err
	}
	g.mu.Lock()
	if g.acked == nil {
		g.acked = map[uint64]string{}
	}
	g.acked[ack.Seq] = id
	g.mu.Unlock()
	return ack.Seq, nil
}

// retry calls f until it succeeds, each attempt bounded by 2 s, for up
// to 20 s: the errors of a cluster electing a leader pass. An invalid
// event or a conflict fails at once.
func retry(t testing.TB, what string, f func(ctx context.Context) error) {
	t.Helper()
	if err := tryRetry(context.Background(), what, t.Logf, f); err != nil {
		t.Fatal(err)
	}
}

// tryRetry is retry that returns its failure instead of failing the test
// (and ends early with ctx); logf, if not nil, hears each retry.
func tryRetry(ctx context.Context, what string, logf func(string, ...any), f func(ctx context.Context) error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := f(actx)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, events.ErrInvalid), errors.Is(err, store.ErrConflict), time.Now().After(deadline), ctx.Err() != nil:
			return fmt.Errorf("%s: %w", what, err)
		}
		if logf != nil {
			logf("%s: %v; retrying", what, err)
		}
		select { // back off before the next attempt
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// eventually waits, up to 20 s, until cond holds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitfor.Until(t, 20*time.Second, what, cond)
}

// planFor waits for node's plan caused by cause and returns its sequence.
func (g *rig) planFor(node string, cause uint64) uint64 {
	g.t.Helper()
	return waitfor.Value(g.t, g.planWait(), fmt.Sprintf("plan of %s caused by %d", node, cause), g.planOf(node, cause))
}

// tryPlanFor is planFor that returns its failure, for a goroutine the
// test starts.
func (g *rig) tryPlanFor(ctx context.Context, node string, cause uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, g.planWait())
	defer cancel()
	return waitfor.Poll(ctx, fmt.Sprintf("plan of %s caused by %d", node, cause), g.planOf(node, cause))
}

func (g *rig) planWait() time.Duration {
	if g.wait == 0 {
		return 20 * time.Second
	}
	return g.wait
}

// planOf looks for node's plan caused by cause (or a later one).
func (g *rig) planOf(node string, cause uint64) func() (uint64, bool) {
	return func() (uint64, bool) {
		m, err := store.LastMsg(context.Background(), g.stream, g.cfg.Subjects(), node, events.KindPlan)
		if err != nil {
			return 0, false
		}
		if p, ok := m.Event.Payload.(*events.Plan); ok && p.Cause >= cause {
			return m.Event.Seq, true
		}
		return 0, false
	}
}

// all reads the whole stream.
func (g *rig) all() []store.Msg {
	g.t.Helper()
	out, err := g.tryAll(context.Background(), g.t.Logf)
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// tryAll is all that returns its failure, for a goroutine the test starts.
func (g *rig) tryAll(ctx context.Context, logf func(string, ...any)) ([]store.Msg, error) {
	var out []store.Msg
	var first, last uint64
	err := tryRetry(ctx, "stream info", logf, func(ctx context.Context) (err error) {
		first, last, err = store.StreamBounds(ctx, g.stream)
		return err
	})
	if err != nil {
		return nil, err
	}
	for seq := max(first, 1); seq <= last; seq++ {
		var raw *jetstream.RawStreamMsg
		err := tryRetry(ctx, fmt.Sprint("get message ", seq), logf, func(ctx context.Context) (err error) {
			raw, err = g.stream.GetMsg(ctx, seq)
			return err
		})
		if err != nil {
			return nil, err
		}
		ev, err := g.cfg.Subjects().DecodeEvent(raw.Subject, raw.Data, raw.Sequence, raw.Time)
		if err != nil {
			continue // a subject naming no node: no one's event
		}
		out = append(out, store.Msg{Event: ev, MsgID: raw.Header.Get(jetstream.MsgIDHeader), Subject: raw.Subject})
	}
	return out, nil
}

// nodeStates answers for node states: a Reconciler, or several.
type nodeStates interface {
	Node(node string) (*reconcile.State, bool)
}

// verify checks DESIGN.md §5.3 on the stream once the live reconciler has
// caught up with it: every effect the pure fold of the stream's input
// events makes is stored exactly once, and nothing else; and the live
// reconciler's state of each node equals that fold.
func (g *rig) verify(live nodeStates) (knocks int) {
	g.t.Helper()
	snaps, err := store.OpenSnapshots(context.Background(), g.js, g.cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	var msgs []store.Msg
	var states map[string]*reconcile.State
	var want map[string]bool
	// The reconciler's own plans are inputs too: fold, wait for the live
	// run to checkpoint past the stream's end (its effects acknowledged),
	// and read again until the stream stops growing.
	for stable := false; !stable; {
		msgs = g.all()
		states, want = map[string]*reconcile.State{}, map[string]bool{}
		for _, m := range msgs {
			if !m.Event.Kind.Input() {
				continue
			}
			st := states[m.Event.Node]
			if st == nil {
				st = reconcile.NewState(m.Event.Node)
				states[m.Event.Node] = st
			}
			for _, e := range st.Fold(m.Event) {
				want[e.ID()] = true
			}
		}
		for node, st := range states {
			p := events.Partition(node, g.cfg.Partitions)
			// The live reconciler's own state, not only the checkpoint:
			// another writer of the partition (a stale owner) may have
			// written that.
			eventually(g.t, "the reconciler to fold and checkpoint "+node+" to the end", func() bool {
				ck, err := snaps.Checkpoint(context.Background(), p)
				liveSt, ok := live.Node(node)
				return err == nil && ck >= st.Seq && ok && liveSt.Seq >= st.Seq
			})
		}
		stable = len(g.all()) == len(msgs)
	}
	// The keys bucket may still be electing a leader after a cluster test
	// restarted a server (a read then times out): read it until it answers.
	var keyErr error
	key := waitfor.Value(g.t, time.Minute, "the effect key", func() ([]byte, bool) {
		k, err := store.EffectKey(context.Background(), g.js, g.cfg, snaps)
		keyErr = err
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse)
		return k, !unanswered
	})
	if keyErr != nil {
		g.t.Fatal(keyErr)
	}
	got := map[string]int{}
	for _, m := range msgs {
		if m.Event.Node == events.FleetNode {
			continue // the fleet journal: no node's fold makes it
		}
		if m.Event.Kind == events.KindPlan || m.Event.Kind == events.KindKnock || m.Event.Kind == events.KindJournal {
			id, ok := store.EffectIDOf(key, m.MsgID)
			if !ok {
				g.t.Errorf("effect message %d has id %q, not one the reconciler signs", m.Event.Seq, m.MsgID)
			}
			got[id]++
			if m.Event.Kind == events.KindKnock {
				knocks++
			}
		}
	}
	for id, n := range got {
		if n != 1 {
			g.t.Errorf("effect %s stored %d times", id, n)
		}
		if !want[id] {
			g.t.Errorf("effect %s stored, but the fold of the stream does not make it", id)
		}
	}
	for id := range want {
		if got[id] == 0 {
			g.t.Errorf("effect %s lost: the fold makes it, the stream lacks it", id)
		}
	}
	for node, st := range states {
		liveSt, ok := live.Node(node)
		if !ok {
			g.t.Errorf("node %s: the reconciler has no state", node)
			continue
		}
		if a, b := mustJSON(g.t, liveSt), mustJSON(g.t, st); a != b {
			g.t.Errorf("node %s: live state\n%s\nfold of the stream\n%s", node, a, b)
		}
	}
	return knocks
}

func mustJSON(t testing.TB, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const creds = "/run/mesh-build-go/broker.creds"

func provOnly() *events.Want {
	return &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}}
}

func provAndBroker() *events.Want {
	return &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "mesh-build-go", Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}},
	}}
}

// incident1 plays DESIGN.md §2 incident 1 for node and returns the
// sequence of the settle that must bring the knock.
func (g *rig) incident1(node string) (settle uint64) {
	g.t.Helper()
	settle, err := g.tryIncident1(context.Background(), node, g.t.Logf)
	if err != nil {
		g.t.Fatal(err)
	}
	return settle
}

// tryIncident1 is incident1 that returns its failure, for a goroutine the
// test starts.
func (g *rig) tryIncident1(ctx context.Context, node string, logf func(string, ...any)) (settle uint64, err error) {
	w1, err := g.tryAppend(ctx, node, provOnly(), logf)
	if err != nil {
		return 0, err
	}
	p1, err := g.tryPlanFor(ctx, node, w1)
	if err != nil {
		return 0, err
	}
	if _, err := g.tryAppend(ctx, node, &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1}, logf); err != nil {
		return 0, err
	}
	if _, err := g.tryAppend(ctx, node, &events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"}, logf); err != nil {
		return 0, err
	}
	w2, err := g.tryAppend(ctx, node, provAndBroker(), logf)
	if err != nil {
		return 0, err
	}
	p2, err := g.tryPlanFor(ctx, node, w2)
	if err != nil {
		return 0, err
	}
	return g.tryAppend(ctx, node, &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p2}, logf)
}

func (g *rig) knocksOf(node string) int {
	g.t.Helper()
	n, err := g.tryKnocksOf(context.Background(), node, g.t.Logf)
	if err != nil {
		g.t.Fatal(err)
	}
	return n
}

// tryKnocksOf is knocksOf that returns its failure, for a goroutine the
// test starts.
func (g *rig) tryKnocksOf(ctx context.Context, node string, logf func(string, ...any)) (int, error) {
	msgs, err := g.tryAll(ctx, logf)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range msgs {
		if m.Event.Node == node && m.Event.Kind == events.KindKnock {
			n++
		}
	}
	return n, nil
}

func TestReconcilerIncident1(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	rn := g.start(engine.Faults{})
	g.incident1("ace")
	eventually(t, "the knock", func() bool { return g.knocksOf("ace") == 1 })
	if k := g.verify(rn.r); k != 1 {
		t.Fatalf("%d knocks, want 1", k)
	}
	st, _ := rn.r.Node("ace")
	if st.LastKnock == nil || len(st.LastKnock.Owed) != 1 || st.LastKnock.Owed[0].Path != creds {
		t.Fatalf("last knock %+v", st.LastKnock)
	}
}

var errCrash = errors.New("crash")

// TestReconcilerCrashPoints crashes the reconciler at each point of the
// loop while it folds the settle that must knock, restarts it, and checks
// that exactly one knock and one plan per cause are stored and the state
// equals the pure fold of the stream (DESIGN.md §5.3).
func TestReconcilerCrashPoints(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"after-fold", "after-publish", "after-checkpoint"} {
		t.Run(point, func(t *testing.T) {
			g := newRig(t, store.StreamConfig{})
			var mu sync.Mutex
			var target uint64 // the settle's sequence, once known
			crashAt := func(p int, seq uint64) error {
				mu.Lock()
				defer mu.Unlock()
				if target != 0 && seq >= target {
					return errCrash
				}
				return nil
			}
			var f engine.Faults
			switch point {
			case "after-fold":
				f.AfterFold = crashAt
			case "after-publish":
				f.AfterPublish = crashAt
			case "after-checkpoint":
				f.AfterCheckpoint = crashAt
			}
			rn := g.start(f)
			p1 := g.planFor("ace", g.append("ace", provOnly()))
			g.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
			g.append("ace", &events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
			p2 := g.planFor("ace", g.append("ace", provAndBroker()))
			mu.Lock()
			target = p2 + 1 // the settle below
			mu.Unlock()
			if s := g.append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p2}); s != p2+1 {
				t.Fatalf("settle at %d, want %d", s, p2+1)
			}
			if err := rn.wait(t); !errors.Is(err, errCrash) {
				t.Fatalf("reconciler ended with %v, want the crash", err)
			}
			rn2 := g.start(engine.Faults{})
			eventually(t, "the knock", func() bool { return g.knocksOf("ace") >= 1 })
			// More events after the restart fold on the recovered state.
			g.append("ace", &events.Filled{Module: "mesh-build-go", Path: creds, Plan: p2, Digest: "d"})
			if k := g.verify(rn2.r); k != 1 {
				t.Fatalf("%d knocks, want 1", k)
			}
		})
	}
}

// TestReconcilerPastDedupWindow refolds effects that were published long
// ago, beyond the dedup window, as a reconciler does that crashed after
// publishing and before its checkpoint: here the snapshot is removed, so
// the whole stream is refolded. Nothing is published twice.
func TestReconcilerPastDedupWindow(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Duplicates: time.Second})
	rn := g.start(engine.Faults{})
	g.incident1("ace")
	eventually(t, "the knock", func() bool { return g.knocksOf("ace") == 1 })
	rn.stop(t)
	// Wait until JetStream has forgotten the ids: a probe published
	// before with one id is stored again once the window has passed.
	probe := func() store.Ack {
		a, err := g.pub.Append(context.Background(), "probe", events.Stamp(&events.Approve{Module: "m", Build: "b", By: "t"}, at0), store.WithMsgID("probe"))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	probe()
	deadline := time.Now().Add(20 * time.Second)
	for probe().Duplicate {
		if time.Now().After(deadline) {
			t.Fatal("the dedup window never passed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Restart from an empty snapshot bucket: everything is refolded.
	kv, err := g.js.KeyValue(context.Background(), g.cfg.Name+store.SnapshotBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(context.Background(), "checkpoint."+fmt.Sprint(events.Partition("ace", g.cfg.Partitions))); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(context.Background(), fmt.Sprintf("node.%d.ace", events.Partition("ace", g.cfg.Partitions))); err != nil {
		t.Fatal(err)
	}
	rn2 := g.start(engine.Faults{})
	if k := g.verify(rn2.r); k != 1 {
		t.Fatalf("%d knocks, want 1", k)
	}
}

// TestReconcilerRefoldAfterSnapshotBucketDeleted: an operator deletes the
// snapshot bucket to force a refold, beyond the dedup window. The refold
// recognises every stored effect (the key of their ids is kept apart from
// the snapshots): no effect is published twice, and nothing is journaled
// as an error (issue 17).
func TestReconcilerRefoldAfterSnapshotBucketDeleted(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Duplicates: time.Second})
	rn := g.start(engine.Faults{})
	for _, n := range []string{"ace", "bob"} {
		g.incident1(n)
	}
	// Plans the node never settles: a refold must not publish the older
	// ones after the newer.
	for i := range 3 {
		w := provAndBroker()
		w.Modules[1].Build = fmt.Sprintf("g:%d", i+2)
		g.planFor("ace", g.append("ace", w))
	}
	eventually(t, "the knocks", func() bool { return g.knocksOf("ace") == 1 && g.knocksOf("bob") == 1 })
	g.verify(rn.r)
	rn.stop(t)
	errorsJournaled := func() int {
		n := 0
		for _, m := range g.all() {
			if j, ok := m.Event.Payload.(*events.Journal); ok && j.Level == events.LevelError {
				n++
			}
		}
		return n
	}
	if n := errorsJournaled(); n != 0 {
		t.Fatalf("%d errors journaled before the refold", n)
	}
	before := len(g.all())
	// Past the dedup window: a probe id is stored again.
	probe := func() store.Ack {
		a, err := g.pub.Append(context.Background(), "probe", events.Stamp(&events.Approve{Module: "m", Build: "b", By: "t"}, at0), store.WithMsgID("probe"))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	probe()
	deadline := time.Now().Add(20 * time.Second)
	for probe().Duplicate {
		if time.Now().After(deadline) {
			t.Fatal("the dedup window never passed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before += 2 // the probes
	if err := g.js.DeleteKeyValue(context.Background(), g.cfg.Name+store.SnapshotBucketSuffix); err != nil {
		t.Fatal(err)
	}
	rn2 := g.start(engine.Faults{})
	g.verify(rn2.r) // waits for the refold to reach the stream's end
	if n := errorsJournaled(); n != 0 {
		t.Errorf("%d errors journaled by the refold", n)
	}
	if after := len(g.all()); after != before {
		t.Errorf("the refold appended %d messages", after-before)
	}
}

// TestReconcilerDuplicateAndConflict: one input published twice with one
// Nats-Msg-Id is stored once; a want with a stale expected sequence gets
// ErrConflict.
func TestReconcilerDuplicateAndConflict(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	ctx := context.Background()
	w := events.Stamp(provOnly(), at0)
	a1, err := g.pub.Append(ctx, "ace", w, store.WithMsgID("ctl-1"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := g.pub.Append(ctx, "ace", w, store.WithMsgID("ctl-1"))
	if err != nil || !a2.Duplicate || a2.Seq != a1.Seq {
		t.Fatalf("second append: %+v %v", a2, err)
	}
	_, err = g.pub.Append(ctx, "ace", w, store.WithExpectLastSubjectSeq(a1.Seq-1))
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale expectation: %v", err)
	}
	rn := g.start(engine.Faults{})
	g.planFor("ace", a1.Seq)
	g.verify(rn.r)
}

// TestReconcilerMalformedBetweenGood: a message that cannot be decoded is
// journaled for its node, counted, and the good ones around it fold.
func TestReconcilerMalformedBetweenGood(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	w1 := g.append("ace", provOnly())
	if _, err := g.js.Publish(context.Background(), "mesh.ace.have", []byte(`{"v":1,"at":`)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.js.Publish(context.Background(), "mesh.NOT-A-NODE.have", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	m := engine.NewMetrics(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := engine.NewReconciler(ctx, g.js, engine.ReconcilerConfig{Stream: g.cfg, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	g.planFor("ace", w1)
	w2 := g.append("ace", provAndBroker())
	g.planFor("ace", w2)
	var journal *events.Journal
	eventually(t, "the journal entry", func() bool {
		jm, err := store.LastMsg(ctx, g.stream, g.cfg.Subjects(), "ace", events.KindJournal)
		if err != nil {
			return false
		}
		journal, _ = jm.Event.Payload.(*events.Journal)
		return journal != nil
	})
	if journal.Level != events.LevelError {
		t.Errorf("journal %+v", journal)
	}
	if got := counter(m.Rejected); got != 1 {
		t.Errorf("rejected = %v, want 1", got)
	}
	eventually(t, "the bad subject counted", func() bool { return counter(m.BadSubject) == 1 })
	g.verify(r)
}

// TestReconcilerGracefulStopAndResume: a reconciler stopped gracefully
// writes its snapshot; events published while none runs are folded by the
// next one, which continues from the snapshot.
func TestReconcilerGracefulStopAndResume(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	rn := g.start(engine.Faults{})
	p1 := g.planFor("ace", g.append("ace", provOnly()))
	g.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
	g.append("ace", &events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
	eventually(t, "the refusal folded", func() bool {
		st, ok := rn.r.Node("ace")
		return ok && len(st.Owed) == 1
	})
	rn.stop(t)
	// Published while no reconciler runs: folded from the snapshot on.
	w2 := g.append("ace", provAndBroker())
	rn2 := g.start(engine.Faults{})
	p2 := g.planFor("ace", w2)
	g.append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p2})
	eventually(t, "the knock", func() bool { return g.knocksOf("ace") == 1 })
	g.verify(rn2.r)
}

// TestReconcilerRandomKills drives several nodes through incident 1 while
// the reconciler is killed at random points of its loop, again and again;
// in the end every effect is stored exactly once and every state equals
// the pure fold (DESIGN.md §5.1, §5.3).
func TestReconcilerRandomKills(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	nodes := []string{"ace", "shanks", "novox", "luffy"}
	errs := g.play(nodes, killRounds)
	finished := make(chan struct{})
	var failed []error
	go func() {
		for err := range errs {
			failed = append(failed, err)
		}
		close(finished)
	}()

	kills := 0
	for done := false; !done; {
		var mu sync.Mutex
		countdown := 1 + rng.IntN(5)
		hook := func(int, uint64) error {
			mu.Lock()
			defer mu.Unlock()
			countdown--
			if countdown == 0 {
				return errCrash
			}
			return nil
		}
		var f engine.Faults
		switch rng.IntN(3) {
		case 0:
			f.AfterFold = hook
		case 1:
			f.AfterPublish = hook
		case 2:
			f.AfterCheckpoint = hook
		}
		rn := g.start(f)
		select {
		case err := <-rn.done:
			rn.done <- err
			if !errors.Is(err, errCrash) {
				t.Fatalf("reconciler ended with %v", err)
			}
			kills++
		case <-finished:
			rn.cancel()
			if err := rn.wait(t); err != nil && !errors.Is(err, errCrash) {
				t.Fatalf("reconciler ended with %v", err)
			}
			done = true
		}
	}
	for _, err := range failed {
		t.Error(err)
	}
	rn := g.start(engine.Faults{})
	eventually(t, "every knock", func() bool { return allKnocked(g, nodes) })
	if k := g.verify(rn.r); k != len(nodes)*(1+killRounds) {
		t.Fatalf("%d knocks for %d nodes", k, len(nodes))
	}
	if kills < 10 {
		t.Fatalf("only %d kills: the test did not exercise restarts", kills)
	}
	t.Logf("%d kills", kills)
}

// killRounds is how many write-failure rounds each node plays after
// incident 1 in TestReconcilerRandomKills; each brings one knock.
const killRounds = 6

// rounds plays n rounds on node after incident 1: a new build of the
// broker, its settle, a write that fails, and the have that knocks it.
func (g *rig) rounds(node string, n int) {
	g.t.Helper()
	if err := g.tryRounds(context.Background(), node, n, g.t.Logf); err != nil {
		g.t.Error(err)
	}
}

// tryRounds is rounds that returns its failure, for a goroutine the test
// starts.
func (g *rig) tryRounds(ctx context.Context, node string, n int, logf func(string, ...any)) error {
	for i := range n {
		w := provAndBroker()
		w.Modules[1].Build = fmt.Sprintf("g:%d", i+2)
		seq, err := g.tryAppend(ctx, node, w, logf)
		if err != nil {
			return err
		}
		p, err := g.tryPlanFor(ctx, node, seq)
		if err != nil {
			return err
		}
		for _, ev := range []events.Payload{
			&events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p},
			&events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonWriteFailed, Plan: p, Writer: "prov", Error: "disk full"},
			&events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}},
		} {
			if _, err := g.tryAppend(ctx, node, ev, logf); err != nil {
				return err
			}
		}
		// 30 s, or the rig's plan wait when longer (a test that sets it
		// longer expects a slow cluster).
		wctx, cancel := context.WithTimeout(ctx, max(30*time.Second, g.wait))
		_, err = waitfor.Poll(wctx, fmt.Sprintf("node %s round %d's knock", node, i), func() (int, bool) {
			k, err := g.tryKnocksOf(wctx, node, logf)
			return k, err == nil && k == i+2
		})
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// play plays incident 1 and then n rounds on each node, each node in a
// goroutine of its own. The channel it returns carries each node's
// failure and is closed once every node is done. The goroutines never
// touch the test (t.Fatal from one does not end the test; a log after
// the test ended panics) and end with it.
func (g *rig) play(nodes []string, rounds int) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	g.t.Cleanup(cancel)
	errs := make(chan error, len(nodes))
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := g.tryIncident1(ctx, n, nil); err != nil {
				errs <- err
				return
			}
			if err := g.tryRounds(ctx, n, rounds, nil); err != nil {
				errs <- err
			}
		}()
	}
	go func() { wg.Wait(); close(errs) }()
	return errs
}

// failures reports every failure errs carries, waiting until it closes.
func failures(t *testing.T, errs <-chan error) {
	t.Helper()
	for err := range errs {
		t.Error(err)
	}
}

func allKnocked(g *rig, nodes []string) bool {
	for _, n := range nodes {
		if g.knocksOf(n) != 1+killRounds {
			return false
		}
	}
	return true
}

func counter(c prometheus.Counter) float64 { return testutil.ToFloat64(c) }

// testLogger logs through t, so a failing test shows what the loop said.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestReconcilerServerRestart restarts the embedded server on the same
// data directory in the middle of incident 1: every acknowledged event is
// still there, and a reconciler on the restarted server folds on from its
// snapshot to the one knock.
func TestReconcilerServerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	boot := func() (*embedded.Server, *rig) {
		srv, err := embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0", ServerName: "restart"})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		stream, cfg, err := store.EnsureStream(context.Background(), js, store.StreamConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close(); srv.Shutdown() })
		return srv, &rig{t: t, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects())}
	}
	srv, g := boot()
	rn := g.start(engine.Faults{})
	p1 := g.planFor("ace", g.append("ace", provOnly()))
	g.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
	refusal := g.append("ace", &events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
	w2 := g.append("ace", provAndBroker())
	rn.stop(t)
	srv.Shutdown()

	_, g = boot()
	msgs := g.all()
	if len(msgs) == 0 || msgs[len(msgs)-1].Event.Seq < w2 {
		t.Fatalf("after restart the stream ends at %d events, want through %d", len(msgs), w2)
	}
	rn = g.start(engine.Faults{})
	p2 := g.planFor("ace", w2)
	g.append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p2})
	eventually(t, "the knock", func() bool { return g.knocksOf("ace") == 1 })
	if k := g.verify(rn.r); k != 1 {
		t.Fatalf("%d knocks", k)
	}
	if st, _ := rn.r.Node("ace"); st.LastKnock == nil || st.LastKnock.Owed[0].Plan != p1 || refusal == 0 {
		t.Fatalf("last knock %+v", st.LastKnock)
	}
}

// A node that publishes under another node's next effect id cannot make
// the reconciler's real effect a duplicate: effect message ids are keyed
// (store.EffectMsgID), so the forgery takes an id nobody uses.
func TestReconcilerForgedEffectID(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	rn := g.start(engine.Faults{})
	p1 := g.planFor("ace", g.append("ace", provOnly()))
	g.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
	g.append("ace", &events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
	w2 := g.append("ace", provAndBroker())
	p2 := g.planFor("ace", w2)
	// The knock the settle below will cause has the effect id
	// ace.knock.<settle's sequence>.0. Another node publishes first, under
	// ids for the sequences just after its own messages.
	const forged = 20
	for i := uint64(1); i <= forged; i++ {
		if _, err := g.pub.Append(context.Background(), "shanks", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, at0),
			store.WithMsgID(fmt.Sprintf("ace.knock.%d.0", p2+i+forged))); err != nil {
			t.Fatal(err)
		}
	}
	if s := g.append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p2}); s != p2+forged+1 {
		t.Fatalf("settle at %d, want %d: the forged ids miss it", s, p2+forged+1)
	}
	eventually(t, "the knock", func() bool { return g.knocksOf("ace") == 1 })
	g.verify(rn.r)
}
