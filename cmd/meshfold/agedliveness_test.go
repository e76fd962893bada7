package main

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// A fresh user's finding F6: with serve --max-age shorter than a node
// agent's life, the agent's up ages out of the stream while the agent
// lives; its kill -9 was then never recorded: the liveness watch's down
// expected the aged-out up as the subject's last event, met an empty
// subject (a conflict), read it again, found no event, and dropped the
// down without a word. state, fleet and metrics said "agent up" until
// serve restarted (17 minutes on the user's mesh, where it looked like an
// effect of `auth revoke`). Real servers, serve --auth, the agent a
// process killed by pid.
func TestAgentDownAfterItsUpAgedOut(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a process: not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	out, done := newNoteBuffer(), make(chan int, 1)
	go func() {
		done <- run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0",
			"--max-age", "2s", "--dedup-window", "1s", "--log-level", "info"}, nil, out, out)
	}()
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("serve said:\n%s", out.String())
		}
	})
	out.waitText(ctx, t, "serve", "serving NATS at ")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(out.String())[1]
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{url}, Name: "test", Creds: d.CredsPath("operator-read")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.StreamConfig{}.WithDefaults()
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	// last is ace's newest agent event in the stream, nil when it holds none.
	last := func() *events.Agent {
		m, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindAgent)
		if errors.Is(err, store.ErrNoMessage) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		a, _ := m.Event.Payload.(*events.Agent)
		return a
	}
	state := func() string {
		code, sout, errs := runCLI(ctx, "state", "ace", "--server", url, "--creds", d.CredsPath("operator-read"))
		if code != exitOK {
			t.Fatalf("state ace: %d %s", code, errs)
		}
		return sout
	}

	a := startMeshfold(t, "node", "ace", "--runtime", "record", "--root", filepath.Join(base, "root"),
		"--state-dir", filepath.Join(base, "state"), "-s", url, "--creds", d.CredsPath("node-ace"),
		"--trust", filepath.Join(dir, trustFileName))
	var claim string
	waitfor.Until(t, time.Minute, "ace's agent up recorded", func() bool {
		if e := last(); e != nil && e.State == events.AgentUp {
			claim = e.Claim
			return true
		}
		return false
	})
	// The agent lives on, renewing its lease; its up ages out (2 s).
	waitfor.Until(t, time.Minute, "ace's up aged out of the stream", func() bool { return last() == nil })
	if s := state(); !regexp.MustCompile(`agent\s+up since`).MatchString(s) {
		t.Fatalf("state ace after the up aged out, before the kill: want agent up:\n%s", s)
	}

	if err := a.cmd.Process.Kill(); err != nil { // SIGKILL, by pid
		t.Fatal(err)
	}
	killed := time.Now()
	// Within the lease TTL (15 s), its grace after serve's start, and
	// the machine's load.
	waitfor.Until(t, 2*time.Minute, "ace's agent down recorded", func() bool {
		e := last()
		return e != nil && e.State == events.AgentDown
	})
	t.Logf("kill -9 → down recorded in %s", time.Since(killed).Round(time.Millisecond))
	e := last()
	if e.Claim != claim || e.Why != events.WhyExpired || e.PID != a.cmd.Process.Pid {
		t.Errorf("the down: claim %q why %q pid %d, want claim %q (the up's), expired, pid %d", e.Claim, e.Why, e.PID, claim, a.cmd.Process.Pid)
	}
	if s := state(); !strings.Contains(s, "DOWN since") {
		t.Errorf("state ace after the down: want agent DOWN:\n%s", s)
	}
}
