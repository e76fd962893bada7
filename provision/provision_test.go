package provision_test

import (
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
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

const (
	secret = "s3cr3t-TOKEN-do-not-leak-7f3a9c"
	wait   = 10 * time.Second
	creds  = "/run/mesh-build-go/broker.creds"
	mbg    = "mesh-build-go"
)

type env struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  store.StreamConfig
	pub  *store.Publisher
	root string // the node agent's root
	logs *storetest.SyncBuffer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	return &env{nc: nc, js: js, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects()), logs: &storetest.SyncBuffer{}}
}

func (e *env) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) append(t *testing.T, p events.Payload) uint64 {
	t.Helper()
	ack, err := e.pub.Append(ctxT(t), "ace", events.Stamp(p, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Seq
}

func (e *env) plan(t *testing.T, account string, rows ...events.PlanModule) uint64 {
	for i := range rows {
		if rows[i].Files == nil {
			rows[i].Files = []events.File{}
		}
	}
	return e.append(t, &events.Plan{Cause: 1, Want: 1, ProvisionerAccount: account, Modules: rows})
}

// startNode runs a node agent for ace until the test ends.
func (e *env) startNode(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	e.root = filepath.Join(dir, "root")
	if err := os.MkdirAll(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := node.NewDirRuntime(filepath.Join(e.root, node.ReservedDir, "modules"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := node.New(e.nc, e.js, node.Config{Name: "ace", Root: e.root, StateDir: filepath.Join(dir, "state"),
		Runtime: rt, Stream: e.cfg, Logger: e.logger()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a.Run)
}

// run runs fn until the test ends and checks it returns nil.
func run(t *testing.T, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return")
		}
	})
}

// source writes the content of module's file path under from.
func source(t *testing.T, from, module, path, content string) {
	t.Helper()
	p := filepath.Join(from, module, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// reports collects the client's fill passes.
type reports struct {
	ch chan pass
}

type pass struct {
	knock uint64
	r     provision.Report
}

func newReports() *reports { return &reports{ch: make(chan pass, 100)} }

func (r *reports) on(knock uint64, rep provision.Report) { r.ch <- pass{knock, rep} }

func (r *reports) next(t *testing.T) pass {
	t.Helper()
	select {
	case p := <-r.ch:
		return p
	case <-time.After(wait):
		t.Fatal("no fill pass within the deadline")
		return pass{}
	}
}

func (e *env) client(t *testing.T, from string, rep *reports, mod ...func(*provision.Config)) *provision.Client {
	t.Helper()
	cfg := provision.Config{Node: "ace", From: from, Account: "prov", Stream: e.cfg, Logger: e.logger(), Timeout: time.Second}
	if rep != nil {
		cfg.OnFill = rep.on
	}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := provision.New(e.nc, e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) settled(t *testing.T, plan uint64) {
	t.Helper()
	e.waitEvent(t, events.KindSettle, func(p events.Payload) bool { return p.(*events.Settle).Plan == plan })
}

func (e *env) waitEvent(t *testing.T, kind events.Kind, pred func(events.Payload) bool) events.Payload {
	t.Helper()
	ctx := ctxT(t)
	cons, err := e.js.OrderedConsumer(ctx, e.cfg.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.cfg.Subjects().Stored("ace", kind)}})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			t.Fatalf("waiting for a %s: %v", kind, err)
		}
		p, err := events.Decode(kind, m.Data())
		if err == nil && pred(p) {
			return p
		}
	}
}

func checkFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || string(b) != content {
		t.Fatalf("%s = %q, %v", path, b, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != mode {
		t.Errorf("%s mode %v, want %v", path, fi.Mode().Perm(), mode)
	}
}

func noLeak(t *testing.T, texts ...string) {
	t.Helper()
	sum := sha256.Sum256([]byte(secret))
	for _, s := range texts {
		if strings.Contains(s, secret) || strings.Contains(s, hex.EncodeToString(sum[:])) {
			t.Errorf("content leaked into a log line or report")
		}
	}
}

// On start the client fills every declared file of the newest plan, held
// rows included, and the files land on the node.
func TestFillOnStart(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	p := e.plan(t, "prov",
		events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}},
		events.PlanModule{Name: "postgres", Build: "pg:1", Held: true, Why: events.HoldApproval, Pending: "pg:2",
			Files: []events.File{{Path: "/etc/postgres/pass", Mode: "0640"}}})
	e.settled(t, p)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	source(t, from, "postgres", "/etc/postgres/pass", "pg-"+secret)
	rep := newReports()
	run(t, e.client(t, from, rep).Run)

	got := rep.next(t)
	if got.knock != 0 || got.r.Plan != p || len(got.r.Filled) != 2 || len(got.r.Refused)+len(got.r.Missing)+len(got.r.Failed) != 0 {
		t.Fatalf("pass on start = %+v", got)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	checkFile(t, filepath.Join(e.root, "/etc/postgres/pass"), "pg-"+secret, 0o640)
	noLeak(t, e.logs.String())
}

// A knock makes the client fill again, reading the newest plan: a file
// whose source was missing when its plan settled lands with the knock.
func TestFillOnKnock(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	// A knock from before the client started is not followed: the fill on
	// start covers it.
	e.append(t, &events.Knock{Cause: 1, Reasons: []events.KnockReason{events.KnockDeclared}, Owed: []events.Owed{}})
	p1 := e.plan(t, "prov", events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true})
	e.settled(t, p1)
	from := t.TempDir()
	rep := newReports()
	run(t, e.client(t, from, rep).Run)
	if got := rep.next(t); got.knock != 0 || got.r.Plan != p1 || len(got.r.Filled) != 0 {
		t.Fatalf("pass on start = %+v", got)
	}

	p2 := e.plan(t, "prov", events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p2)
	// The settle of p2 makes the client fill its new file: no source yet.
	if got := rep.next(t); got.knock != 0 || got.r.Plan != p2 || len(got.r.Missing) != 1 || len(got.r.Filled) != 0 {
		t.Fatalf("pass on the settle = %+v", got)
	}
	// Its log line says none was filled, not "filled them" (a fresh
	// user's finding U8).
	if logs := e.logs.String(); !strings.Contains(logs, "settled plan declares new or refused files: none filled") || strings.Contains(logs, "filled them") {
		t.Errorf("the settle's log line does not say none was filled:\n%s", logs)
	}
	source(t, from, mbg, creds, secret)
	k := e.append(t, &events.Knock{Cause: p2 + 1, Reasons: []events.KnockReason{events.KnockDeclared},
		Owed: []events.Owed{{Module: mbg, Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"}}})
	got := rep.next(t)
	if got.knock != k || got.r.Plan != p2 || len(got.r.Filled) != 1 || got.r.Filled[0].Path != creds {
		t.Fatalf("pass on knock %d = %+v", k, got)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	select {
	case extra := <-rep.ch:
		t.Errorf("an extra fill pass: %+v", extra)
	default:
	}
	noLeak(t, e.logs.String())
}

// A knock after the node's plan aged out of the stream (serve --max-age)
// fills by the plan the client last read, which the node still judges
// by: with only the stream's, the pass read no plan and filled nothing,
// so a file deleted on a quiet node was asked for (a have's missing
// knock) and never filled (provfix).
func TestKnockAfterPlanAgedOutFillsByLastPlan(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	p := e.plan(t, "prov", events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	rep := newReports()
	run(t, e.client(t, from, rep).Run)
	if got := rep.next(t); got.r.Plan != p || len(got.r.Filled) != 1 {
		t.Fatalf("pass on start = %+v", got)
	}
	// The plan ages out; the file is deleted on the node; a knock.
	stream, err := e.js.Stream(ctxT(t), e.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctxT(t), jetstream.WithPurgeSubject(e.cfg.Subjects().Stored("ace", events.KindPlan))); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.root, creds)); err != nil {
		t.Fatal(err)
	}
	k := e.append(t, &events.Knock{Cause: p + 1, Reasons: []events.KnockReason{events.KnockMissing}, Owed: []events.Owed{}})
	got := rep.next(t)
	if got.knock != k || got.r.Plan != p || len(got.r.Filled) != 1 || got.r.Filled[0].Path != creds {
		t.Fatalf("pass on knock %d after the plan aged out = %+v", k, got)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	if !strings.Contains(e.logs.String(), "filling by the plan last read") {
		t.Errorf("the pass does not say it fills by the plan last read:\n%s", e.logs.String())
	}
	noLeak(t, e.logs.String())
}

// A file a new plan declares is filled once the node settles that plan,
// with no refusal and no knock: knocks only pay refused writes, and a file
// nobody tried to write would otherwise wait for a restart of the client.
// Files already filled are not sent again.
func TestFillOnSettleOfNewDeclaration(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	source(t, from, "postgres", "/etc/postgres/pass", "pg-"+secret)
	pg := events.PlanModule{Name: "postgres", Build: "pg:1", RunsAs: "postgres", Files: []events.File{{Path: "/etc/postgres/pass", Mode: "0600"}}}
	p1 := e.plan(t, "prov", events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}, pg)
	e.settled(t, p1)
	rep := newReports()
	run(t, e.client(t, from, rep).Run)
	if got := rep.next(t); got.r.Plan != p1 || len(got.r.Filled) != 1 {
		t.Fatalf("pass on start = %+v", got)
	}
	p2 := e.plan(t, "prov", events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}, pg,
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	got := rep.next(t)
	if got.knock != 0 || got.r.Plan != p2 || len(got.r.Filled) != 1 || got.r.Filled[0].Path != creds || len(got.r.Refused) != 0 {
		t.Fatalf("pass on the settle of p2 = %+v, want only the new file filled", got)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	noLeak(t, e.logs.String())
}

// A missing source file is logged by path and skipped; the others are
// filled.
func TestMissingSourceSkipped(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: "/etc/a", Mode: "0600"}, {Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	r, err := e.client(t, from, nil).FillOnce(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(from, mbg, "etc", "a")
	if len(r.Missing) != 1 || r.Missing[0] != missing || len(r.Filled) != 1 {
		t.Fatalf("report = %+v, want %s missing and one filled", r, missing)
	}
	if !strings.Contains(e.logs.String(), missing) {
		t.Errorf("the missing source's path is not logged")
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
}

// A refusal is reported and not retried: one request per file per pass.
func TestRefusalNotRetried(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	p := e.plan(t, "someone-else", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	// A synchronous subscription: the messages the server sent before a
	// flush's answer are queued on it when Flush returns (a callback
	// might not have run yet).
	sub, err := e.nc.SubscribeSync(e.cfg.Subjects().Fill("ace"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	r, err := e.client(t, from, nil).FillOnce(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Refused) != 1 || r.Refused[0].Reason != events.ReasonWrongAccount || len(r.Filled) != 0 {
		t.Fatalf("report = %+v, want one wrong-account refusal", r)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := sub.Pending(); err != nil || n != 1 {
		t.Errorf("%d requests (%v), want 1: a refusal is not retried", n, err)
	}
	noLeak(t, e.logs.String())
}

// Transport failures are retried: a request nobody answers times out and
// is sent again, and the fill succeeds once the node agent serves.
func TestTransportFailureRetried(t *testing.T) {
	e := newEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	from := t.TempDir()
	source(t, from, mbg, creds, secret)

	// A silent listener: the first request times out.
	first := make(chan struct{})
	var once sync.Once
	sub, err := e.nc.Subscribe(e.cfg.Subjects().Fill("ace"), func(*nats.Msg) { once.Do(func() { close(first) }) })
	if err != nil {
		t.Fatal(err)
	}
	// A second per request: the first times out at the silent listener,
	// and the agent's fill (the file written, its filled appended) has
	// the time it needs. At 100 ms a fill under load outlived its
	// request: the retry then found the content in place and the pass
	// reported it unchanged, not filled.
	c := e.client(t, from, nil, func(c *provision.Config) { c.Timeout = time.Second })
	type result struct {
		r   provision.Report
		err error
	}
	done := make(chan result, 1)
	go func() { r, err := c.FillOnce(ctxT(t)); done <- result{r, err} }()
	select {
	case <-first:
	case <-time.After(wait):
		t.Fatal("no request")
	}
	_ = sub.Unsubscribe()
	e.startNode(t)
	e.settled(t, p)
	res := <-done
	// The agent holds requests that arrive before its first apply is
	// done; under load one such request can outlive the client's 1 s and
	// still write the file. The retry after it finds the content in place
	// and is still reported filled: it names the same request
	// (TestRetryAfterLostReplyIsFilled).
	if res.err != nil || len(res.r.Filled) != 1 || len(res.r.Unchanged)+len(res.r.Refused)+len(res.r.Failed) != 0 {
		t.Fatalf("FillOnce = %+v, %v; want the file filled after retries", res.r, res.err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	if !strings.Contains(e.logs.String(), "fill request failed; retrying") {
		t.Errorf("the retry is not logged")
	}
}

// A fill whose reply is lost after the node wrote the file (the request
// timed out) is retried, and the retry, finding the content in place, is
// reported filled, not unchanged: the write was this pass's own. The
// test plays the lost reply: a listener that answers nothing takes the
// first attempt before the node agent runs, and the test hands it to the
// agent itself, keeping the reply, while the client waits out its
// timeout.
func TestRetryAfterLostReplyIsFilled(t *testing.T) {
	e := newEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	first := make(chan *nats.Msg, 1)
	sub, err := e.nc.Subscribe(e.cfg.Subjects().Fill("ace"), func(m *nats.Msg) {
		select {
		case first <- m:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt waits 5 s for its reply: the agent starts and
	// writes within it. Were it slower, the client's retry would write
	// and be answered filled itself; the test would still pass.
	c := e.client(t, from, nil, func(c *provision.Config) { c.Timeout = 5 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
	defer cancel()
	type result struct {
		r   provision.Report
		err error
	}
	done := make(chan result, 1)
	go func() { r, err := c.FillOnce(ctx); done <- result{r, err} }()
	var lost *nats.Msg
	select {
	case lost = <-first:
	case <-time.After(wait):
		t.Fatal("no request")
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if lost.Header.Get(events.HeaderRequest) == "" {
		t.Fatalf("the fill request names no %s: %v", events.HeaderRequest, lost.Header)
	}
	e.startNode(t)
	e.settled(t, p)
	fwd := nats.NewMsg(lost.Subject)
	fwd.Header, fwd.Data = lost.Header, lost.Data
	for {
		resp, err := e.nc.RequestMsgWithContext(ctx, fwd)
		if errors.Is(err, nats.ErrNoResponders) {
			time.Sleep(10 * time.Millisecond) // poll while the service registers, not synchronisation
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var reply events.FillReply
		if err := json.Unmarshal(resp.Data, &reply); err != nil || !reply.OK || reply.Unchanged {
			t.Fatalf("the lost attempt, delivered: %s (%v); want it written", resp.Data, err)
		}
		break
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	res := <-done
	if res.err != nil || len(res.r.Filled) != 1 || len(res.r.Unchanged)+len(res.r.Refused)+len(res.r.Failed) != 0 {
		t.Fatalf("FillOnce = %+v, %v; want the file filled: the write its retry found was its own", res.r, res.err)
	}
}

// No plan: nothing to fill, not an error.
func TestNoPlan(t *testing.T) {
	e := newEnv(t)
	r, err := e.client(t, t.TempDir(), nil).FillOnce(ctxT(t))
	if err != nil || r.Plan != 0 || len(r.Filled) != 0 {
		t.Fatalf("FillOnce = %+v, %v", r, err)
	}
}

// A source file missing at the last fill, and a filled file deleted on the
// node, are filled again within the resync interval, with no knock.
func TestResyncFillsLateSourceAndDeletedFile(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	p := e.plan(t, "prov", events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	from := t.TempDir()
	rep := newReports()
	run(t, e.client(t, from, rep, func(c *provision.Config) { c.Resync = 50 * time.Millisecond }).Run)
	if got := rep.next(t); len(got.r.Missing) != 1 {
		t.Fatalf("pass on start = %+v, want the source missing", got)
	}
	source(t, from, mbg, creds, secret)
	for got := rep.next(t); len(got.r.Filled) != 1; got = rep.next(t) {
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	if err := os.Remove(filepath.Join(e.root, creds)); err != nil {
		t.Fatal(err)
	}
	for got := rep.next(t); len(got.r.Filled) != 1; got = rep.next(t) {
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
}

// With Trust set, the client acts only on knocks, and fills only from
// plans, signed by a trusted reconciler key: an unsigned knock brings no
// pass (and coalesces no trusted one away), an unsigned newest plan is
// not filled from.
func TestOnlySignedKnocksAndPlans(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := store.NewSigner(kp)
	trust, _ := store.NewTrust(signer.PublicKey())
	n := 0
	signed := func(p events.Payload) uint64 {
		t.Helper()
		n++
		ack, err := e.pub.Append(ctxT(t), "ace", events.Stamp(p, time.Now()),
			store.WithMsgID(fmt.Sprintf("ace.%s.%d.0", p.Kind(), n)), store.WithSigner(signer))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	row := events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}}
	p1 := signed(&events.Plan{Cause: 1, Want: 1, ProvisionerAccount: "prov", Modules: []events.PlanModule{row}})
	e.settled(t, p1)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	rep := newReports()
	run(t, e.client(t, from, rep, func(c *provision.Config) { c.Trust = trust }).Run)
	if got := rep.next(t); got.r.Plan != p1 || len(got.r.Filled) != 1 {
		t.Fatalf("pass on start = %+v, want the signed plan's file filled", got)
	}

	knock := &events.Knock{Cause: 2, Reasons: []events.KnockReason{events.KnockOperator}, Owed: []events.Owed{}}
	e.append(t, knock) // unsigned: ignored
	k := signed(knock)
	e.append(t, knock) // unsigned, right after a trusted one
	if got := rep.next(t); got.knock != k {
		t.Fatalf("pass for knock %d, want one for the signed knock %d", got.knock, k)
	}

	e.plan(t, "prov", row) // unsigned newest plan
	k2 := signed(knock)
	got := rep.next(t)
	if got.knock != k2 || got.r.Plan != 0 || len(got.r.Filled) != 0 {
		t.Fatalf("pass on knock %d with an unsigned newest plan = %+v, want nothing filled", k2, got)
	}
	// Passes come in order: a pass for either unsigned knock would have
	// come before k's, or before k2's.
	if !strings.Contains(e.logs.String(), "knock ignored: not from a trusted reconciler") {
		t.Error("the unsigned knocks were not logged as ignored")
	}
}

// A request that events.FillRequest.Validate refuses is not sent: no
// node agent runs here, so a sent one would wait out its retries.
func TestBadRequestNotSent(t *testing.T) {
	e := newEnv(t)
	c := e.client(t, t.TempDir(), nil)
	for _, tc := range []struct{ module, path, header string }{
		{mbg, "run/relative", events.HeaderPath},
		{"Mesh!", creds, events.HeaderModule},
	} {
		_, err := c.Request(ctxT(t), tc.module, tc.path, []byte(secret))
		if !errors.Is(err, events.ErrInvalid) || !strings.Contains(err.Error(), tc.header) {
			t.Errorf("Request(%s, %s) = %v, want a validation error naming %s", tc.module, tc.path, err, tc.header)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Error("the error holds the content")
		}
	}
}
