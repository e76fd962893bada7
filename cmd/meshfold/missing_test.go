package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/examples"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

// refillMesh is a mesh of real processes for a filled file deleted on
// the node: meshfold as shipped runs the agent of ace (its shims and
// modules, with extra flags) and a provisioner of ace from a directory
// with --resync 0 (no timer refills anything); the want places an app
// that exits 1 without its file, which is filled and running when it
// returns.
type refillMesh struct {
	s       *sealedMesh
	path    string // the declared path
	file    string // where it is on the node
	secret  []byte
	pid     int    // the app's process
	last    uint64 // the stream's last sequence once it runs
	holds   func() bool
	running func(*events.Have) bool
}

func startRefillMesh(t *testing.T, agentFlags ...string) *refillMesh {
	t.Helper()
	s := &sealedMesh{t: t, m: startMesh(t), bin: meshfoldBinary(t)}
	s.trust = s.m.serveSigned(t)
	dir := t.TempDir()
	for d := dir; d != filepath.Dir(filepath.Dir(dir)); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil { // modules may run as another user
			t.Fatal(err)
		}
	}
	s.root, s.state = filepath.Join(dir, "root"), filepath.Join(dir, "state")
	t.Cleanup(func() { killModules(t, filepath.Join(s.state, "process")) })
	s.acct = currentOrNobody(t)
	const path = "/run/app/token"
	secret := []byte("refilled-credential-not-in-any-stream")
	secrets := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(filepath.Join(secrets, "app", filepath.Dir(path)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "app", path), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	// The app exits 1 without its credential, as mesh-build-go did.
	src := filepath.Join(dir, "app")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "meshfold.json"), []byte(`{"command":["run.sh"],"stop_timeout":"2s"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each start appends its pid to starts (one line a start).
	s.starts = filepath.Join(dir, "starts")
	if err := os.WriteFile(s.starts, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.starts, 0o666); err != nil { // past the umask: the app may run as another user
		t.Fatal(err)
	}
	run := "#!/bin/sh\necho $$ >> " + s.starts + "\n[ -f \"$MESHFOLD_ROOT" + path + "\" ] || { echo 'missing credential' >&2; exit 1; }\nexec sleep 3600\n"
	if err := os.WriteFile(filepath.Join(src, "run.sh"), []byte(run), 0o755); err != nil {
		t.Fatal(err)
	}
	idle, err := examples.WriteIdle(filepath.Join(dir, "idle"))
	if err != nil {
		t.Fatal(err)
	}
	appBuild, provBuild := s.push(src), s.push(idle)
	s.agent, s.agentErr = s.start(append([]string{"node", "ace", "--root", s.root, "--state-dir", s.state, "--log-level", "info"}, agentFlags...)...)
	s.prov, s.provErr = s.start("provision", "ace", "--from", secrets, "--account", s.acct, "--resync", "0", "--log-level", "info")
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: provBuild, RunsAs: s.acct, Provisioner: true},
		{Name: "app", Build: appBuild, RunsAs: s.acct, Files: []events.File{{Path: path, Mode: "0600"}}},
	}}
	if _, err := store.NewPublisher(s.m.js, s.m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(s.root, path)
	holds := func() bool {
		b, err := os.ReadFile(file)
		return err == nil && bytes.Equal(b, secret)
	}
	running := func(h *events.Have) bool {
		i := slices.IndexFunc(h.Modules, func(m events.HaveModule) bool { return m.Name == "app" })
		return i >= 0 && h.Modules[i].State == events.Running && len(h.Missing) == 0
	}
	waitfor.Until(t, time.Minute, "the credential filled", holds)
	// The app runs once its recorded process is past its check (it execs
	// sleep). Two ways lead there: it found the file, and no have follows
	// the settle's, which reported the file gone at the agent's start
	// (the fold clears that on the filled); or it exited first and was
	// woken by the fill, and a have saying it runs with nothing missing
	// follows that start: wait for it, so that no have of this start
	// comes after last.
	pid := waitfor.Value(t, time.Minute, "the app's process past its check", func() (int, bool) {
		p, ok := readPID(s.state, "app")
		return p, ok && commandOf(p) == "sleep"
	})
	if data, _ := os.ReadFile(s.starts); bytes.Count(data, []byte("\n")) > 1 {
		waitHave(t, s.m, running)
	}
	r0 := &refillMesh{s: s}
	r0.waitStateClear(t)
	last := lastSeq(t, s)

	return &refillMesh{s: s, path: path, file: file, secret: secret, pid: pid, last: last, holds: holds, running: running}
}

// missingKnock returns the first have after r.last that reported r's file
// missing, and fails unless a knock with reasons [missing] was caused by it.
func (r *refillMesh) missingKnock(t *testing.T) uint64 {
	t.Helper()
	var reported uint64
	for _, ev := range readEvents(t, r.s.m, "ace", events.KindHave) {
		if h := ev.Payload.(*events.Have); ev.Seq > r.last && slices.Contains(h.Missing, events.MissingFile{Module: "app", Path: r.path}) {
			reported = ev.Seq
			break
		}
	}
	if reported == 0 {
		t.Fatal("no have reported the file missing")
	}
	knocked := slices.ContainsFunc(readEvents(t, r.s.m, "ace", events.KindKnock), func(ev events.Event) bool {
		k := ev.Payload.(*events.Knock)
		return k.Cause == reported && slices.Equal(k.Reasons, []events.KnockReason{events.KnockMissing})
	})
	if !knocked {
		t.Fatalf("no knock with reason missing caused by have #%d", reported)
	}
	return reported
}

// waitBack waits for r's file to be on the node again with its content.
func (r *refillMesh) waitBack(t *testing.T, what string) {
	t.Helper()
	waitfor.Until(t, time.Minute, what, func() bool {
		if _, err := os.Stat(r.file); errors.Is(err, fs.ErrNotExist) {
			return false
		}
		return r.holds()
	})
}

// waitStateClear waits for `state ace` to say nothing is missing.
func (r *refillMesh) waitStateClear(t *testing.T) {
	t.Helper()
	waitfor.Until(t, time.Minute, "state without a missing line", func() bool {
		out, _, code := r.s.m.cli(t, "state", "ace")
		return code == 0 && !strings.Contains(out, "missing on the node")
	})
}

// A filled file deleted on the node while its module runs (a crash, a
// reboot with /run on a tmpfs, an rm), then the module's process ends:
// the node agent, seeing the module exit, reports the file missing in its
// have, the reconciler knocks (reason missing), and the provisioner fills
// it again, with no resync (--resync 0) and no operator: the module runs
// again (a fresh user's finding U21: it crash-looped on its missing
// credential, nothing named the file, and nothing refilled it until the
// provisioner's 10-minute resync or a poke). Real processes: meshfold as
// shipped runs the agent (its shims and modules) and the provisioner;
// the agent's look at its files is off (--check-files 0), so the exit
// alone shows the file gone.
func TestDeletedFileRefilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	r := startRefillMesh(t, "--check-files", "0")
	s, pid := r.s, r.pid

	// The file goes; then the module's process ends (here TERM, by the
	// pid the agent's module record holds).
	if err := os.Remove(r.file); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r.waitBack(t, "the credential filled again, with no resync and no poke")
	back := time.Since(began)
	waitKind(t, s.m, events.KindHave, func(ev events.Event) bool {
		return ev.Seq > r.last && r.running(ev.Payload.(*events.Have))
	})
	runs := time.Since(began)
	newPID, _ := readPID(s.state, "app")
	if newPID == pid || !processAlive(newPID) {
		t.Fatalf("the app's process after the refill: pid %d (was %d), alive %v", newPID, pid, processAlive(newPID))
	}

	// What the stream says: a have that reported the file missing, and
	// the knock it caused, reason missing.
	reported := r.missingKnock(t)
	// Filled: `state` says nothing is missing any more.
	r.waitStateClear(t)
	assertNotStored(t, s.m.e.NATS().StoreDir(), [][]byte{r.secret})
	t.Logf("file removed, module TERMed → credential back on the node in %s, module running again (its have) in %s; have #%d reported it, knock reason missing",
		back.Round(time.Millisecond), runs.Round(time.Millisecond), reported)
}

// A filled file deleted on the node under a module that runs on (a
// long-running daemon whose credential a cleanup cron or an operator's rm
// took): nothing exits, so only the agent's look at its files
// (--check-files, default 5s, as shipped here) sees it gone; its have
// reports it, the reconciler knocks (reason missing) and the provisioner
// fills it again, with no resync and no poke, and the module was never
// restarted. Three times: a file refilled is looked at again; and after
// the agent's restart (its modules run on), whose first have went out
// before its plan settled. Without the look the file stays gone (the
// module never exits).
func TestDeletedFileRefilledWhileRunning(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	r := startRefillMesh(t)
	s := r.s
	for round := range 3 {
		if round == 2 {
			// The agent restarts; the app runs on (adopted). Its new
			// claim brings a knock (reason agent): once the provisioner
			// took it, the file is removed.
			began := time.Now()
			if err := s.agent.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			_ = s.agent.Wait()
			s.agent, s.agentErr = s.start("node", "ace", "--root", s.root, "--state-dir", s.state, "--log-level", "info")
			var back uint64
			waitKind(t, s.m, events.KindKnock, func(ev events.Event) bool {
				back = ev.Seq
				return ev.Seq > r.last && slices.Contains(ev.Payload.(*events.Knock).Reasons, events.KnockAgent)
			})
			done := fmt.Sprintf(`msg="fill pass done" node=ace account=%s knock=%d `, s.acct, back)
			waitfor.Until(t, time.Minute, "the provisioner's pass for the agent-back knock", func() bool {
				return strings.Contains(s.provErr.String(), done)
			})
			r.last = lastSeq(t, s)
			t.Logf("agent restarted, its knock #%d taken, in %s", back, time.Since(began).Round(time.Millisecond))
		}
		if err := os.Remove(r.file); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		r.waitBack(t, "the credential filled again under the running module, with no resync and no poke")
		back := time.Since(began)
		reported := r.missingKnock(t)
		r.waitStateClear(t)
		if p, _ := readPID(s.state, "app"); p != r.pid || !processAlive(r.pid) {
			t.Fatalf("the app's process after the refill: pid %d (was %d), alive %v: it was not to restart", p, r.pid, processAlive(r.pid))
		}
		t.Logf("round %d: file removed under the running module → back on the node in %s; have #%d reported it, knock reason missing",
			round, back.Round(time.Millisecond), reported)
		r.last = lastSeq(t, s)
	}
	assertNotStored(t, s.m.e.NATS().StoreDir(), [][]byte{r.secret})
}

// lastSeq is the stream's last sequence.
func lastSeq(t *testing.T, s *sealedMesh) uint64 {
	t.Helper()
	st, err := s.m.js.Stream(testCtx(t), s.m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}
