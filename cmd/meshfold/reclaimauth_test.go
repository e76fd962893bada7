package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
)

// After a restart of serve --auth longer than the node lease's TTL, the
// node agent claims its expired lease again and reads its own newest
// agent event (the down the reconciler may have recorded, which its have
// must follow) as its node's credentials allow: no permission violation
// is logged (a fresh user's finding F5: ~15 s of "Permissions Violation
// for Publish to $JS.API.DIRECT.GET.MESH.0.mesh.n10.agent" after every
// serve restart, and the have after the down came only when the reads
// gave up).
func TestReclaimUnderAuthReadsOwnAgentEvent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	listen := "127.0.0.1:" + freePort(t)
	serve := func() (stop func()) {
		cctx, cancel := context.WithCancel(ctx)
		out := &lines{ch: make(chan string, 16)}
		done := make(chan int, 1)
		go func() {
			done <- run(cctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", listen, "--log-level", "warn"}, nil, out, out)
		}()
		select {
		case <-done:
			t.Fatal("serve exited at start")
		default:
		}
		waitLine(ctx, t, out, "serving NATS at ")
		return func() {
			cancel()
			if code := <-done; code != exitOK {
				t.Errorf("serve: exit %d", code)
			}
		}
	}
	stopServe := serve()

	agentCtx, stopAgent := context.WithCancel(ctx)
	log := &lines{ch: make(chan string, 4096)}
	var agentLog strings.Builder
	agentDone := make(chan int, 1)
	go func() {
		agentDone <- run(agentCtx, []string{"node", "ace", "--runtime", "record", "--root", filepath.Join(base, "root"),
			"--state-dir", filepath.Join(base, "state"), "--trust", filepath.Join(dir, trustFileName),
			"--server", "nats://" + listen, "--creds", filepath.Join(dir, "creds", "node-ace.creds"), "--log-level", "info"}, nil, log, log)
	}()
	defer func() {
		stopAgent()
		<-agentDone
	}()
	// next returns the agent's next log line (failing after a minute).
	next := func(what string) string {
		t.Helper()
		select {
		case l := <-log.ch:
			agentLog.WriteString(l)
			return l
		case code := <-agentDone:
			t.Fatalf("the agent exited %d waiting for %s:\n%s", code, what, agentLog.String())
		case <-time.After(time.Minute):
			t.Fatalf("no %s from the agent within a minute:\n%s", what, agentLog.String())
		}
		return ""
	}
	until := func(what, text string) {
		t.Helper()
		for !strings.Contains(next(what), text) {
		}
	}
	until("the agent running", "node agent running")

	// serve goes away for longer than the lease's TTL: the lease has
	// expired when it comes back.
	stopServe()
	outage := time.NewTimer(store.DefaultNodeLeaseTTL + time.Second) // the outage's length, not a wait for an event
	<-outage.C
	began := time.Now()
	stopServe = serve()
	defer stopServe()
	until("the re-claim", "claimed again")
	until("its agent event read after the re-claim", "node lease claimed again after it expired: publishing a have")
	t.Logf("serve back → lease claimed again, the agent event read: %s", time.Since(began))
	for {
		select {
		case l := <-log.ch:
			agentLog.WriteString(l)
			continue
		default:
		}
		break
	}
	if s := agentLog.String(); strings.Contains(s, "iolation") {
		t.Errorf("the agent logged a permission violation:\n%s", s)
	}
}
