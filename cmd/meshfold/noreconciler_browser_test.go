package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// The console's fleet page in a headless Chromium, a real reconciler
// process killed with SIGKILL and a have appended after: the open page,
// without a reload, says no reconciler answers, marks ace's row older
// than its events and not stale-have, and its "as of" names the row (a
// fresh user's findings M9 and m1: the page counted nodes stale-have and
// said nothing of reconcilers; its "as of" was when it was drawn).
func TestConsoleInBrowserWithTheReconcilerKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Chromium and a reconciler process")
	}
	exe := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no chromium binary, and CI is set: the browser tests must run")
		}
		t.Skip("no chromium binary; CI is not set, so the browser test is skipped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m := startMesh(t)
	dir := t.TempDir()
	proc := startMeshfold(t, "reconcile", "--server", m.e.ClientURL(), "--signing-key", filepath.Join(dir, signingKeyFile),
		"--snapshot-interval", "100ms", "--log-level", "warn")
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	w, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	snaps := snapsOf(t, m)
	waitfor.Until(t, time.Minute, "ace's state stored and checkpointed past its plan", func() bool {
		b, _, err := snaps.GetNode(ctx, "ace")
		if err != nil {
			return false
		}
		st, err := reconcile.UnmarshalState(b)
		if err != nil || st.Want == nil || st.Want.Seq != w.Seq || st.NewestPlan == 0 {
			return false
		}
		ck, err := snaps.Checkpoint(ctx, events.Partition("ace", m.cfg.Partitions))
		return err == nil && ck >= st.Seq
	})

	nc, err := m.e.Connect(nats.Name("console"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r, err := query.New(nc, query.Config{Stream: m.cfg, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Source: r})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	hs := httptest.NewServer(c) // loopback
	defer func() {
		hs.CloseClientConnections()
		hs.Close()
		ccancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
	}()

	profile := t.TempDir()
	actx, acancel := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(exe), chromedp.UserDataDir(profile), chromedp.Env("TMPDIR="+profile),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true))
	defer acancel()
	b, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	browse(t, b, "open the fleet page", chromedp.Navigate(hs.URL+"/"))
	browse(t, b, "ace's row", chromedp.Poll[chromedp.Void](`document.getElementById('node-ace') !== null`, chromedp.WithPollingTimeout(time.Minute)))
	browse(t, b, "mark the page", chromedp.Evaluate[chromedp.Void](`window.meshfoldMark = 1`))

	if err := proc.cmd.Process.Signal(syscall.SIGKILL); err != nil { // by pid: the process this test started
		t.Fatal(err)
	}
	select {
	case <-proc.done:
	case <-ctx.Done():
		t.Fatalf("reconciler pid %d did not exit on SIGKILL", proc.cmd.Process.Pid)
	}
	h, err := pub.Append(ctx, "ace", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = chromedp.Run(b, chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => {
		const n = document.getElementById('noreconciler'), r = document.getElementById('node-ace'), a = document.querySelector('.asof');
		return n !== null && n.textContent.startsWith('No reconciler answers since ') &&
			r !== null && r.textContent.includes('older than its events (#%d)') && r.querySelector('.need-stale-have') === null &&
			a !== null && a.textContent.includes('but for the rows of 1 nodes, older than their events') && window.meshfoldMark === 1;
	})()`, h.Seq), chromedp.WithPollingTimeout(time.Minute)))
	if err != nil {
		html, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.getElementById('fleet').outerHTML`))
		t.Fatalf("the open page, the reconciler killed and ace's have #%d appended, does not say so: %v\n%s", h.Seq, err, html)
	}
}

// browse runs a in the browser b, failing t with what.
func browse[T any](t *testing.T, b context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(b, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}
