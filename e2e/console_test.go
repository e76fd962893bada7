package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/query"
)

// chromium returns the path of a Chromium (or Chrome) binary. Without one
// the browser tests are skipped, except in CI, where they must run: .ci/run
// installs Debian's chromium when it is missing.
func chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium binary, and CI is set: the browser tests must run (.ci/run installs Debian's chromium)")
	}
	t.Skip("no chromium binary (apt-get install chromium); CI is not set, so the browser tests are skipped")
	return ""
}

// browser starts a headless Chromium with a fresh profile and returns a
// context to run actions in. The flags keep it off the network: without
// the background-networking ones, a closed network refuses its
// connections and it stalls.
func browser(t testing.TB, exe string) context.Context {
	t.Helper()
	profile, err := os.MkdirTemp("", "meshfold-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(profile),
		// With disable-dev-shm-usage its shared memory files go to
		// TMPDIR, and a browser stopped at cleanup leaves them there
		// (/tmp/org.chromium.Chromium.*): they go with the profile.
		chromedp.Env("TMPDIR=" + profile),
		chromedp.WindowSize(1280, 900),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		acancel() // stops the browser it started, and waits for it
		// Chromium's helpers may still write in the profile for a moment.
		deadline := time.Now().Add(5 * time.Second)
		for os.RemoveAll(profile) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond) // retrying a removal, bounded
		}
	})
	// The first run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// step runs a within the test's deadline.
func step[T any](t testing.TB, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	v, err := chromedp.Run(sctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// screenshot saves a full-page PNG as name in $MESHFOLD_SCREENSHOTS (the
// README's pictures: MESHFOLD_SCREENSHOTS=$PWD/docs go test ./e2e -run
// Console), or takes it and drops it.
func screenshot(t testing.TB, ctx context.Context, name string) {
	t.Helper()
	png := step(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if dir := os.Getenv("MESHFOLD_SCREENSHOTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// noSecret fails when the page in the browser holds the fill content.
func noSecret(t *testing.T, ctx context.Context, page string) {
	t.Helper()
	html := step(t, ctx, "read "+page, chromedp.OuterHTML("html"))
	if strings.Contains(html, secret) {
		t.Errorf("the %s page holds the filled content", page)
	}
}

// crashing is incident 1's mesh-build-go: once applied, its process
// exits for want of the broker credential, over and over, until the file
// is on disk. It reports the module failed, with restarts and the exit,
// while the file is missing under the node's root (a simulated crash
// loop: the process runtime's real one is tested in node/process).
type crashing struct {
	node.Runtime
	file    string // the credential's path on disk
	applied atomic.Bool
	changes chan struct{}
}

func (c *crashing) Apply(ctx context.Context, m events.PlanModule) error {
	if err := c.Runtime.Apply(ctx, m); err != nil {
		return err
	}
	if m.Name == mbg {
		c.applied.Store(true)
	}
	return nil
}

func (c *crashing) Running(ctx context.Context) ([]events.HaveModule, error) {
	mods, err := c.Runtime.Running(ctx)
	if err != nil || !c.applied.Load() {
		return mods, err
	}
	if _, err := os.Stat(c.file); err == nil {
		return mods, nil
	}
	for i := range mods {
		if mods[i].Name == mbg {
			mods[i].State, mods[i].Restarts, mods[i].Exit = events.Failed, 3, "status 1"
		}
	}
	return mods, nil
}

// Changes and Filled make it a node.Supervisor: a fill changes what runs.
func (c *crashing) Changes() <-chan struct{} { return c.changes }

func (c *crashing) Filled(_ context.Context, module string) {
	if module == mbg {
		select {
		case c.changes <- struct{}{}:
		default:
		}
	}
}

// The console in a real browser, on a mesh playing incident 1: the fleet
// page lists ace first while its refused credential is owed, then, without
// a reload, for its crash-looping module (before novox, which waits for an
// approval), then not at all once the knock's fill lands; the node's knock
// explains itself in a click (the refusal, the want, the settle). No page
// holds the filled content.
func TestConsoleInBrowser(t *testing.T) {
	// Not parallel: a Chromium, CPU-bound.
	exe := chromium(t)
	m := newMesh(t) // its reconciler's state service answers once newMesh returns
	var srvURL string
	{
		nc, err := m.srv.Connect(nats.Name("console"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := query.New(nc, query.Config{Stream: m.cfg})
		if err != nil {
			t.Fatal(err)
		}
		c, err := console.New(console.Config{Source: r, Logger: m.logger("console")})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		hs := httptest.NewServer(c) // loopback
		srvURL = hs.URL
		t.Cleanup(func() {
			hs.CloseClientConnections()
			hs.Close()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("console: %v", err)
			}
			nc.Close()
		})
	}
	ctx := m.ctx()

	// shanks runs its provisioner and needs nothing.
	shanks := m.newNode("shanks")
	shanks.startAgent(nil)
	w := must(m.want(ctx, "shanks", provisionerMod))(t)
	p, _ := must2(m.planOf(ctx, "shanks", w))(t)
	must(m.settled(ctx, "shanks", p))(t)

	// novox has no agent yet and waits for an approval: it needs an
	// operator too, after a crash loop.
	w = must(m.want(ctx, "novox", provisionerMod,
		events.WantModule{Name: "nats", Build: "img:2.10", RunsAs: "nats", RequiresApproval: true}))(t)
	must2(m.planOf(ctx, "novox", w))(t)

	b := browser(t, exe)
	var rt *crashing
	wrap := func(n *nodeT, g node.Runtime) node.Runtime {
		rt = &crashing{Runtime: g, file: filepath.Join(n.root, creds), changes: make(chan struct{}, 1)}
		return rt
	}
	n, p1, p2 := incident1With(t, m, wrap, func(n *nodeT, _ *gate) {
		// The write was refused, mesh-build-go's plan is unsettled: ace
		// needs an operator, and comes first.
		step(t, b, "open the fleet page", chromedp.Navigate(srvURL+"/"))
		step(t, b, "ace listed as owing", chromedp.Poll[chromedp.Void](
			`document.querySelector('#need-ace .need-owed') !== null`, chromedp.WithPollingTimeout(deadline)))
		first := step(t, b, "the first row needing an operator",
			chromedp.Evaluate[string](`document.querySelector('#needs tbody tr').dataset.node`))
		if first != "ace" {
			t.Errorf("the first node needing an operator is %q, want ace", first)
		}
		step(t, b, "mark the page", chromedp.Evaluate[chromedp.Void](`window.meshfoldMark = 1`))
		noSecret(t, b, "fleet")
		// As on the real mesh, the provisioner is not there to fill when
		// the knock comes: mesh-build-go crash-loops on the missing file.
		n.provisioner.stop(t)
	})

	// The node settles mesh-build-go, which crash-loops; the reconciler
	// knocks. The open page, without a reload (the mark set on it is
	// still there), lists ace first, for its crash-looping module and the
	// file it waits for.
	knock := must(m.waitEvent(ctx, "ace", events.KindKnock, func(events.Event) bool { return true }))(t)
	cause := knock.Payload.(*events.Knock).Cause
	step(t, b, "the live update: a crash loop", chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => {
		const rows = document.querySelectorAll('#needs tbody tr'), r = rows[0];
		return rows.length === 2 && rows[1].dataset.node === 'novox' && r.dataset.node === 'ace' && r.querySelector('.need').textContent === 'failed' &&
			r.querySelector('.failed[data-module="%s"]') !== null && r.textContent.includes(%q) &&
			document.getElementById('node-ace').dataset.knock === '%d' && window.meshfoldMark === 1;
	})()`, mbg, creds, cause), chromedp.WithPollingTimeout(deadline)))
	screenshot(t, b, "console-fleet.png")
	noSecret(t, b, "fleet, crash-looping")

	// The provisioner is back: it fills on start, the module runs, and the
	// page follows: ace needs nothing.
	n.startProvisioner("prov")
	healed(t, m, n, p1, p2)
	if _, ok := any(rt).(node.Supervisor); !ok {
		t.Fatal("the crashing runtime is no node.Supervisor")
	}
	// An agent that does not follow its runtime's changes yet reports the
	// module running in its next have: on its start.
	n.agent.stop(t)
	n.startAgent(rt)
	step(t, b, "the live update: healed", chromedp.Poll[chromedp.Void](`(() => {
		const r = document.getElementById('node-ace');
		return r !== null && r.dataset.owed === '0' && document.getElementById('need-ace') === null &&
			document.getElementById('need-novox') !== null && window.meshfoldMark === 1;
	})()`, chromedp.WithPollingTimeout(deadline)))
	noSecret(t, b, "fleet, healed")

	// Open the node, click the knock. The fleet page swaps its sections
	// in live (up to once a second): a mouse press and release that
	// straddle a swap land on two different links and make no click, so
	// the link is clicked in the page, in one step, as it is then.
	step(t, b, "open ace", chromedp.WaitEvent(page.LoadEventFired, nil,
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#node-ace a').click()`)))
	sel := fmt.Sprintf("#ev-%d", knock.Seq)
	step(t, b, "the knock's mark", chromedp.WaitReady(chromedp.CSS(sel)))
	step(t, b, "click the knock", chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel))))
	chain := step(t, b, "the why", chromedp.Text(chromedp.CSS("#why")))
	refusal := must(m.events(ctx, "ace", events.KindRefusal))(t)[0]
	plan2 := must(m.events(ctx, "ace", events.KindPlan))(t)
	var want2 uint64
	for _, ev := range plan2 {
		if ev.Seq == p2 {
			want2 = ev.Payload.(*events.Plan).Want
		}
	}
	for what, s := range map[string]string{
		"the refusal": fmt.Sprintf("#%d refusal", refusal.Seq),
		"its reason":  "undeclared",
		"the want":    fmt.Sprintf("#%d want", want2),
		"the settle":  fmt.Sprintf("#%d settle", cause),
		"the plan":    fmt.Sprintf("#%d plan", p2),
	} {
		if !strings.Contains(chain, s) {
			t.Errorf("the knock's chain does not name %s (%q):\n%s", what, s, chain)
		}
	}
	screenshot(t, b, "console-node.png")
	noSecret(t, b, "node")

	// A newer event of ace: the open node page offers it, without a reload.
	ap := must(m.approve(ctx, "ace", mbg, "g:1"))(t)
	step(t, b, "the node page's live offer", chromedp.Poll[chromedp.Void](
		fmt.Sprintf(`document.querySelector('#node-live').dataset.newest === '%d'`, ap), chromedp.WithPollingTimeout(deadline)))

	// Follow the chain: the refusal's link opens its own explanation.
	step(t, b, "follow the refusal", chromedp.WaitEvent(page.LoadEventFired, nil,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#why a.why-link[data-seq="%d"]`, refusal.Seq)))))
	if head := step(t, b, "the refusal's why", chromedp.Text(chromedp.CSS("#why h2"))); !strings.Contains(head, fmt.Sprintf("#%d refusal", refusal.Seq)) {
		t.Errorf("after following the refusal's link the why is of %q", head)
	}
	// As of the refusal: the state owes the credential.
	step(t, b, "as of the refusal", chromedp.Navigate(fmt.Sprintf("%s/node/ace?as_of=%d", srvURL, refusal.Seq)))
	if asOf := step(t, b, "the state as of", chromedp.Text(chromedp.CSS("#asof-text"))); !strings.Contains(asOf, creds+" (undeclared") {
		t.Errorf("as of the refusal the state owes nothing:\n%s", asOf)
	}
	noSecret(t, b, "as-of")

	// A link or address that is wrong gets the house page: the console's
	// header, what is wrong, and a way back that leads to the same page
	// without it (a fresh user's finding: bare text, no way back).
	for _, c := range []struct{ path, says, back string }{
		{fmt.Sprintf("/node/ace?as_of=%d&why=abc", refusal.Seq), `why: "abc" is not a stream sequence`, fmt.Sprintf("/node/ace?as_of=%d", refusal.Seq)},
		{"/node/ace?from=yesterday-ish", "from: ", "/node/ace"},
		{"/node/Ace!", `node "Ace!"`, "/"},
	} {
		step(t, b, "open "+c.path, chromedp.Navigate(srvURL+c.path))
		if head := step(t, b, "the error page's header", chromedp.Text(chromedp.CSS("header.top a.brand"))); head != "meshfold" {
			t.Errorf("%s: no console header (%q)", c.path, head)
		}
		if msg := step(t, b, "the error", chromedp.Text(chromedp.CSS("p.error"))); !strings.Contains(msg, c.says) {
			t.Errorf("%s: the page says %q, not %q", c.path, msg, c.says)
		}
		noSecret(t, b, "error "+c.path)
		step(t, b, "go back", chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS("a.back"))))
		if at := step(t, b, "where back leads", chromedp.Evaluate[string](`location.pathname + location.search`)); at != c.back {
			t.Errorf("%s: back leads to %q, want %q", c.path, at, c.back)
		}
	}
}
