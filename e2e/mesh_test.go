package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// secret is the content of every filled file; nothing but the fill path
// may carry it (DESIGN.md §5.5).
const secret = "s3cr3t-TOKEN-do-not-leak-7f3a9c"

// deadline bounds every wait of these tests.
const deadline = 20 * time.Second

const (
	mbg   = "mesh-build-go"
	creds = "/run/mesh-build-go/broker.creds"
)

var provisionerMod = events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}

var mbgMod = events.WantModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}}

// mesh is one embedded server with the event stream and a reconciler,
// started as serve starts it (engine.Serve).
type mesh struct {
	t    testing.TB
	srv  *embedded.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  store.StreamConfig
	pub  *store.Publisher
	logs *storetest.SyncBuffer

	// signer signs the reconciler's plans and knocks; trust is what the
	// node agents and provisioners verify them against.
	signer *store.Signer
	trust  *store.Trust
	own    *store.Trust // the reconciler's own keys; nil: the signer's

	rc         atomic.Pointer[engine.Reconciler]
	reconciler *proc

	// tp, when set, traces every component and every want published.
	tp trace.TracerProvider
	// dial, when set, opens each component's connection instead of srv
	// (a mesh on a cluster of nats-server processes).
	dial func(name string) (*nats.Conn, error)
}

func newMesh(t testing.TB) *mesh { return newMeshSet(t, nil) }

// newMeshSet is newMesh with set, when not nil, changing the mesh
// before its reconciler starts.
func newMeshSet(t testing.TB, set func(*mesh)) *mesh {
	t.Helper()
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	return newMeshFull(t, kp, nil, set)
}

// newMeshWith is newMesh with the reconciler's signing key kp and, when
// not nil, the stream's effect-id key (stored before the reconciler
// starts, as store.EffectKey would store a random one).
func newMeshWith(t testing.TB, kp nkeys.KeyPair, effectKey []byte) *mesh {
	t.Helper()
	return newMeshFull(t, kp, effectKey, nil)
}

// newMeshFull is newMeshWith with set, when not nil, changing the mesh
// before its reconciler starts.
func newMeshFull(t testing.TB, kp nkeys.KeyPair, effectKey []byte, set func(*mesh)) *mesh {
	t.Helper()
	srv, nc, js := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m := &mesh{t: t, srv: srv, nc: nc, js: js, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects()), logs: &storetest.SyncBuffer{}}
	if effectKey != nil {
		putEffectKey(t, ctx, js, cfg, effectKey)
	}
	m.signer = must(store.NewSigner(kp))(t)
	m.trust = must(store.NewTrust(m.signer.PublicKey()))(t)
	if set != nil {
		set(m)
	}
	m.startReconciler()
	return m
}

func (m *mesh) logger(component string) *slog.Logger {
	return slog.New(slog.NewTextHandler(m.logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("component", component)
}

// proc is one component running in its own goroutine on its own
// connection.
type proc struct {
	name   string
	cancel context.CancelFunc
	done   chan error
	nc     *nats.Conn
}

func (m *mesh) spawn(name string, run func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error) *proc {
	m.t.Helper()
	var nc *nats.Conn
	var err error
	if m.dial != nil {
		nc, err = m.dial(name)
	} else {
		nc, err = m.srv.Connect(nats.Name(name))
	}
	if err != nil {
		m.t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		m.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{name: name, cancel: cancel, done: make(chan error, 1), nc: nc}
	go func() { p.done <- run(ctx, nc, js) }()
	m.t.Cleanup(func() { p.stop(m.t) })
	return p
}

// stop stops the component and waits for it; safe to call twice.
func (p *proc) stop(t testing.TB) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("%s: %v", p.name, err)
		}
	case <-time.After(deadline):
		t.Errorf("%s did not stop within %s", p.name, deadline)
	}
	p.nc.Close()
}

// startReconciler starts the reconciler as serve does and returns once it
// is up (its stream lease held, its state service answering).
func (m *mesh) startReconciler() {
	m.t.Helper()
	ready := make(chan struct{})
	m.reconciler = m.spawn("reconciler", func(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream) error {
		return engine.Serve(ctx, nc, engine.Config{Stream: m.cfg, Logger: m.logger("reconciler"), Signer: m.signer, Own: m.own, Tracing: m.tp,
			Ready: func(_ context.Context, r *engine.Reconciler) { m.rc.Store(r); close(ready) }})
	})
	select {
	case <-ready:
	case err := <-m.reconciler.done:
		m.reconciler.done <- err // for stop
		m.t.Fatalf("reconciler did not start: %v", err)
	case <-time.After(deadline):
		m.t.Fatalf("reconciler not up within %s", deadline)
	}
}

func (m *mesh) restartReconciler() {
	m.reconciler.stop(m.t)
	m.rc.Store(nil)
	m.startReconciler()
}

// nodeT is one node: its agent, its provisioner client and their dirs.
type nodeT struct {
	m                  *mesh
	name               string
	root, state, from  string
	runtimeDir         string
	agent, provisioner *proc
	fills              chan fillPass
	// leased: its provisioner holds the node's provisioner lease
	// (provision.Config.Lease), as `meshfold provision` does.
	leased bool
}

type fillPass struct {
	knock uint64
	r     provision.Report
}

func (m *mesh) newNode(name string) *nodeT {
	dir := filepath.Join(m.t.TempDir(), name)
	n := &nodeT{m: m, name: name, root: filepath.Join(dir, "root"), state: filepath.Join(dir, "state"),
		from: filepath.Join(dir, "from"), fills: make(chan fillPass, 64)}
	n.runtimeDir = filepath.Join(n.root, node.ReservedDir, "modules")
	for _, d := range []string{n.root, n.from} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			m.t.Fatal(err)
		}
	}
	return n
}

func (n *nodeT) dirRuntime() node.Runtime {
	rt, err := node.NewDirRuntime(n.runtimeDir)
	if err != nil {
		n.m.t.Fatal(err)
	}
	return rt
}

// startAgent starts the node agent with rt (nil: a DirRuntime).
func (n *nodeT) startAgent(rt node.Runtime) { n.startAgentFaults(rt, node.Faults{}) }

// startAgentFaults starts the node agent with rt and test hooks; mod, when
// given, changes its configuration.
func (n *nodeT) startAgentFaults(rt node.Runtime, faults node.Faults, mod ...func(*node.Config)) {
	if rt == nil {
		rt = n.dirRuntime()
	}
	n.agent = n.m.spawn(n.name+"-agent", func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
		cfg := node.Config{Name: n.name, Root: n.root, StateDir: n.state, Runtime: rt,
			Stream: n.m.cfg, Logger: n.m.logger("node"), Faults: faults, Trust: n.m.trust, Tracing: n.m.tp}
		for _, m := range mod {
			m(&cfg)
		}
		a, err := node.New(nc, js, cfg)
		if err != nil {
			return err
		}
		return a.Run(ctx)
	})
}

// client returns a provisioner client for the node (not running).
func (n *nodeT) client(nc *nats.Conn, js jetstream.JetStream, account string) *provision.Client {
	c, err := provision.New(nc, js, provision.Config{Node: n.name, From: n.from, Account: account,
		Stream: n.m.cfg, Logger: n.m.logger("provision"), Timeout: 2 * time.Second, Trust: n.m.trust, Tracing: n.m.tp, Lease: n.leased,
		OnFill: func(k uint64, r provision.Report) {
			select {
			case n.fills <- fillPass{k, r}:
			default:
			}
		}})
	if err != nil {
		n.m.t.Fatal(err)
	}
	return c
}

func (n *nodeT) startProvisioner(account string) {
	n.provisioner = n.m.spawn(n.name+"-provisioner", func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
		return n.client(nc, js, account).Run(ctx)
	})
}

// nextFill waits for the running provisioner's next fill pass.
func (n *nodeT) nextFill(t testing.TB, ctx context.Context) fillPass {
	t.Helper()
	select {
	case p := <-n.fills:
		return p
	case <-ctx.Done():
		t.Fatal("no fill pass")
		return fillPass{}
	}
}

// source writes the content the provisioner fills module's path with.
func (n *nodeT) source(module, path, content string) {
	p := filepath.Join(n.from, module, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		n.m.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		n.m.t.Fatal(err)
	}
}

// fillOnce runs one fill pass of a fresh client, as an eager provisioner
// that ran ahead of the node would.
func (n *nodeT) fillOnce(ctx context.Context, account string) (provision.Report, error) {
	c, err := provision.New(n.m.nc, n.m.js, provision.Config{Node: n.name, From: n.from, Account: account,
		Stream: n.m.cfg, Logger: n.m.logger("provision-once"), Timeout: 2 * time.Second, Trust: n.m.trust, Tracing: n.m.tp})
	if err != nil {
		return provision.Report{}, err
	}
	return c.FillOnce(ctx)
}

// file reads a file the node wrote and its mode.
func (n *nodeT) file(path string) (string, os.FileMode, error) {
	p := filepath.Join(n.root, path)
	b, err := os.ReadFile(p)
	if err != nil {
		return "", 0, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", 0, err
	}
	return string(b), fi.Mode().Perm(), nil
}

// runs returns the module records of the node's DirRuntime.
func (n *nodeT) runs(ctx context.Context) (map[string]events.HaveModule, error) {
	rt, err := node.NewDirRuntime(n.runtimeDir)
	if err != nil {
		return nil, err
	}
	mods, err := rt.Running(ctx)
	out := map[string]events.HaveModule{}
	for _, m := range mods {
		out[m.Name] = m
	}
	return out, err
}

// ctx returns a context bounded by the deadline.
func (m *mesh) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	m.t.Cleanup(cancel)
	return ctx
}

// want publishes a want of mods for node; traced, under a span of its
// own ("publish want"), the root of the want's trace.
func (m *mesh) want(ctx context.Context, node string, mods ...events.WantModule) (uint64, error) {
	ctx, span := tracing.Start(ctx, tracing.Tracer(m.tp), "publish want", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	ack, err := m.pub.Append(ctx, node, events.Stamp(&events.Want{Modules: mods}, time.Now()),
		store.WithTraceparent(tracing.Traceparent(ctx)))
	span.SetAttributes(tracing.Node.String(node), tracing.SeqAttr(tracing.Seq, ack.Seq))
	return ack.Seq, err
}

func (m *mesh) approve(ctx context.Context, node, module, build string) (uint64, error) {
	ack, err := m.pub.Append(ctx, node, events.Stamp(&events.Approve{Module: module, Build: build, By: "ops"}, time.Now()))
	return ack.Seq, err
}

// waitEvent reads node's events of kind from the start of the stream
// until pred holds.
func (m *mesh) waitEvent(ctx context.Context, node string, kind events.Kind, pred func(events.Event) bool) (events.Event, error) {
	subj := m.cfg.Subjects()
	tail, err := store.Follow(ctx, m.js, store.TailConfig{Stream: m.cfg.Name, Subjects: subj, Filter: subj.Stored(node, kind)})
	if err != nil {
		return events.Event{}, err
	}
	defer tail.Stop()
	for {
		msg, err := tail.Next(ctx)
		if err != nil {
			return events.Event{}, fmt.Errorf("waiting for a %s of %s: %w", kind, node, err)
		}
		if ev := msg.Event; ev.Kind == "" {
			return events.Event{}, ev.Err
		} else if ev.Err == nil && pred(ev) {
			return ev, nil
		}
	}
}

// planOf waits for the plan whose cause is seq and returns its sequence
// and payload.
func (m *mesh) planOf(ctx context.Context, node string, cause uint64) (uint64, *events.Plan, error) {
	ev, err := m.waitEvent(ctx, node, events.KindPlan, func(ev events.Event) bool { return ev.Payload.(*events.Plan).Cause == cause })
	if err != nil {
		return 0, nil, err
	}
	return ev.Seq, ev.Payload.(*events.Plan), nil
}

// settled waits for a settle of plan that is not a failure.
func (m *mesh) settled(ctx context.Context, node string, plan uint64) (*events.Settle, error) {
	ev, err := m.waitEvent(ctx, node, events.KindSettle, func(ev events.Event) bool {
		s := ev.Payload.(*events.Settle)
		return s.Plan == plan && s.Op != events.OpFailed
	})
	if err != nil {
		return nil, err
	}
	return ev.Payload.(*events.Settle), nil
}

// filled waits for a filled of path at plan or later.
func (m *mesh) filled(ctx context.Context, node, path string, plan uint64) (events.Event, error) {
	return m.waitEvent(ctx, node, events.KindFilled, func(ev events.Event) bool {
		f := ev.Payload.(*events.Filled)
		return f.Path == path && f.Plan >= plan
	})
}

// quiesce waits until the reconciler has folded every input event of
// node now in the stream, and returns its state's owed count.
func (m *mesh) quiesce(ctx context.Context, node string) (owed int, err error) {
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		return 0, err
	}
	var last uint64
	for _, k := range events.InputKinds {
		msg, err := store.LastMsg(ctx, stream, m.cfg.Subjects(), node, k)
		if errors.Is(err, store.ErrNoMessage) {
			continue
		}
		if err != nil {
			return 0, err
		}
		last = max(last, msg.Event.Seq)
	}
	tick := time.NewTicker(2 * time.Millisecond) // polling the reconciler's state, bounded by ctx
	defer tick.Stop()
	for {
		if r := m.rc.Load(); r != nil {
			if st, ok := r.Node(node); ok && st.Seq >= last {
				return len(st.Owed), nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the reconciler did not fold %s up to %d: %w", node, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// events returns node's events of kind in the stream, in order.
func (m *mesh) events(ctx context.Context, node string, kind events.Kind) ([]events.Event, error) {
	var out []events.Event
	err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), node, 0, 0, func(msg store.Msg) error {
		if msg.Event.Kind == kind {
			out = append(out, msg.Event)
		}
		return nil
	})
	return out, err
}

// waitEvents returns node's events of kind once there is one, or ctx's
// error.
func (m *mesh) waitEvents(ctx context.Context, node string, kind events.Kind) ([]events.Event, error) {
	tick := time.NewTicker(2 * time.Millisecond) // polling the stream, bounded by ctx
	defer tick.Stop()
	for {
		evs, err := m.events(ctx, node, kind)
		if err != nil || len(evs) > 0 {
			return evs, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// fill sends one raw fill request.
func (m *mesh) fill(ctx context.Context, node, module, path, writer, content string) (events.FillReply, error) {
	msg := nats.NewMsg(m.cfg.Subjects().Fill(node))
	msg.Header.Set(events.HeaderModule, module)
	msg.Header.Set(events.HeaderPath, path)
	msg.Header.Set(events.HeaderWriter, writer)
	msg.Data = []byte(content)
	resp, err := m.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return events.FillReply{}, err
	}
	var r events.FillReply
	return r, json.Unmarshal(resp.Data, &r)
}

// gate is a Runtime whose Apply of one module blocks until opened.
type gate struct {
	node.Runtime
	module  string
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate(rt node.Runtime, module string) *gate {
	return &gate{Runtime: rt, module: module, entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *gate) Apply(ctx context.Context, m events.PlanModule) error {
	if m.Name == g.module {
		g.once.Do(func() { close(g.entered) })
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Runtime.Apply(ctx, m)
}

// must returns v, or fails the test on err: must(f())(t).
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// must2 is must for two values.
func must2[A, B any](a A, b B, err error) func(testing.TB) (A, B) {
	return func(t testing.TB) (A, B) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}

// assertNoLeak fails when the content or a plain hash of it appears in
// any stream message or in the logs of every component.
func (m *mesh) assertNoLeak() {
	m.t.Helper()
	sum := sha256.Sum256([]byte(secret))
	needles := []string{secret, hex.EncodeToString(sum[:])}
	ctx := m.ctx()
	stream := must(m.js.Stream(ctx, m.cfg.Name))(m.t)
	last := stream.CachedInfo().State.LastSeq
	n := 0
	if last > 0 {
		cons := must(m.js.OrderedConsumer(ctx, m.cfg.Name, jetstream.OrderedConsumerConfig{}))(m.t)
		it := must(cons.Messages())(m.t)
		defer it.Stop()
		for {
			msg := must(it.Next(jetstream.NextContext(ctx)))(m.t)
			n++
			for _, s := range needles {
				if bytes.Contains(msg.Data(), []byte(s)) {
					m.t.Errorf("stream message on %s holds the content or its plain hash", msg.Subject())
				}
			}
			if meta, _ := msg.Metadata(); meta.Sequence.Stream >= last {
				break
			}
		}
	}
	logs := m.logs.String()
	for _, s := range needles {
		if strings.Contains(logs, s) {
			m.t.Errorf("the logs hold the content or its plain hash")
		}
	}
	m.t.Logf("no content in %d stream messages nor in %d bytes of logs", n, len(logs))
}
