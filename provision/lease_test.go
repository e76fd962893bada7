package provision_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A provisioner whose credentials do not reach its lease (issued before
// the provisioner held one: an upgrade that kept the provisioner's creds
// file) still fills: its lease only tells whether it is alive, and a
// provisioner that never fills is what the lease was to make visible.
// It says, at error level, that it runs without its lease and how to get
// one. Run retried the denied claim forever and filled nothing.
func TestProvisionerWithoutLeasePermissionStillFills(t *testing.T) {
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{
		"all": {},
		// The provisioner's grants before its lease: nothing of the node
		// lease bucket.
		"prov": {Deny: []string{"$KV.MESH_NODES.>", "$JS.API.STREAM.INFO.KV_MESH_NODES", "$JS.API.DIRECT.GET.KV_MESH_NODES.>"}},
	})
	nc, js := ps.Connect(t, "all")
	_, cfg, err := store.EnsureStream(ctxT(t), js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects()), logs: &storetest.SyncBuffer{}}
	e.startNode(t) // creates the node lease bucket: its own lease
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)

	pnc, pjs := ps.Connect(t, "prov")
	rep := newReports()
	c, err := provision.New(pnc, pjs, provision.Config{Node: "ace", From: from, Account: "prov", Stream: cfg, Logger: e.logger(),
		Timeout: time.Second, OnFill: rep.on, Resync: -1, Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case got := <-rep.ch:
		if len(got.r.Filled) != 1 {
			t.Fatalf("first pass: %+v, want filled", got.r)
		}
	case err := <-done:
		t.Fatalf("Run returned %v before a fill", err)
	case <-time.After(wait):
		t.Fatalf("no fill pass within %s: the provisioner waits for a lease its credentials do not reach\n%s", wait, e.logs.String())
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	if logs := e.logs.String(); !strings.Contains(logs, "running without the provisioner lease") {
		t.Fatalf("no word that it runs without its lease:\n%s", logs)
	}
	noLeak(t, e.logs.String())
}

// A provisioner stopped cleanly (its context ended: SIGINT, SIGTERM)
// says so, with its lease released, so that its log tells the stop from
// a kill -9 (a fresh user's finding U24: nothing at all).
func TestProvisionerCleanStopSaid(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	rep := newReports()
	c := e.client(t, from, rep, func(c *provision.Config) { c.Lease = true })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	rep.next(t)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return")
	}
	if want := "provisioner stopping: lease released; the filled files stay as they are"; !strings.Contains(e.logs.String(), want) {
		t.Errorf("the stopped provisioner's log does not say %q:\n%s", want, e.logs.String())
	}
}
