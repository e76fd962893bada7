package console_test

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// secret stands for filled-file content: the console never has it, and
// no page may show it.
const secret = "s3cr3t-console-7f3a9c"

const (
	mbg   = "mesh-build-go"
	creds = "/run/mesh-build-go/broker.creds"
)

var base = time.Date(2026, 11, 3, 20, 49, 0, 0, time.UTC)

// fake is a Source over a simulated stream: the snapshots are the states
// when the console loads, Live is the stream's live state, Follow hands
// over what the test appends afterwards.
type fake struct {
	mu     sync.Mutex
	s      *reconciletest.Stream
	follow chan events.Event
	noLive bool
	// sources are the provisioners' reports Sources returns.
	sources map[string][]audit.SourceProblem
	// answers are the provisioners' answers to knocks Unanswered reads
	// (none: no provisioner ever answered).
	answers map[string]*audit.KnockAnswer
	// knockGrace is the grace Unanswered gives a knock (audit.KnockGrace
	// unless a test sets it before starting the console: a test that set
	// the package's variable raced the parallel tests reading it).
	knockGrace time.Duration
	// steps are the wants a rollout step published, by sequence, as
	// query.Reader.History reads them from each want's id and header.
	steps map[uint64]audit.RolloutStep
	// snaps, when set, are the stored snapshots Fleet returns, covering
	// the stream up to checkpoint (nil: Fleet returns every node's state
	// as it is, and the snapshots lag nothing).
	snaps      map[string]reconcile.View
	checkpoint uint64
}

// snapshot stores every node's state as it is now as the snapshots,
// checkpointed at the stream's end: the events appended afterwards are
// past the checkpoint, as a reconciler killed -9 leaves them.
func (f *fake) snapshot() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps = map[string]reconcile.View{}
	for _, n := range f.s.Nodes() {
		f.snaps[n] = f.s.State(n).Clone().View()
	}
	f.checkpoint = f.s.Next() - 1
}

// Lag is one partition whose checkpoint is f.checkpoint (the stream's
// end without snapshots).
func (f *fake) Lag(context.Context) (query.SnapshotLag, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	last := f.s.Next() - 1
	p := query.PartitionLag{Checkpoint: last, Last: last}
	if f.snaps != nil {
		p.Checkpoint = f.checkpoint
	}
	return query.SnapshotLag{Partitions: []query.PartitionLag{p}}, nil
}

// TailNodes names each node of an input event past the checkpoint, as
// query.Reader.TailNodes does.
func (f *fake) TailNodes(_ context.Context, lag query.SnapshotLag, limit int) (map[string]uint64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]uint64{}
	for _, ev := range f.s.Events {
		if ev.Seq > lag.Partitions[0].Checkpoint && ev.Seq <= lag.Partitions[0].Last && ev.Kind.Input() {
			out[ev.Node] = max(out[ev.Node], ev.Seq)
		}
	}
	return out, true, nil
}

func newFake() *fake {
	return &fake{s: reconciletest.New(base, 250*time.Millisecond), follow: make(chan events.Event, 1<<14), knockGrace: audit.KnockGrace}
}

// append appends an input event and hands it and its effects to Follow.
func (f *fake) append(node string, p events.Payload) events.Event {
	f.mu.Lock()
	n := len(f.s.Events)
	ev := f.s.Append(node, p)
	added := append([]events.Event(nil), f.s.Events[n:]...)
	f.mu.Unlock()
	for _, e := range added {
		f.follow <- e
	}
	return ev
}

func (f *fake) Fleet(context.Context) ([]console.NodeView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []console.NodeView
	if f.snaps != nil {
		for n, v := range f.snaps {
			out = append(out, console.NodeView{Node: n, View: v})
		}
		return out, nil
	}
	for _, n := range f.s.Nodes() {
		out = append(out, console.NodeView{Node: n, View: f.s.State(n).View()})
	}
	return out, nil
}

func (f *fake) Sources(_ context.Context, node string) (map[string][]audit.SourceProblem, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]audit.SourceProblem{}
	for n, ps := range f.sources {
		if node == "" || n == node {
			out[n] = ps
		}
	}
	return out, nil
}

// Unanswered applies audit.KnockUnanswered to each node's newest knock
// on the stream and its answer in f.answers, as query.Reader does.
func (f *fake) Unanswered(_ context.Context, nodes map[string]uint64, now time.Time) (map[string]audit.SourceProblem, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]audit.SourceProblem{}
	for n := range nodes {
		var knock *events.Event
		for i, ev := range f.s.Events {
			if ev.Node == n && ev.Kind == events.KindKnock {
				knock = &f.s.Events[i]
			}
		}
		if knock == nil {
			continue
		}
		if p, ok := audit.KnockUnanswered(n, knock.Seq, knock.Payload.(*events.Knock).Cause, knock.Time, f.answers[n], now, f.knockGrace); ok {
			out[n] = p
		}
	}
	return out, nil
}

func (f *fake) WarningSeqs(context.Context, time.Time) (map[string][]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]uint64{}
	for _, ev := range f.s.Events {
		if j, ok := ev.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
			out[ev.Node] = append(out[ev.Node], ev.Seq)
		}
	}
	return out, nil
}

func (f *fake) Live(_ context.Context, node string) (reconcile.View, reconcile.Composition, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noLive {
		return reconcile.View{}, reconcile.Composition{}, query.ErrNoReconciler
	}
	st := f.s.State(node)
	return st.View(), reconcile.CompositionOf(st), nil
}

func (f *fake) History(_ context.Context, node string, b query.Bounds) (*audit.History, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, err := audit.NewHistory(node, f.s.Node(node))
	if h != nil {
		h.Rollout = f.steps
	}
	if err != nil || b.Until == nil {
		return h, err
	}
	n, _ := h.Until(*b.Until)
	h, err = audit.NewHistory(node, h.Events[:n])
	if h != nil {
		h.Partial = true // a bounded read, as query.Reader.History marks it
	}
	return h, err
}

func (f *fake) Begins(context.Context, *audit.History) string { return "" }

func (f *fake) Follow(ctx context.Context, started func(), fn func(events.Event)) error {
	if started != nil {
		started()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-f.follow:
			fn(ev)
		}
	}
}

var provisioner = events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}
var mbgMod = events.WantModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}}

// lastPlan returns the sequence of node's newest plan event.
func (f *fake) lastPlan(node string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var seq uint64
	for _, ev := range f.s.Node(node) {
		if ev.Kind == events.KindPlan {
			seq = ev.Seq
		}
	}
	return seq
}

// incident1 plays DESIGN.md §2 incident 1 on ace up to the refusal: the
// write was refused as undeclared and is owed; the plan declaring it is
// emitted and unsettled. settle finishes it: the knock.
func incident1(f *fake) (settle func() uint64) {
	f.append("ace", &events.Want{Modules: []events.WantModule{provisioner}})
	p1 := f.lastPlan("ace")
	f.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
	f.append("ace", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	f.append("ace", &events.Want{Modules: []events.WantModule{provisioner, mbgMod}})
	p2 := f.lastPlan("ace")
	f.append("ace", &events.Refusal{Module: mbg, Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
	return func() uint64 {
		f.append("ace", &events.Settle{Module: mbg, Op: events.OpApply, Plan: p2})
		for _, ev := range f.s.Node("ace") {
			if ev.Kind == events.KindKnock {
				return ev.Seq
			}
		}
		return 0
	}
}

// healthy gives node a settled provisioner and a fresh have.
func healthy(f *fake, node string) {
	f.append(node, &events.Want{Modules: []events.WantModule{provisioner}})
	f.append(node, &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: f.lastPlan(node)})
	f.append(node, &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
}

type fixture struct {
	f   *fake
	srv *httptest.Server
	now time.Time
}

func start(t *testing.T, f *fake) *fixture {
	t.Helper()
	return startWith(t, f, console.Config{Source: f})
}

// startWith is start with cfg (its Now, when unset, the fake's clock):
// a console over another source, or with a logger.
func startWith(t *testing.T, f *fake, cfg console.Config) *fixture {
	t.Helper()
	fx := &fixture{f: f}
	if cfg.Now == nil {
		cfg.Now = func() time.Time {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.s.TimeOf(f.s.Next())
		}
	}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	fx.srv = httptest.NewServer(c)
	// Until loaded the fleet page says it is loading (503): the tests ask
	// a loaded console.
	select {
	case <-c.Loaded():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the console did not load within 30 s")
	}
	t.Cleanup(func() {
		fx.srv.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return fx
}

func (fx *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(fx.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) {
		t.Errorf("GET %s: the page holds the filled content", path)
	}
	return resp.StatusCode, string(b)
}

// waitPage fetches path until it holds want, for up to 10 s
// (internal/waitfor), and returns the page; a timeout quotes the last.
func (fx *fixture) waitPage(t *testing.T, path, want string) string {
	t.Helper()
	return waitfor.Value(t, 10*time.Second, fmt.Sprintf("GET %s to hold %q", path, want), func() (string, bool) {
		_, body := fx.get(t, path)
		return body, strings.Contains(body, want)
	})
}

var rowRE = regexp.MustCompile(`<tr class="need-row" id="need-([a-z0-9_-]+)"`)

// The fleet page lists what needs an operator first, most pressing
// first (audit.SortFleet), then every node; the filter keeps the nodes
// whose name matches.
func TestFleetPage(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "shanks")
	incident1(f)
	// novox waits for an approval.
	f.append("novox", &events.Want{Modules: []events.WantModule{provisioner, {Name: "nats", Build: "img:2.10", RunsAs: "nats", RequiresApproval: true}}})
	f.append("novox", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: f.lastPlan("novox")})
	f.append("novox", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	fx := start(t, f)
	body := fx.waitPage(t, "/", `id="need-ace"`)
	var needs []string
	for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
		needs = append(needs, m[1])
	}
	if strings.Join(needs, ",") != "ace,novox" {
		t.Errorf("needs an operator: %v, want ace (owed) then novox (approval)", needs)
	}
	if i, j := strings.Index(body, `id="needs"`), strings.Index(body, `id="nodes"`); i < 0 || j < i {
		t.Errorf("the needs section is not before every node")
	}
	for _, n := range []string{"ace", "novox", "shanks"} {
		if !strings.Contains(body, `id="node-`+n+`"`) {
			t.Errorf("every node: %s missing", n)
		}
	}
	if !strings.Contains(body, "nats → img:2.10") {
		t.Error("novox's pending approval is not shown")
	}
	// novox's node page draws the held row and its pending build.
	_, page := fx.get(t, "/node/novox")
	if !strings.Contains(page, `class="hold hold-approval"`) || !strings.Contains(page, "nats (approval, pending img:2.10)") {
		t.Errorf("novox's page does not draw nats held for its approval:\n%s", page)
	}
	_, body = fx.get(t, "/?q=nov")
	if strings.Contains(body, `id="node-ace"`) || !strings.Contains(body, `id="node-novox"`) {
		t.Errorf("filter nov: %s", body)
	}
}

// Live updates: an event folded after the page was loaded reaches an
// open event stream as the fleet's new HTML.
func TestFleetEvents(t *testing.T) {
	t.Parallel()
	f := newFake()
	settle := incident1(f)
	fx := start(t, f)
	fx.waitPage(t, "/", `id="need-ace"`)
	resp, err := http.Get(fx.srv.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	frames := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var b strings.Builder
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				frames <- b.String()
				b.Reset()
				continue
			}
			b.WriteString(line + "\n")
		}
		close(frames)
	}()
	next := func() string {
		select {
		case fr, ok := <-frames:
			if !ok {
				t.Fatal("the event stream ended")
			}
			return fr
		case <-time.After(10 * time.Second):
			t.Fatal("no frame")
		}
		return ""
	}
	if fr := next(); !strings.Contains(fr, "event: fleet") || !strings.Contains(fr, `id="need-ace"`) {
		t.Fatalf("first frame: %s", fr)
	}
	knock := settle()
	cause := f.s.Events[knock-1].Payload.(*events.Knock).Cause
	for {
		// The row's last knock is told by its cause, as in meshfold fleet.
		if fr := next(); strings.Contains(fr, fmt.Sprintf(`data-knock="%d"`, cause)) {
			if !strings.Contains(fr, `id="node-ace" data-node="ace" data-owed="0"`) || strings.Contains(fr, `need-owed`) {
				t.Errorf("ace still owes after the knock: %s", fr)
			}
			break
		}
	}
}

// The node page: the picture with a mark per event and the knock
// marked; ?why= shows the chain the audit computes, each event a link;
// ?as_of= shows audit --as-of's text; nothing shows the filled content.
func TestNodePage(t *testing.T) {
	t.Parallel()
	f := newFake()
	settle := incident1(f)
	knock := settle()
	f.append("ace", &events.Filled{Module: mbg, Path: creds, Plan: f.lastPlan("ace"), Digest: "hmac-of-" + "content"})
	fx := start(t, f)
	code, body := fx.get(t, "/node/ace")
	if code != 200 {
		t.Fatalf("GET /node/ace: %d %s", code, body)
	}
	h, _ := f.History(context.Background(), "ace", query.Bounds{})
	if n := strings.Count(body, `class="ev ev-`); n != len(h.Events) {
		t.Errorf("%d marks, want one per event (%d)", n, len(h.Events))
	}
	if !strings.Contains(body, fmt.Sprintf(`id="ev-%d" href="/node/ace?why=%d#why"`, knock, knock)) {
		t.Errorf("the knock #%d is not a link to its why", knock)
	}
	if !strings.Contains(body, audit.StateText(f.s.State("ace").View(), reconcile.CompositionOf(f.s.State("ace")), f.s.TimeOf(f.s.Next()), "the reconciler (live)")) {
		t.Error("the state is not meshfold state's text")
	}

	_, body = fx.get(t, fmt.Sprintf("/node/ace?why=%d", knock))
	w, err := h.Why(knock)
	if err != nil {
		t.Fatal(err)
	}
	o := w.Owed[0]
	for _, l := range []*audit.Link{o.Refusal, o.Want, o.Settle, o.Accepting, w.Cause} {
		if !strings.Contains(body, fmt.Sprintf(`<a class="why-link" href="/node/ace?why=%d#why" data-seq="%d">#%d %s</a>`, l.Seq, l.Seq, l.Seq, l.Kind)) {
			t.Errorf("the chain does not link #%d %s", l.Seq, l.Kind)
		}
	}
	if !strings.Contains(body, "undeclared: plan #") {
		t.Error("the chain does not say why the write was refused")
	}

	// As of the refusal: audit --as-of's text, owing the credential.
	var refusal uint64
	for _, ev := range h.Events {
		if ev.Kind == events.KindRefusal {
			refusal = ev.Seq
		}
	}
	_, body = fx.get(t, fmt.Sprintf("/node/ace?as_of=%d", refusal))
	want := h.AsOf(audit.SeqBound(refusal)).Text()
	if !strings.Contains(body, template(want)) {
		t.Errorf("as of #%d: the page does not hold audit --as-of's text:\n%s", refusal, want)
	}
	if strings.Contains(body, fmt.Sprintf(`id="ev-%d"`, knock)) {
		t.Error("as of the refusal, the page draws the later knock")
	}
	if strings.Contains(body, "hmac-of-content") {
		t.Error("a filled digest is on the page")
	}

	// Zoom and time axis keep working; bad parameters are refused.
	if code, _ := fx.get(t, "/node/ace?from=2&to=5&axis=time"); code != 200 {
		t.Errorf("zoom: %d", code)
	}
	for _, q := range []string{"?as_of=yesterday", "?why=x", "?from=0"} {
		if code, _ := fx.get(t, "/node/ace"+q); code != 400 {
			t.Errorf("%s: %d, want 400", q, code)
		}
	}
	if code, _ := fx.get(t, "/node/zed"); code != 404 {
		t.Errorf("unknown node: %d, want 404", code)
	}
	if code, _ := fx.get(t, "/node/Bad!"); code != 400 {
		t.Errorf("bad node name: %d, want 400", code)
	}
}

// A node's timeline marks the want a rollout step published: its mark
// in the picture (its tone, its title naming the rollout, the batch and
// why), its row of the events table, and its why.
func TestNodePageRolloutStep(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	by := f.append("ace", &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:2", RunsAs: "prov", Provisioner: true}}})
	back := f.append("ace", &events.Want{Modules: []events.WantModule{provisioner}})
	f.steps = map[uint64]audit.RolloutStep{
		by.Seq:   {Fleet: "web", Rollout: 93, Step: "forward", Why: "batch 2 of 3; applied by alice: web 1.4; canary promoted by bea"},
		back.Seq: {Fleet: "web", Rollout: 93, Step: "revert", Why: "revert by auto_revert: target bob failed: module web crash-loops"},
	}
	fx := start(t, f)
	code, body := fx.get(t, "/node/ace")
	if code != 200 {
		t.Fatalf("GET /node/ace: %d", code)
	}
	for _, c := range []struct {
		seq        uint64
		tone, text string
	}{
		{by.Seq, "rollout", "rollout web #93, forward step: batch 2 of 3; applied by alice: web 1.4; canary promoted by bea"},
		{back.Seq, "rollout-revert", "rollout web #93, revert step: revert by auto_revert: target bob failed: module web crash-loops"},
	} {
		mark := regexp.MustCompile(fmt.Sprintf(`<a class="ev ev-want shape-dot tone-%s" id="ev-%d"[^>]*><title>([^<]*)</title>`, c.tone, c.seq)).FindStringSubmatch(body)
		if mark == nil || !strings.Contains(mark[1], template(c.text)) {
			t.Errorf("want #%d: no %s mark titled %q: %v", c.seq, c.tone, c.text, mark)
		}
		_, why := fx.get(t, fmt.Sprintf("/node/ace?why=%d", c.seq))
		if !strings.Contains(why, `<span class="label label-rollout">rollout</span> `+template(c.text)) {
			t.Errorf("the why of want #%d does not name its step %q", c.seq, c.text)
		}
	}
	if !strings.Contains(body, "<td>rollout #93 batch 2/3: provisioner p:1→p:2") || !strings.Contains(body, "<td>rollout #93 revert: provisioner p:2→p:1") {
		t.Error("the events table does not mark the rollout's wants")
	}
	// The wants before, published by hand, are not marked.
	if n := strings.Count(body, "tone-rollout"); n != 2 {
		t.Errorf("%d wants marked, want 2", n)
	}
}

// template escapes s as html/template writes text.
func template(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;", "+", "&#43;")
	return r.Replace(s)
}

// With no reconciler answering, the node page shows the fold of the
// stream instead, and says so.
func TestNodePageNoReconciler(t *testing.T) {
	t.Parallel()
	f := newFake()
	incident1(f)()
	f.noLive = true
	fx := start(t, f)
	_, body := fx.get(t, "/node/ace")
	if !strings.Contains(body, "a replay of the stream: no reconciler answered") {
		t.Error("the state does not say it is a replay")
	}
}

// The console is read-only: every other method is refused.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	fx := start(t, f)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, p := range []string{"/", "/node/ace", "/events"} {
			req, _ := http.NewRequest(m, fx.srv.URL+p, strings.NewReader("x"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, p, resp.StatusCode)
			}
		}
	}
	if code, body := fx.get(t, "/static/live.js"); code != 200 || !strings.Contains(body, "EventSource") {
		t.Errorf("/static/live.js: %d", code)
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{"127.0.0.1:7070": true, "[::1]:7070": true, "localhost:1": true,
		"0.0.0.0:7070": false, ":7070": false, "10.0.0.1:80": false, "bad": false} {
		if got := console.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v", addr, got)
		}
	}
}

// A fleet larger than a page: each table shows at most MaxRows rows and
// says how many more there are; the filter finds the rest.
func TestFleetPageCap(t *testing.T) {
	t.Parallel()
	f := newFake()
	for i := range console.MaxRows + 5 {
		f.append(fmt.Sprintf("n%04d", i), &events.Want{Modules: []events.WantModule{provisioner}})
	}
	fx := start(t, f)
	body := fx.waitPage(t, "/", "5 more nodes")
	if n := strings.Count(body, `<tr id="node-`); n != console.MaxRows {
		t.Errorf("%d rows of every node, want %d", n, console.MaxRows)
	}
	if n := strings.Count(body, `class="need-row"`); n != console.MaxRows || !strings.Contains(body, fmt.Sprintf("the %d most pressing of %d", console.MaxRows, console.MaxRows+5)) {
		t.Errorf("%d rows needing an operator, want the %d most pressing", n, console.MaxRows)
	}
	if _, body := fx.get(t, fmt.Sprintf("/?q=n%04d", console.MaxRows+4)); !strings.Contains(body, fmt.Sprintf(`id="node-n%04d"`, console.MaxRows+4)) {
		t.Error("the filter does not find a node past the cap")
	}
}

// An open node page is told of the node's newer events, and of no other
// node's.
func TestNodeEvents(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	fx := start(t, f)
	_, page := fx.get(t, "/node/ace")
	h, _ := f.History(context.Background(), "ace", query.Bounds{})
	last := h.Events[len(h.Events)-1].Seq
	src := fmt.Sprintf("/node/ace/events?after=%d", last)
	if !strings.Contains(page, `data-src="`+strings.ReplaceAll(src, "&", "&amp;")+`"`) {
		t.Fatalf("the node page does not follow %s", src)
	}
	resp, err := http.Get(fx.srv.URL + src)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if l := <-lines; !strings.HasPrefix(l, ": follows ace") {
		t.Fatalf("first line %q", l)
	}
	f.append("shanks", &events.Want{Modules: []events.WantModule{provisioner}})
	ev := f.append("ace", &events.Approve{Module: "provisioner", Build: "p:2", By: "ops"})
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the stream ended")
			}
			if strings.HasPrefix(l, "data: ") {
				if l != fmt.Sprintf("data: %d", ev.Seq) {
					t.Errorf("told %q, want ace's newest event #%d", l, ev.Seq)
				}
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the page was not told of ace's newer event")
		}
	}
}

// An event that comes between a node page's render and its follow is
// offered at once, not only after the node's next event.
func TestNodeEventsBeforeTheFollow(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	fx := start(t, f)
	fx.get(t, "/node/ace")
	h, _ := f.History(context.Background(), "ace", query.Bounds{})
	last := h.Events[len(h.Events)-1].Seq
	ev := f.append("ace", &events.Pause{By: "alice", Reason: "disk swap"})
	fx.waitPage(t, "/", `id="need-ace"`) // the console has seen it
	resp, err := http.Get(fx.srv.URL + fmt.Sprintf("/node/ace/events?after=%d", last))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "data: ") {
				got <- l
				return
			}
		}
	}()
	select {
	case l := <-got:
		if l != fmt.Sprintf("data: %d", ev.Seq) {
			t.Errorf("told %q, want ace's newest event #%d", l, ev.Seq)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an event before the follow was never offered")
	}
}

// A paused node needs an operator and says who paused it, as fleet says;
// a retired node leaves the fleet page unless asked for (?all=1).
func TestFleetPausedRetired(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "shanks")
	f.append("shanks", &events.Pause{By: "alice", Reason: "disk swap"})
	healthy(f, "novox")
	f.append("novox", &events.Retire{By: "alice", Force: true})
	fx := start(t, f)
	body := fx.waitPage(t, "/", `id="need-shanks"`)
	if !strings.Contains(body, `need-paused`) || !strings.Contains(body, "paused by alice") {
		t.Errorf("shanks is not shown paused by alice:\n%s", body)
	}
	if strings.Contains(body, `id="node-novox"`) || !strings.Contains(body, "1 retired left out") {
		t.Errorf("the retired novox is listed:\n%s", body)
	}
	if _, body := fx.get(t, "/?all=1"); !strings.Contains(body, `id="node-novox"`) {
		t.Error("?all=1 does not list the retired novox")
	}
}

// Why a file is unfilled, as its provisioner reports it (DESIGN.md §12),
// is on the fleet page (the node needs an operator: "source") and in
// the node page's state, with no content; it clears when the report goes.
func TestSourceProblems(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	healthy(f, "bob")
	fx := start(t, f)
	f.mu.Lock()
	f.sources = map[string][]audit.SourceProblem{"ace": {{Module: "app", Path: "/run/app/token", State: "missing",
		Why: "exec vault-fill: helper exit status 3", Since: base}}}
	f.mu.Unlock()
	page := fx.waitPage(t, "/", "vault-fill")
	if !strings.Contains(page, "/run/app/token") || !strings.Contains(page, "source") {
		t.Errorf("the fleet page does not name the unfilled file:\n%s", page)
	}
	_, node := fx.get(t, "/node/ace")
	if !strings.Contains(node, "not filled, as the provisioner reports it") || !strings.Contains(node, "vault-fill") {
		t.Errorf("the node page's state does not say why the file is unfilled")
	}
	f.mu.Lock()
	f.sources = nil
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, page := fx.get(t, "/"); !strings.Contains(page, "vault-fill") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleet page still shows a cleared report")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A sealed secret shadowed by an earlier source is not an unfilled file:
// the node page's state heads its line so, as `meshfold state` does
// (audit.SourcesHeader; the F7 follow-up of a fresh user's findings).
func TestSourceShadowedHeader(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	f.sources = map[string][]audit.SourceProblem{"ace": {{Module: "app", Path: "/run/app/token", State: audit.Shadowed,
		Why: "filled from dir /srv/secrets/ace, tried before sealed", Since: base}}}
	fx := start(t, f)
	_, node := fx.get(t, "/node/ace")
	if !strings.Contains(node, "not filled, or filled from a source that shadows a put, as the provisioner reports it") ||
		!strings.Contains(node, "sealed secret shadowed since") {
		t.Errorf("the node page's state does not head the shadowed file's line:\n%s", node)
	}
}

// A knock no provisioner answered is a source problem of its node on the
// fleet page, as `fleet` shows it (audit.KnockUnanswered; a fresh user's
// finding 2: the page said "Nothing needs an operator"), and it clears
// once a provisioner's answer covers the knock.
func TestUnansweredKnock(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.knockGrace = 0
	healthy(f, "bob")
	knock := incident1(f)()
	if knock == 0 {
		t.Fatal("incident1 made no knock")
	}
	fx := start(t, f)
	page := fx.waitPage(t, "/", "no-provisioner")
	if !strings.Contains(page, "no provisioner of ace has recorded an answer") || strings.Contains(page, "Nothing needs an operator") {
		t.Errorf("the fleet page does not show ace's unanswered knock as needing an operator:\n%s", page)
	}
	f.mu.Lock()
	f.answers = map[string]*audit.KnockAnswer{"ace": {Knock: knock, At: base, Account: "prov"}}
	f.mu.Unlock()
	waitfor.Value(t, 3*console.KnocksEvery, "the fleet page to drop the answered knock", func() (string, bool) {
		_, page := fx.get(t, "/")
		return page, !strings.Contains(page, "no-provisioner")
	})
}

// A node whose provisioner refuses its plans and knocks for their signer
// (its report: state untrusted, naming the key) shows that on the fleet
// page in place of the unanswered knock's "is it running?" line, as
// `fleet` does (audit.AddUnanswered; a fresh user's finding G6).
func TestUntrustedProvisionerReplacesUnansweredKnock(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.knockGrace = 0
	healthy(f, "bob")
	if incident1(f)() == 0 {
		t.Fatal("incident1 made no knock")
	}
	fx := start(t, f)
	fx.waitPage(t, "/", "no-provisioner")
	const why = "plan #2 is signed by key NA6UVR62MPJAQIXYAE3IAT2NUZOGYUHULHC343KVG466NJSHEVCCN2KI, which this provisioner does not trust: " +
		"if it is the reconciler's, add it to --trust (MESHFOLD_TRUST)"
	f.mu.Lock()
	f.sources = map[string][]audit.SourceProblem{"ace": {{State: audit.Untrusted, Why: why, Since: base}}}
	f.mu.Unlock()
	page := fx.waitPage(t, "/", "ace untrusted: its provisioner refuses the node&#39;s plans and knocks")
	if strings.Contains(page, "no-provisioner") || !strings.Contains(strings.Join(strings.Fields(page), " "), "NA6UVR62MPJAQIXYAE3IAT2NUZOGYUHULHC343KVG466NJSHEVCCN2KI") {
		t.Errorf("the fleet page does not show the provisioner's refusal alone, naming the key:\n%s", page)
	}
}

// Issue 22: the node timeline colours haves by what they say (a failed
// or unhealthy module visible at a glance) and marks the agent's down and
// up moments with a line across the lanes; the fleet page lists the agent
// down under what needs an operator.
func TestNodePageLiveness(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	f.append("ace", &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "w:1", State: events.Failed, Exit: "status 1"}}})
	f.append("ace", &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "w:1", State: events.Running, Health: events.Unhealthy}}})
	down := f.append("ace", &events.Agent{State: events.AgentDown, Claim: "c1", Host: "h", PID: 7, Why: events.WhyExpired})
	fx := start(t, f)
	_, body := fx.get(t, "/node/ace")
	for _, want := range []string{`tone-failed`, `tone-unhealthy`, fmt.Sprintf(`class="ev ev-agent shape-agent tone-down" id="ev-%d"`, down.Seq), `class="agent-line"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the node page has no %s", want)
		}
	}
	_, body = fx.get(t, "/")
	if !strings.Contains(body, "need-agent-down") || !strings.Contains(body, "agent down since") {
		t.Error("the fleet page does not list ace's agent down")
	}
}

// The fleet page starts with a summary of the whole fleet: how many
// nodes share each need, most pressing first, each a link showing only
// those nodes; the search finds nodes by a part of their name or of a
// need; both tables page (issue 27).
func TestFleetSummary(t *testing.T) {
	t.Parallel()
	f := newFake()
	settle := incident1(f) // ace owes its credential
	_ = settle
	f.append("novox", &events.Want{Modules: []events.WantModule{provisioner,
		{Name: "nats", Build: "n:2", RunsAs: "nats", RequiresApproval: true}}})
	for i := range console.MaxRows + 20 {
		healthy(f, fmt.Sprintf("calm%03d", i))
	}
	fx := start(t, f)
	body := fx.waitPage(t, "/", `id="need-novox"`)
	i, j := strings.Index(body, `id="summary"`), strings.Index(body, `id="needs"`)
	if i < 0 || j < i {
		t.Fatalf("no summary before the needs:\n%s", body)
	}
	summary := body[i:j]
	for _, want := range []string{
		`<li class="group" data-need="owed"><a href="/?need=owed"><span class="need need-owed">owed</span> <b class="n">1</b></a></li>`,
		`<li class="group" data-need="approval"><a href="/?need=approval"><span class="need need-approval">approval</span> <b class="n">1</b></a></li>`,
		fmt.Sprintf(`<li class="group group-calm" data-need="nothing"><a href="/?need=nothing"><span class="calm">nothing</span> <b class="n">%d</b></a></li>`, console.MaxRows+20),
	} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary does not hold %s:\n%s", want, summary)
		}
	}
	if strings.Index(summary, `data-need="owed"`) > strings.Index(summary, `data-need="approval"`) {
		t.Error("the summary does not list the most pressing need first")
	}

	// Every group of the summary is a link the page takes, to the page
	// with that group chosen (a fresh user's finding L5: "nothing" was
	// no link, and ?need=nothing answered 400).
	groups := regexp.MustCompile(`<li class="group[^"]*" data-need="([^"]*)">(<a href="([^"]*)">)?`).FindAllStringSubmatch(summary, -1)
	if len(groups) < 3 || groups[len(groups)-1][1] != "nothing" {
		t.Errorf("the summary has %d groups, the last not nothing:\n%s", len(groups), summary)
	}
	for _, g := range groups {
		need, href := g[1], html.UnescapeString(g[3])
		if href == "" {
			t.Errorf("the summary's group %q is no link:\n%s", need, summary)
			continue
		}
		code, page := fx.get(t, href)
		if code != http.StatusOK || !strings.Contains(page, `data-need="`+need+`"><a href="/">`) ||
			!strings.Contains(page, `<p class="chosen-need">showing the nodes that need <span class="need need-`+need+`">`+need+`</span>`) {
			t.Errorf("the group %q's link %s: %d, not the page with it chosen:\n%s", need, href, code, page)
		}
	}
	// The calm group's link: only the nodes needing nothing.
	_, body = fx.get(t, "/?need=nothing")
	if strings.Contains(body, `id="node-ace"`) || strings.Contains(body, `id="node-novox"`) || !strings.Contains(body, `id="node-calm000"`) ||
		!strings.Contains(body, fmt.Sprintf("rows 1–%d of %d of %d", console.MaxRows, console.MaxRows+20, console.MaxRows+22)) ||
		!strings.Contains(body, `<p class="calm">Nothing needs an operator.</p>`) {
		t.Errorf("need=nothing:\n%s", body)
	}

	// A group's link: only the nodes with that need, in both tables.
	_, body = fx.get(t, "/?need=approval")
	if !strings.Contains(body, `id="need-novox"`) || strings.Contains(body, `id="need-ace"`) ||
		strings.Contains(body, `id="node-ace"`) || !strings.Contains(body, `id="node-novox"`) {
		t.Errorf("need=approval:\n%s", body)
	}
	if !strings.Contains(body, `<li class="group chosen" data-need="approval"><a href="/">`) {
		t.Error("the chosen group is not marked, or its link does not show every node again")
	}
	// The search finds a node by a part of a need.
	_, body = fx.get(t, "/?q=appro")
	if !strings.Contains(body, `id="need-novox"`) || strings.Contains(body, `id="need-ace"`) {
		t.Errorf("search appro:\n%s", body)
	}
	// Every node, paged: the first page, then the rest.
	_, body = fx.get(t, "/")
	total := console.MaxRows + 22
	if n := strings.Count(body, `<tr id="node-`); n != console.MaxRows ||
		!strings.Contains(body, fmt.Sprintf("rows 1–%d of %d", console.MaxRows, total)) ||
		!strings.Contains(body, `<a class="next" href="/?npage=2">`) {
		t.Errorf("every node, page 1: %d rows", n)
	}
	_, body = fx.get(t, "/?npage=2")
	if n := strings.Count(body, `<tr id="node-`); n != 22 || !strings.Contains(body, fmt.Sprintf("rows %d–%d of %d", console.MaxRows+1, total, total)) ||
		!strings.Contains(body, `<a class="prev" href="/">`) || !strings.Contains(body, `id="node-novox"`) {
		t.Errorf("every node, page 2: %d rows", n)
	}
	// The live stream of a page is that page.
	if !strings.Contains(body, `data-src="/events?npage=2"`) {
		t.Error("the page's live stream is not of its page")
	}
}

// Pages of the nodes needing an operator: ?page=2 shows the next
// MaxRows, most pressing first, and says which rows they are.
func TestFleetNeedsPaged(t *testing.T) {
	t.Parallel()
	f := newFake()
	for i := range console.MaxRows + 3 {
		f.append(fmt.Sprintf("n%04d", i), &events.Want{Modules: []events.WantModule{provisioner}})
	}
	fx := start(t, f)
	body := fx.waitPage(t, "/", "3 more nodes")
	if !strings.Contains(body, `<a class="next" href="/?page=2">`) {
		t.Fatal("no link to the next page of the nodes needing an operator")
	}
	_, body = fx.get(t, "/?page=2")
	if n := strings.Count(body, `class="need-row"`); n != 3 || !strings.Contains(body, fmt.Sprintf("rows %d–%d of %d, most pressing first", console.MaxRows+1, console.MaxRows+3, console.MaxRows+3)) {
		t.Errorf("page 2 of the needs: %d rows", n)
	}
	// A page past the last shows the last, not "rows 1001–1000 of 1003".
	_, body = fx.get(t, "/?page=99&npage=99")
	if n := strings.Count(body, `class="need-row"`); n != 3 || !strings.Contains(body, fmt.Sprintf("rows %d–%d of %d, most pressing first", console.MaxRows+1, console.MaxRows+3, console.MaxRows+3)) ||
		!strings.Contains(body, fmt.Sprintf("rows %d–%d of %d", console.MaxRows+1, console.MaxRows+3, console.MaxRows+3)) {
		t.Errorf("page 99 of the needs: %d rows\n%s", n, body)
	}
	// ... and says so (a fresh user's finding V6: clamped silently).
	for _, note := range []string{"page 99 of the nodes needing an operator is past the last: showing page 2, the last",
		"page 99 of every node is past the last: showing page 2, the last"} {
		if !strings.Contains(body, note) {
			t.Errorf("page 99 does not say %q:\n%s", note, body)
		}
	}
	if _, body = fx.get(t, "/?page=2"); strings.Contains(body, "past the last") {
		t.Errorf("page 2 of 2 says it is past the last:\n%s", body)
	}
}

// A burst of changes reaches an open page as at most one frame a second
// (and one at once), however many changes there are.
func TestFleetEventsBounded(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	fx := start(t, f)
	fx.waitPage(t, "/", `id="node-ace"`)
	resp, err := http.Get(fx.srv.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	frames := make(chan time.Time, 256)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if sc.Text() == "event: fleet" {
				frames <- time.Now()
			}
		}
		close(frames)
	}()
	got := []time.Time{<-frames} // the first, at once
	for i := range 200 {
		healthy(f, fmt.Sprintf("b%03d", i))
	}
	fx.waitPage(t, "/?q=b199", `id="node-b199"`)
	// Every frame of the next three seconds: the burst's changes,
	// coalesced.
	window := time.After(3 * time.Second)
collect:
	for {
		select {
		case at, ok := <-frames:
			if !ok {
				t.Fatal("the event stream ended")
			}
			got = append(got, at)
		case <-window:
			break collect
		}
	}
	if len(got) < 2 {
		t.Fatal("no frame after the burst")
	}
	for k := 1; k < len(got); k++ {
		if gap := got[k].Sub(got[k-1]); gap < 900*time.Millisecond {
			t.Errorf("frames %d and %d %s apart: more than one a second", k-1, k, gap)
		}
	}
}

// A node's acknowledged journal warnings (meshfold ack, issue 25) leave
// "needs an operator" and are listed apart, with who acked them; a
// warning stored after the ack flags the node again.
func TestFleetAcked(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "shanks")
	f.append("shanks", &events.Journal{Level: events.LevelWarn, Msg: "something to read", Cause: 1})
	fx := start(t, f)
	fx.waitPage(t, "/", `id="need-shanks"`)
	ack := f.append("shanks", &events.Ack{By: "alice"})
	body := fx.waitPage(t, "/", `id="acked"`)
	if strings.Contains(body, `id="need-shanks"`) ||
		!strings.Contains(body, fmt.Sprintf("shanks 1 journal warning through #%d acknowledged by alice", ack.Seq)) {
		t.Errorf("the acked warning is not apart from the needs:\n%s", body)
	}
	f.append("shanks", &events.Journal{Level: events.LevelError, Msg: "something new", Cause: 1})
	fx.waitPage(t, "/", `id="need-shanks"`)
}

// A fresh user's finding F3: after a serve's kill -9, the snapshots the
// console loads lag the stream (the events just before the kill are past
// their checkpoint), and the follow delivers only new messages: the
// fleet page showed a node's old want and plan until the node's next
// event, while `meshfold fleet` read it live. The console reads such
// nodes live at start, by the rule fleet's table reads them
// (query.LaggingNodes): ace's new want, bob's retirement and cid, which
// no snapshot holds, show without another event of theirs.
func TestFleetReadsLiveWhatTheSnapshotsLag(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	healthy(f, "bob")
	healthy(f, "dee")
	f.snapshot()
	// Stored before the console follows, past the checkpoint: Follow
	// never hands them over.
	unseen := func(node string, p events.Payload) events.Event {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.s.Append(node, p)
	}
	want := unseen("ace", &events.Want{Modules: []events.WantModule{provisioner, mbgMod}})
	unseen("bob", &events.Pause{By: "alice", Reason: "disk swap"})
	unseen("cid", &events.Want{Modules: []events.WantModule{provisioner}})
	fx := start(t, f)
	body := fx.waitPage(t, "/", `id="node-cid"`)
	body = fx.waitPage(t, "/", `id="need-bob"`)
	row := regexp.MustCompile(`(?s)<tr id="node-ace".*?</tr>`).FindString(body)
	if !strings.Contains(row, fmt.Sprintf("#%d", want.Seq)) {
		t.Errorf("ace's row does not show its want #%d, stored after the snapshots' checkpoint:\n%s", want.Seq, row)
	}
	if !strings.Contains(body, `id="node-dee"`) {
		t.Errorf("dee, whose snapshot is current, is missing:\n%s", body)
	}
}
