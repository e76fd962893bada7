package main

import (
	"bytes"
	"errors"
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

// A filled file deleted on the node while its module runs (a crash, a
// reboot with /run on a tmpfs, an rm), then the module's process ends:
// the node agent, seeing the module exit, reports the file missing in its
// have, the reconciler knocks (reason missing), and the provisioner fills
// it again, with no resync (--resync 0) and no operator: the module runs
// again (a fresh user's finding U21: it crash-looped on its missing
// credential, nothing named the file, and nothing refilled it until the
// provisioner's 10-minute resync or a poke). Real processes: meshfold as
// shipped runs the agent (its shims and modules) and the provisioner.
func TestDeletedFileRefilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
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
	run := "#!/bin/sh\n[ -f \"$MESHFOLD_ROOT" + path + "\" ] || { echo 'missing credential' >&2; exit 1; }\nexec sleep 3600\n"
	if err := os.WriteFile(filepath.Join(src, "run.sh"), []byte(run), 0o755); err != nil {
		t.Fatal(err)
	}
	idle, err := examples.WriteIdle(filepath.Join(dir, "idle"))
	if err != nil {
		t.Fatal(err)
	}
	appBuild, provBuild := s.push(src), s.push(idle)
	s.agentStart()
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
	waitHave(t, s.m, running)
	pid := waitfor.Value(t, time.Minute, "the app's pid in its module record", func() (int, bool) { return readPID(s.state, "app") })
	last := lastSeq(t, s)

	// The file goes; then the module's process ends (here TERM, by the
	// pid the agent's module record holds).
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "the credential filled again, with no resync and no poke", func() bool {
		if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
			return false
		}
		return holds()
	})
	back := time.Since(began)
	waitKind(t, s.m, events.KindHave, func(ev events.Event) bool {
		return ev.Seq > last && running(ev.Payload.(*events.Have))
	})
	runs := time.Since(began)
	newPID, _ := readPID(s.state, "app")
	if newPID == pid || !processAlive(newPID) {
		t.Fatalf("the app's process after the refill: pid %d (was %d), alive %v", newPID, pid, processAlive(newPID))
	}

	// What the stream says: a have that reported the file missing, and
	// the knock it caused, reason missing.
	var reported uint64
	for _, ev := range readEvents(t, s.m, "ace", events.KindHave) {
		if h := ev.Payload.(*events.Have); ev.Seq > last && slices.Contains(h.Missing, events.MissingFile{Module: "app", Path: path}) {
			reported = ev.Seq
			break
		}
	}
	if reported == 0 {
		t.Fatal("no have reported the file missing")
	}
	knocked := slices.ContainsFunc(readEvents(t, s.m, "ace", events.KindKnock), func(ev events.Event) bool {
		k := ev.Payload.(*events.Knock)
		return k.Cause == reported && slices.Equal(k.Reasons, []events.KnockReason{events.KnockMissing})
	})
	if !knocked {
		t.Fatalf("no knock with reason missing caused by have #%d", reported)
	}
	// Filled: `state` says nothing is missing any more.
	waitfor.Until(t, time.Minute, "state without a missing line", func() bool {
		out, _, code := s.m.cli(t, "state", "ace")
		return code == 0 && !strings.Contains(out, "missing on the node")
	})
	assertNotStored(t, s.m.e.NATS().StoreDir(), [][]byte{secret})
	t.Logf("file removed, module TERMed → credential back on the node in %s, module running again (its have) in %s; have #%d reported it, knock reason missing",
		back.Round(time.Millisecond), runs.Round(time.Millisecond), reported)
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
