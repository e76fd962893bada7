package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
)

// neighbours returns n node names in the partition of node.
func neighbours(node string, n, partitions int) []string {
	p := events.Partition(node, partitions)
	var out []string
	for i := 0; len(out) < n; i++ {
		name := fmt.Sprintf("bad%03d", i)
		if events.Partition(name, partitions) == p {
			out = append(out, name)
		}
	}
	return out
}

// wedges are, raw (as a hostile node or controller would publish them,
// past any client-side check), the three inputs of issue 12 that stopped
// a whole partition, by the kind each is published as: a want of 20,000
// bare modules (its plan was over 1 MiB), a want declaring 6,000 files
// (its state's snapshot was), and a refusal whose 270,000-character path
// the journal entry quoted in full.
func wedges() map[string]struct {
	kind events.Kind
	data string
} {
	const at = `"v":1,"at":"2026-12-01T12:00:00Z"`
	var b strings.Builder
	b.WriteString(`{` + at + `,"modules":[`)
	for i := range 20000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"m%d","build":"b"}`, i)
	}
	b.WriteString(`]}`)
	hugeWant := b.String()
	b.Reset()
	b.WriteString(`{` + at + `,"modules":[{"name":"files","build":"b","files":[`)
	for i := range 6000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"path":"/var/lib/files/%052d","mode":"0600"}`, i)
	}
	b.WriteString(`]}]}`)
	filesWant := b.String()
	// C1 controls are plain UTF-8 in JSON and six characters each once
	// quoted; the trailing slash made the path invalid, so the journal
	// quoted it.
	refusal := `{` + at + `,"module":"m","path":"/` + strings.Repeat("\u0085", 270000) + `/","reason":"undeclared","plan":0,"writer":"w"}`
	return map[string]struct {
		kind events.Kind
		data string
	}{
		"plan":     {events.KindWant, hugeWant},
		"snapshot": {events.KindWant, filesWant},
		"journal":  {events.KindRefusal, refusal},
	}
}

// publishWedge publishes wedge name for node, raw. The stream refuses an
// event over the event limit at the door now (store.MaxMsgSize), so the
// wedge goes into the stream as one made before that limit held it:
// its limit lifted, as a stream of an older build has it, which the
// reconciler's EnsureStream sets again at its start. The fold must still
// pass such stored events.
func publishWedge(t *testing.T, js jetstream.JetStream, name, node string) {
	t.Helper()
	w := wedges()[name]
	if len(w.data) >= 1<<20 {
		t.Fatalf("wedge %s is %d bytes: over max_payload", name, len(w.data))
	}
	s, err := js.Stream(testCtx(t), store.DefaultStreamName)
	if err != nil {
		t.Fatal(err)
	}
	if old := s.CachedInfo().Config; old.MaxMsgSize != -1 {
		old.MaxMsgSize = -1
		if _, err := js.UpdateStream(testCtx(t), old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(testCtx(t), "mesh."+node+"."+string(w.kind), []byte(w.data)); err != nil {
		t.Fatalf("publish wedge %s: %v", name, err)
	}
}

// checkRejected checks that node's wedge was journaled, shortened.
func (g *rig) checkRejected(node string) {
	g.t.Helper()
	m, err := store.LastMsg(context.Background(), g.stream, g.cfg.Subjects(), node, events.KindJournal)
	if err != nil {
		g.t.Fatalf("no journal entry for %s: %v", node, err)
	}
	j := m.Event.Payload.(*events.Journal)
	if j.Level != events.LevelError || len(j.Msg) > 512 || !strings.Contains(j.Msg, "not folded") {
		g.t.Errorf("journal of %s: %d bytes, %s: %s", node, len(j.Msg), j.Level, events.Short(j.Msg))
	}
}

// checkpointed waits for node's partition to checkpoint past seq: its
// snapshot was written.
func (g *rig) checkpointed(node string, seq uint64) {
	g.t.Helper()
	snaps, err := store.OpenSnapshots(context.Background(), g.js, g.cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	eventually(g.t, "a checkpoint past the wedge", func() bool {
		ck, err := snaps.Checkpoint(context.Background(), events.Partition(node, g.cfg.Partitions))
		return err == nil && ck >= seq
	})
}

// Each wedge of issue 12 is rejected and journaled, shortened, and a good
// node of the same partition still gets its plan and the partition's
// snapshot is written past it. Before the limits, each kept the partition
// restarting forever.
func TestWedgesDoNotStopThePartition(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"plan", "snapshot", "journal"} {
		t.Run(name, func(t *testing.T) {
			g := newRig(t, store.StreamConfig{})
			bad := neighbours("ace", 1, g.cfg.Partitions)[0]
			publishWedge(t, g.js, name, bad)
			g.start(engine.Faults{})
			seq := g.append("ace", want("pg:1"))
			g.planFor("ace", seq)
			g.checkRejected(bad)
			g.checkpointed("ace", seq)
		})
	}
}

// With all three wedges in the stream, a restart of the server and of
// the reconciler on the same data directory (serve's restart) folds on
// past them.
func TestWedgesAcrossServeRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	boot := func() (*embedded.Server, *rig) {
		srv, err := embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0", ServerName: "wedges"})
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
	bad := neighbours("ace", 3, g.cfg.Partitions)
	for i, name := range []string{"plan", "snapshot", "journal"} {
		publishWedge(t, g.js, name, bad[i])
	}
	rn := g.start(engine.Faults{})
	g.planFor("ace", g.append("ace", want("pg:1")))
	rn.stop(t)
	srv.Shutdown()

	_, g = boot()
	g.start(engine.Faults{})
	seq := g.append("ace", want("pg:2"))
	g.planFor("ace", seq)
	g.checkpointed("ace", seq)
	for _, node := range bad {
		g.checkRejected(node)
	}
}

// startSmall starts a server with a small max_payload and the stream on
// it, as a deployment configured tighter than meshfold's limits would be.
func startSmall(t *testing.T, maxPayload int32) *rig {
	t.Helper()
	srv, err := server.NewServer(&server.Options{ServerName: "small", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), MaxPayload: maxPayload, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, cfg, err := store.EnsureStream(testCtx(t), js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects())}
}

// On a server whose max_payload is smaller than a valid want's plan and
// state, the plan is journaled, shortened, and skipped, the state's
// snapshot becomes a marker, and the partition goes on; a restart
// refolds the node from the stream to the same state, and publishes the
// skipped plan neither again nor its journal entry twice.
func TestPoisonPlanAndSnapshotSkipped(t *testing.T) {
	t.Parallel()
	const maxPayload = 4096
	g := startSmall(t, maxPayload)
	w := &events.Want{}
	for i := range events.MaxModules {
		w.Modules = append(w.Modules, events.WantModule{Name: fmt.Sprintf("%s-%02d", strings.Repeat("m", 47), i), Build: strings.Repeat("b", 40)})
	}
	metrics := engine.NewMetrics(nil)
	cfg := engine.ReconcilerConfig{SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t), Metrics: metrics}
	rn := g.startCfg(cfg)
	big := neighbours("ace", 1, g.cfg.Partitions)[0]
	bigWant := g.append(big, w) // fits in 4 KiB; its plan does not
	g.planFor("ace", g.append("ace", want("pg:1")))
	// Any of the node's journal entries: the state's own "too big" entry
	// may follow it at once (the checkpoint that ends a recovery).
	eventually(t, "the skipped plan's journal entry", func() bool {
		for _, m := range g.all() {
			if m.Event.Node == big && m.Event.Kind == events.KindJournal &&
				strings.Contains(m.Event.Payload.(*events.Journal).Msg, "not stored, skipped") {
				return true
			}
		}
		return false
	})
	snaps, err := store.OpenSnapshots(context.Background(), g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the marker in place of the big state", func() bool {
		b, _, err := snaps.GetNode(context.Background(), big)
		return err == nil && strings.Contains(string(b), `"too_big"`)
	})
	// A marker carries no fleet summary (fleet reads it as before); a
	// state that fits carries its summary in the same message. ace's
	// want may come after the session's start (its partition's recovery
	// ends at big's): its state is then put by a live checkpoint within
	// four of its fold, not with the marker, and is waited for.
	var (
		sums map[string]string
		bare []string
	)
	eventually(t, "the marker bare and ace's summary", func() bool {
		sums = map[string]string{}
		bare, err = snaps.ScanSummaries(context.Background(), func(node string, sum []byte) error {
			sums[node] = string(sum)
			return nil
		})
		return err == nil && slices.Contains(bare, big) && sums["ace"] != ""
	})
	kvs, err := g.js.Stream(context.Background(), "KV_"+snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	m, err := kvs.GetLastMsgForSubject(context.Background(), fmt.Sprintf("$KV.%s.node.%d.ace", snaps.Bucket(), events.Partition("ace", g.cfg.Partitions)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := reconcile.UnmarshalState(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if sum, _ := reconcile.MarshalSummary(st); m.Header.Get(store.SummaryHeader) != string(sum) {
		t.Errorf("ace's summary is not its state's:\n%s\n%s", m.Header.Get(store.SummaryHeader), sum)
	}
	if counter(metrics.Poison) != 1 || counter(metrics.TooBig) == 0 {
		t.Errorf("poison %v, too big %v", counter(metrics.Poison), counter(metrics.TooBig))
	}
	live, _ := rn.r.Node(big)
	rn.stop(t)

	journals := func() int {
		n := 0
		for _, m := range g.all() {
			if m.Event.Node == big && m.Event.Kind == events.KindJournal {
				n++
			}
		}
		return n
	}
	before := journals()
	rn = g.startCfg(cfg)
	g.planFor("ace", g.append("ace", want("pg:2")))
	st, ok := rn.r.Node(big)
	if !ok || st.Seq < bigWant || mustJSON(t, st) != mustJSON(t, live) {
		t.Fatalf("the refolded state of %s differs from the live one:\n%s\n%s", big, mustJSON(t, st), mustJSON(t, live))
	}
	rn.stop(t)
	if after := journals(); after != before {
		t.Errorf("the restart journaled %d more entries for %s", after-before, big)
	}
	for _, m := range g.all() {
		if m.Event.Node == big && m.Event.Kind == events.KindPlan {
			t.Errorf("a plan of %s was stored at %d", big, m.Event.Seq)
		}
	}
}
