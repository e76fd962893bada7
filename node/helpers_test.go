package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// secret is the content of every fill in these tests; no log line, error
// or event may hold it or a plain hash of it (DESIGN.md §5.5).
const secret = "s3cr3t-TOKEN-do-not-leak-7f3a9c"

// wait bounds every wait on an event or a message.
const wait = 10 * time.Second

type env struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    store.StreamConfig
	pub    *store.Publisher
}

func newEnv(t *testing.T) *env {
	t.Helper()
	_, nc, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	return &env{nc: nc, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects())}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// publishPlan appends a plan for node, as a reconciler would, and returns
// its sequence.
func (e *env) publishPlan(t *testing.T, node, account string, rows ...events.PlanModule) uint64 {
	t.Helper()
	for i := range rows {
		if rows[i].Files == nil {
			rows[i].Files = []events.File{}
		}
	}
	p := events.Stamp(&events.Plan{Cause: 1, Want: 1, ProvisionerAccount: account, Modules: rows}, time.Now())
	ack, err := e.pub.Append(ctxT(t), node, p)
	if err != nil {
		t.Fatalf("publish plan: %v", err)
	}
	return ack.Seq
}

// recorder wraps the agent's publisher and records what it appended.
type recorder struct {
	next   publisher
	mu     sync.Mutex
	sent   []sent
	before atomic.Pointer[func(events.Payload)] // called before each append, outside any lock; set while the agent runs
}

type sent struct {
	payload events.Payload
	ack     store.Ack
	err     error
}

func (r *recorder) Append(ctx context.Context, node string, p events.Payload, opts ...store.AppendOpt) (store.Ack, error) {
	if before := r.before.Load(); before != nil {
		(*before)(p)
	}
	ack, err := r.next.Append(ctx, node, p, opts...)
	r.mu.Lock()
	r.sent = append(r.sent, sent{p, ack, err})
	r.mu.Unlock()
	return ack, err
}

func (r *recorder) all() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sent(nil), r.sent...)
}

type agentT struct {
	*Agent
	root, state string
	logs        *storetest.SyncBuffer
	rec         *recorder
	stop        func()
}

// startAgent starts an agent for node with a DirRuntime under its root
// (unless rt is given) and stops it at cleanup.
func (e *env) startAgent(t *testing.T, node string, rt Runtime, mod ...func(*Config)) *agentT {
	t.Helper()
	dir := t.TempDir()
	return e.startAgentIn(t, node, filepath.Join(dir, "root"), filepath.Join(dir, "state"), rt, mod...)
}

func (e *env) startAgentIn(t *testing.T, node, root, state string, rt Runtime, mod ...func(*Config)) *agentT {
	t.Helper()
	if err := mkdir(root); err != nil {
		t.Fatal(err)
	}
	if rt == nil {
		var err error
		if rt, err = NewDirRuntime(filepath.Join(root, ReservedDir, "modules")); err != nil {
			t.Fatal(err)
		}
	}
	logs := &storetest.SyncBuffer{}
	cfg := Config{Name: node, Root: root, StateDir: state, Runtime: rt, Stream: e.cfg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, m := range mod {
		m(&cfg)
	}
	a, err := New(e.nc, e.js, cfg)
	if err != nil {
		t.Fatalf("node.New: %v", err)
	}
	rec := &recorder{next: a.pub}
	a.pub = rec
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(wait):
				t.Errorf("Run did not return within %s of its context ending", wait)
			}
		})
	}
	t.Cleanup(stop)
	return &agentT{Agent: a, root: root, state: state, logs: logs, rec: rec, stop: stop}
}

// fill sends a fill request, retrying while nobody answers yet (the agent
// serves fills once its first plan is applied).
func (e *env) fill(t *testing.T, node, module, path, writer string, content []byte) (events.FillReply, *nats.Msg) {
	t.Helper()
	return e.fillRequest(t, node, module, path, writer, "", content)
}

// fillRequest is fill with request as the events.HeaderRequest ("": none).
func (e *env) fillRequest(t *testing.T, node, module, path, writer, request string, content []byte) (events.FillReply, *nats.Msg) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		msg := nats.NewMsg(events.Subjects{}.Fill(node))
		msg.Header.Set(events.HeaderModule, module)
		msg.Header.Set(events.HeaderPath, path)
		msg.Header.Set(events.HeaderWriter, writer)
		if request != "" {
			msg.Header.Set(events.HeaderRequest, request)
		}
		msg.Data = content
		resp, err := e.nc.RequestMsg(msg, wait)
		if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // poll interval while the service registers, not synchronisation
			continue
		}
		if err != nil {
			t.Fatalf("fill request: %v", err)
		}
		var r events.FillReply
		if err := json.Unmarshal(resp.Data, &r); err != nil {
			t.Fatalf("fill reply %q: %v", resp.Data, err)
		}
		return r, resp
	}
}

// waitEvent reads node's events of kind from sequence 1 until pred holds,
// and returns that event. It fails the test after the deadline.
func (e *env) waitEvent(t *testing.T, node string, kind events.Kind, pred func(store.Msg) bool) store.Msg {
	t.Helper()
	ctx := ctxT(t)
	subj := e.cfg.Subjects()
	tail, err := store.Follow(ctx, e.js, store.TailConfig{Stream: e.cfg.Name, Subjects: subj, Filter: subj.Stored(node, kind)})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	for {
		m, err := tail.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for a %s of %s: %v", kind, node, err)
		}
		if m.Event.Kind == "" {
			t.Fatal(m.Event.Err)
		}
		if m.Event.Err == nil && pred(m) {
			return m
		}
	}
}

// events returns node's events of kind now in the stream, in order.
func (e *env) events(t *testing.T, node string, kind events.Kind) []store.Msg {
	t.Helper()
	var out []store.Msg
	err := store.ReadNode(ctxT(t), e.js, e.cfg.Name, e.cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
		if m.Event.Kind == kind {
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func settleOf(plan uint64) func(store.Msg) bool {
	return func(m store.Msg) bool { return m.Event.Payload.(*events.Settle).Plan == plan }
}

// assertNoLeak fails when the content or a plain hash or encoding of it
// appears in any stream message (data or headers) or in the given texts.
func assertNoLeak(t *testing.T, js jetstream.JetStream, streamName string, texts ...string) {
	t.Helper()
	sum := sha256.Sum256([]byte(secret))
	needles := []string{secret, hex.EncodeToString(sum[:]), base64.StdEncoding.EncodeToString([]byte(secret)), base64.StdEncoding.EncodeToString(sum[:])}
	ctx := ctxT(t)
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		t.Fatal(err)
	}
	last := stream.CachedInfo().State.LastSeq
	n := 0
	if last > 0 {
		cons, err := js.OrderedConsumer(ctx, streamName, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.DropOrdered(js, streamName, cons)
		it, err := cons.Messages()
		if err != nil {
			t.Fatal(err)
		}
		defer it.Stop()
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				t.Fatal(err)
			}
			n++
			var hdr strings.Builder
			for k, v := range m.Headers() {
				hdr.WriteString(k + ":" + strings.Join(v, ",") + "\n")
			}
			for _, s := range needles {
				if bytes.Contains(m.Data(), []byte(s)) || strings.Contains(hdr.String(), s) {
					t.Errorf("stream message on %s holds the content (or its plain hash): %s", m.Subject(), m.Data())
				}
			}
			if meta, _ := m.Metadata(); meta.Sequence.Stream >= last {
				break
			}
		}
	}
	for _, text := range texts {
		for _, s := range needles {
			if strings.Contains(text, s) {
				t.Errorf("text holds the content (or its plain hash): %q", s)
			}
		}
	}
	t.Logf("no leak in %d stream messages and %d texts", n, len(texts))
}
