package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/examples"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// Sealed secrets end to end (issue 26, DESIGN.md §12), with real
// processes: meshfold as shipped (built once) runs the node agent, whose
// shims and modules are real processes, and the provisioner with
// --from sealed; the test puts secrets with `meshfold secret put`.

// sealedMesh is a server, a reconciler, the app's bundle and the
// paths and processes of node ace.
type sealedMesh struct {
	t          testing.TB
	m          *mesh
	bin, trust string
	root       string
	state      string
	key        string
	acct       string
	starts     string // the app's pid, a line per start
	secretsKV  jetstream.KeyValue
	agent      *exec.Cmd
	prov       *exec.Cmd
	provErr    *storetest.SyncBuffer
	agentErr   *storetest.SyncBuffer
}

const (
	sealedPath = "/run/app/token"
	sealedMode = 0o640
)

func startSealedMesh(t testing.TB) *sealedMesh {
	t.Helper()
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	s := &sealedMesh{t: t, m: startMesh(t), bin: meshfoldBinary(t)}
	s.trust = s.m.serveSigned(t)
	var err error
	if s.secretsKV, err = store.OpenSecrets(testCtx(t), s.m.js, s.m.cfg, false); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	for d := dir; d != filepath.Dir(filepath.Dir(dir)); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil { // modules may run as another user
			t.Fatal(err)
		}
	}
	s.root, s.state, s.key = filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "prov", "curve.key")
	t.Cleanup(func() { killModules(t, filepath.Join(s.state, "process")) })
	s.acct = currentOrNobody(t)

	// The app: restarted on every fill of its files.
	src := filepath.Join(dir, "app")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "meshfold.json"), []byte(`{"command":["run.sh"],"on_fill":"restart","stop_timeout":"2s"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each start of the app appends its pid to starts: the count of its
	// starts, independent of how often haves are published.
	s.starts = filepath.Join(dir, "starts")
	if err := os.WriteFile(s.starts, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.starts, 0o666); err != nil { // past the umask: the app may run as another user
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho $$ >> "+s.starts+"\nexec sleep 3600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	idle, err := examples.WriteIdle(filepath.Join(dir, "idle"))
	if err != nil {
		t.Fatal(err)
	}
	appBuild, provBuild := s.push(src), s.push(idle)
	s.agentStart()
	s.provStart()
	s.waitRegistered()
	// The want first, then the secret once the app's first process has
	// appended its pid: the fill restarts the app (on_fill), and a fill
	// that came before that process ran its echo (the secret put ahead of
	// the want, filled as the plan settles, 35 ms after the app's start in
	// one CI run) stopped it unrecorded: two starts, one pid.
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: provBuild, RunsAs: s.acct, Provisioner: true},
		{Name: "app", Build: appBuild, RunsAs: s.acct, Files: []events.File{{Path: sealedPath, Mode: events.Mode(fmt.Sprintf("%04o", sealedMode))}}},
	}}
	if _, err := store.NewPublisher(s.m.js, s.m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	s.waitStarts(1)
	s.put("v0")
	s.waitContent(content("v0"))
	return s
}

// serveSigned runs the reconciler on m in this process (engine.Serve,
// which creates the secrets and fill status buckets as serve does),
// signing with a fresh key, and returns the trust file naming it.
func (m *mesh) serveSigned(t testing.TB) string {
	t.Helper()
	signer, trust := testSigner(t)
	nc, err := m.e.Connect(nats.Name("reconciler"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- engine.Serve(ctx, nc, engine.Config{Stream: m.cfg, Signer: signer,
			Ready: func(context.Context, *engine.Reconciler) { close(ready) }})
	}()
	t.Cleanup(func() { cancel(); <-done; nc.Close() })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("reconciler: %v", err)
	}
	return trust
}

// currentOrNobody is the account modules and the provisioner run as.
func currentOrNobody(t testing.TB) string {
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("nobody"); err != nil {
			t.Skip("running as root with no user nobody")
		}
		return "nobody"
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

func (s *sealedMesh) push(dir string) string {
	out, errs, code := s.m.cli(s.t, "build", "push", dir)
	if code != 0 {
		s.t.Fatalf("build push: %d %s", code, errs)
	}
	return strings.TrimSpace(out)
}

// start runs the shipped meshfold with args as a process of its own.
func (s *sealedMesh) start(args ...string) (*exec.Cmd, *storetest.SyncBuffer) {
	cmd := exec.Command(s.bin, append(args, "-s", s.m.e.ClientURL(), "--trust", s.trust)...)
	stderr := &storetest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := testproc.StartChild(cmd); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill() // by pid: the process this test started
			_ = cmd.Wait()
		}
		if s.t.Failed() {
			s.t.Logf("%s said:\n%s", args[0], stderr.String())
		}
	})
	return cmd, stderr
}

func (s *sealedMesh) agentStart() {
	s.agent, s.agentErr = s.start("node", "ace", "--root", s.root, "--state-dir", s.state, "--log-level", "info")
}

func (s *sealedMesh) provStart() {
	s.prov, s.provErr = s.start("provision", "ace", "--from", "sealed", "--key", s.key, "--account", s.acct,
		"--resync", "0", "--log-level", "info")
}

// kill9 kills cmd with SIGKILL, by its pid, and reaps it.
func kill9(t testing.TB, cmd *exec.Cmd) {
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func (s *sealedMesh) waitRegistered() {
	ctx := testCtx(s.t)
	w, err := s.secretsKV.Watch(ctx, store.CurveKeyName("ace"))
	if err != nil {
		s.t.Fatal(err)
	}
	defer w.Stop()
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				return
			}
		case <-ctx.Done():
			s.t.Fatalf("the provisioner never registered its key:\n%s", s.provErr.String())
		}
	}
}

// content is the secret of a label: 64 KiB, so a partial file shows.
func content(label string) []byte {
	return append([]byte("sealed-"+label+"-"), bytes.Repeat([]byte{'x'}, 64<<10)...)
}

// put runs `meshfold secret put` with content(label) from a file, and
// extra flags.
func (s *sealedMesh) put(label string, extra ...string) {
	f := filepath.Join(s.t.TempDir(), "secret")
	if err := os.WriteFile(f, content(label), 0o600); err != nil {
		s.t.Fatal(err)
	}
	out, errs, code := s.m.cli(s.t, append([]string{"secret", "put", "ace", "app", sealedPath, "-f", f, "--by", "test"}, extra...)...)
	if code != 0 || strings.Contains(out, "sealed-") || strings.Contains(errs, "sealed-") {
		s.t.Fatalf("secret put: %d %s %s", code, out, errs)
	}
}

// waitContent waits until the node's file holds want (read every
// millisecond: the wait is measured, and a file event is not cheaper).
func (s *sealedMesh) waitContent(want []byte) {
	deadline := time.Now().Add(time.Minute)
	p := filepath.Join(s.root, sealedPath)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, want) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	s.t.Fatalf("%s never held %q…; provisioner:\n%s", sealedPath, want[:12], s.provErr.String())
}

// waitStarts waits until the app has started n times (its starts
// file) and returns the pid of its last start.
func (s *sealedMesh) waitStarts(n int) int {
	pids := waitfor.Value(s.t, time.Minute, fmt.Sprintf("the app to have started %d times (the pids it appended)", n), func() ([]string, bool) {
		data, _ := os.ReadFile(s.starts)
		pids := strings.Fields(string(data))
		return pids, len(pids) >= n
	})
	pid, _ := strconv.Atoi(pids[len(pids)-1])
	return pid
}

// startCount is how often the app has started.
func (s *sealedMesh) startCount() int {
	data, _ := os.ReadFile(s.starts)
	return len(strings.Fields(string(data)))
}

func readPID(state, module string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(state, "process", module, "module.json"))
	if err != nil {
		return 0, false
	}
	i := bytes.Index(data, []byte(`"pid":`))
	if i < 0 {
		return 0, false
	}
	rest := data[i+6:]
	j := bytes.IndexAny(rest, ",}")
	pid, err := strconv.Atoi(strings.TrimSpace(string(rest[:j])))
	return pid, err == nil && pid > 0
}

// filledCount counts ace's filled events of the app's file.
func (s *sealedMesh) filledCount() int {
	evs := readEvents(s.t, s.m, "ace", events.KindFilled)
	n := 0
	for _, ev := range evs {
		if f, ok := ev.Payload.(*events.Filled); ok && f.Path == sealedPath {
			n++
		}
	}
	return n
}

func readEvents(t testing.TB, m *mesh, node string, kind events.Kind) []events.Event {
	t.Helper()
	var out []events.Event
	err := store.ReadNode(testCtx(t), m.js, m.cfg.Name, m.cfg.Subjects(), node, 0, 0, func(msg store.Msg) error {
		if msg.Event.Kind == kind {
			out = append(out, msg.Event)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A module with on_fill restart and a sealed credential rotated 20
// times: 20 restarts, never a partial file, mode and owner exact. Then
// the agent and the provisioner are killed -9 and restarted with the
// secret unchanged: the module keeps its pid and nothing is written. The
// server's store holds no plaintext anywhere.
func TestSealedRotation(t *testing.T) {
	t.Parallel()
	s := startSealedMesh(t)
	// Two starts: the app's, and its restart when v0 was filled (put
	// once the app's first start had recorded its pid). The
	// pid of that second start is where the rotations count from: one
	// that took the v0 restart's process for its own would put its
	// secret while that process starts, which then sees the file and gets
	// no on_fill restart (DESIGN.md §8), one restart short of 20.
	pid := s.waitStarts(2)

	// A secret for a file the want does not declare (a mistyped path or
	// module) is refused: nothing stored; --ahead stores it, with a note
	// that it is not filled until a want declares it.
	f := filepath.Join(t.TempDir(), "typo")
	if err := os.WriteFile(f, content("typo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, typo := range [][]string{{"ace", "app", sealedPath + "x"}, {"ace", "apq", sealedPath}} {
		out, errs, code := s.m.cli(t, append(append([]string{"secret", "put"}, typo...), "-f", f, "--by", "test")...)
		if code != exitUsage || !strings.Contains(errs, "nothing stored") {
			t.Fatalf("secret put %v: exit %d, want %d and nothing stored:\n%s%s", typo, code, exitUsage, out, errs)
		}
		out, errs, code = s.m.cli(t, append(append([]string{"secret", "put"}, typo...), "-f", f, "--by", "test", "--ahead")...)
		if code != 0 || !strings.Contains(errs, "stored ahead of it, filled once a want declares it") {
			t.Fatalf("secret put --ahead %v: exit %d, want 0 and a note that it is not filled yet:\n%s%s", typo, code, out, errs)
		}
		if out, errs, code := s.m.cli(t, append(append([]string{"secret", "rm"}, typo...), "--by", "test", "--next-source")...); code != 0 {
			t.Fatalf("secret rm %v: exit %d\n%s%s", typo, code, out, errs)
		}
	}

	// A reader that never sees a partial file.
	p := filepath.Join(s.root, sealedPath)
	var stop atomic.Bool
	var reads, bad atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			b, err := os.ReadFile(p)
			if err != nil {
				bad.Add(1)
				continue
			}
			reads.Add(1)
			if len(b) != len(content("v00")) && len(b) != len(content("v0")) || !bytes.HasPrefix(b, []byte("sealed-v")) ||
				!bytes.HasSuffix(b, bytes.Repeat([]byte{'x'}, 64<<10)) {
				bad.Add(1)
			}
		}
	})
	var waits []time.Duration
	for i := 1; i <= 20; i++ {
		label := fmt.Sprintf("v%02d", i)
		began := time.Now()
		s.put(label)
		s.waitContent(content(label))
		waits = append(waits, time.Since(began))
		pid = s.waitStarts(2 + i)
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d of %d reads saw a missing or partial file", bad.Load(), reads.Load()+bad.Load())
	}
	if got := s.startCount(); got != 22 {
		t.Errorf("after 20 rotations the app started %d times, want 22 (its start, v0's fill, 20 rotations)", got)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != sealedMode {
		t.Errorf("mode %v, want %o", fi.Mode().Perm(), sealedMode)
	}
	if os.Geteuid() == 0 {
		u, _ := user.Lookup(s.acct)
		st := fi.Sys().(*syscall.Stat_t)
		if strconv.Itoa(int(st.Uid)) != u.Uid || strconv.Itoa(int(st.Gid)) != u.Gid {
			t.Errorf("owner %d:%d, want %s:%s (%s)", st.Uid, st.Gid, u.Uid, u.Gid, s.acct)
		}
	}
	t.Logf("secret put → file written on the node, 20 rotations: p50 %s, max %s; %d reads, none partial",
		percentile(waits, 50).Round(time.Millisecond), slices.Max(waits).Round(time.Millisecond), reads.Load())

	// The 21 on_fill restarts (v0 and 20 rotations) are not crashes: the
	// have counts them apart, and fleet does not call the app flapping
	// (three crashes in ten minutes would).
	waitUntil(t, testCtx(t), "a have counting 21 on_fill restarts", func() bool {
		haves := readEvents(t, s.m, "ace", events.KindHave)
		for _, hm := range haves[len(haves)-1].Payload.(*events.Have).Modules {
			if hm.Name == "app" {
				if hm.Restarts != 0 {
					t.Fatalf("the have counts %d restarts of the app, want 0 (its restarts were on_fill's)", hm.Restarts)
				}
				return hm.FillRestarts == 21
			}
		}
		return false
	})
	if out, _, _ := s.m.cli(t, "fleet", "-o", "json", "--warnings", "0"); strings.Contains(out, "flapping") {
		t.Errorf("fleet calls the rotated app flapping:\n%s", out)
	}

	// The same content put again: nothing written, no restart.
	ino := fi.Sys().(*syscall.Stat_t).Ino
	filled := s.filledCount()
	s.put("v20")
	waitUntil(t, testCtx(t), "the provisioner to take the same content in", func() bool {
		for _, l := range strings.Split(s.provErr.String(), "\n") {
			if strings.Contains(l, `msg="sealed secret changed: filled"`) && strings.Contains(l, "filled=0 unchanged=1") {
				return true
			}
		}
		return false
	})
	if now, _ := readPID(s.state, "app"); now != pid {
		t.Errorf("the same content put again restarted the app (pid %d → %d)", pid, now)
	}

	// kill -9 of the agent and the provisioner, the secret unchanged.
	kill9(t, s.prov)
	kill9(t, s.agent)
	if !processAlive(pid) {
		t.Fatalf("the app (pid %d) died with its agent", pid)
	}
	s.agentStart()
	s.provStart()
	waitUntil(t, testCtx(t), "the restarted provisioner's fill pass", func() bool {
		return strings.Contains(s.provErr.String(), `msg="fill pass done"`) && strings.Contains(s.provErr.String(), "unchanged=1")
	})
	if now, _ := readPID(s.state, "app"); now != pid || !processAlive(pid) {
		t.Errorf("after the restarts the app's pid is %d, want %d", now, pid)
	}
	fi, err = os.Stat(p)
	if err != nil || fi.Sys().(*syscall.Stat_t).Ino != ino {
		t.Errorf("the file was written again after the restarts (inode %d → %v)", ino, fi)
	}
	if n := s.filledCount(); n != filled {
		t.Errorf("%d filled events after the restarts, want %d (none)", n, filled)
	}
	if got := s.startCount(); got != 22 {
		t.Errorf("after the re-put and the restarts the app started %d times, want still 22", got)
	}

	// No plaintext in the server's store, nor a plain hash of it.
	assertNotStored(t, s.m.e.NATS().StoreDir(), [][]byte{[]byte("sealed-v"), content("v20")[:40]})
	out, _, _ := s.m.cli(t, "secret", "ls", "ace")
	if !strings.Contains(out, "current") || strings.Contains(out, "sealed-") {
		t.Errorf("secret ls:\n%s", out)
	}

	// secret rm: the file stays as it is, the provisioner reports it
	// removed, by whom, and state says so; ls shows the removal.
	if _, errs, code := s.m.cli(t, "secret", "rm", "ace", "app", sealedPath); code != exitUsage || !strings.Contains(errs, `"by"`) {
		t.Errorf("secret rm without --by: exit %d, want 2 naming --by\n%s", code, errs)
	}
	if out, errs, code := s.m.cli(t, "secret", "rm", "ace", "app", sealedPath, "--by", "carol"); code != 0 || !strings.Contains(out, "no other source fills it until a new put") {
		t.Fatalf("secret rm: %d %s %s", code, out, errs)
	}
	waitUntil(t, testCtx(t), "state to say the secret was removed", func() bool {
		out, _, _ := s.m.cli(t, "state", "ace")
		return strings.Contains(out, "not filled") && strings.Contains(out, "removed by carol")
	})
	if out, _, _ := s.m.cli(t, "secret", "ls", "ace"); !strings.Contains(out, "removed: no source fills it until a put") || !strings.Contains(out, "carol") {
		t.Errorf("secret ls does not show the removal:\n%s", out)
	}
	if _, errs, code := s.m.cli(t, "secret", "rm", "ace", "app", sealedPath, "--by", "carol"); code == 0 || !strings.Contains(errs, "removed by carol") {
		t.Errorf("secret rm of a removal: exit %d, want an error saying it was removed\n%s", code, errs)
	}
	if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, content("v20")) {
		t.Errorf("the file changed after secret rm: %v", err)
	}
}

// assertNotStored fails when any file under dir holds one of needles.
func assertNotStored(t *testing.T, dir string, needles [][]byte) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		files++
		for _, n := range needles {
			if bytes.Contains(b, n) {
				t.Errorf("%s holds plaintext", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatalf("no file under %s", dir)
	}
}

// BenchmarkSealedPut measures, over 100 puts each, `meshfold secret put`
// (the CLI connecting, sealing, putting) until the file is written on
// the node (the provisioner's watch, its open, the fill request, the
// agent's atomic write), against a raw KV put until its watch delivers it,
// in the same run on the same server:
//
//	go test ./cmd/meshfold -run '^$' -bench SealedPut -benchtime 1x
func BenchmarkSealedPut(b *testing.B) {
	s := startSealedMesh(b)
	for range b.N {
		var puts, raws []time.Duration
		for i := range 100 {
			label := fmt.Sprintf("b%03d", i)
			began := time.Now()
			s.put(label)
			s.waitContent(content(label))
			puts = append(puts, time.Since(began))
		}
		ctx := testCtx(b)
		kv, err := store.CreateKV(ctx, s.m.js, jetstream.KeyValueConfig{Bucket: "BENCH_RAW", History: 10, Storage: jetstream.FileStorage})
		if err != nil {
			b.Fatal(err)
		}
		w, err := kv.Watch(ctx, "k", jetstream.UpdatesOnly())
		if err != nil {
			b.Fatal(err)
		}
		for i := range 100 {
			began := time.Now()
			if _, err := kv.Put(ctx, "k", content(fmt.Sprint(i))); err != nil {
				b.Fatal(err)
			}
			for e := range w.Updates() {
				if e != nil && bytes.Equal(e.Value(), content(fmt.Sprint(i))) {
					break
				}
			}
			raws = append(raws, time.Since(began))
		}
		_ = w.Stop()
		b.ReportMetric(float64(percentile(puts, 50).Microseconds())/1000, "put-p50-ms")
		b.ReportMetric(float64(percentile(puts, 99).Microseconds())/1000, "put-p99-ms")
		b.ReportMetric(float64(percentile(raws, 50).Microseconds())/1000, "raw-p50-ms")
		b.ReportMetric(float64(percentile(raws, 99).Microseconds())/1000, "raw-p99-ms")
		b.Logf("secret put → file written: p50 %s p99 %s; raw KV put → watch: p50 %s p99 %s (100 each)",
			percentile(puts, 50).Round(100*time.Microsecond), percentile(puts, 99).Round(100*time.Microsecond),
			percentile(raws, 50).Round(10*time.Microsecond), percentile(raws, 99).Round(10*time.Microsecond))
	}
}

// A failing helper, a missing source and a restored source are each
// visible in `meshfold fleet` and `meshfold state` soon after the
// provisioner notices, with no content, and clear once the file is
// filled. The helper's behaviour is switched through a control file.
func TestSourceProblemsInFleet(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	trust := m.serveSigned(t)
	dir := t.TempDir()
	ctl := filepath.Join(dir, "mode")
	helperPath := filepath.Join(dir, "helper")
	script := `#!/bin/sh
case "$(cat ` + ctl + `)" in
fail) echo "vault: permission denied" >&2; exit 3 ;;
hang) exec sleep 30 ;;
empty) exit 0 ;;
nothing) echo "No value found" >&2; exit ` + fmt.Sprint(provision.ExitNothing) + ` ;;
ok) printf 'restored-s3cr3t-%s' "$MESHFOLD_MODULE" ;;
esac
`
	if err := os.WriteFile(helperPath, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	mode := func(m string) {
		if err := os.WriteFile(ctl, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mode("fail")
	empty := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: sealedPath, Mode: "0600"}}},
	}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	background := func(args ...string) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		out := &storetest.SyncBuffer{}
		go func() {
			done <- run(ctx, append(args, "-s", m.e.ClientURL(), "--trust", trust), nil, out, out)
		}()
		t.Cleanup(func() {
			cancel()
			if code := <-done; code != 0 || t.Failed() {
				t.Logf("%s exited %d:\n%s", args[0], code, out.String())
			}
		})
	}
	background("node", "ace", "--runtime", "record", "--root", root, "--state-dir", filepath.Join(dir, "state"), "--log-level", "warn")
	// --exec-timeout 2s: a run of the helper (sh and cat) took more than
	// 300 ms on a loaded machine, and timed out in the modes that do not
	// hang; the hang then waits 2 s.
	background("provision", "ace", "--from", empty, "--from", "exec:"+helperPath, "--account", "prov",
		"--exec-timeout", "2s", "--retry-unfilled", "100ms", "--log-level", "info")

	// fleetShows waits until ace's fleet row shows what pred accepts
	// (its source problems) and returns how long that took.
	fleetShows := func(what string, pred func([]map[string]any) bool) time.Duration {
		t.Helper()
		began := time.Now()
		waitUntil(t, testCtx(t), "fleet to show "+what, func() bool {
			out, _, code := m.cli(t, "fleet", "-o", "json", "--warnings", "0")
			if code != 0 || strings.Contains(out, "s3cr3t") {
				if strings.Contains(out, "s3cr3t") {
					t.Fatalf("fleet shows content:\n%s", out)
				}
				return false
			}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				var row struct {
					Node    string           `json:"node"`
					Sources []map[string]any `json:"source_problems"`
				}
				if json.Unmarshal([]byte(l), &row) == nil && row.Node == "ace" {
					return pred(row.Sources)
				}
			}
			return false
		})
		return time.Since(began)
	}
	has := func(state, why string) func([]map[string]any) bool {
		return func(ps []map[string]any) bool {
			return len(ps) == 1 && ps[0]["state"] == state && strings.Contains(fmt.Sprint(ps[0]["why"]), why)
		}
	}
	d1 := fleetShows("a failing helper", has("source-failed", "exit status 3"))
	out, _, _ := m.cli(t, "state", "ace")
	if !strings.Contains(out, "not filled") || !strings.Contains(out, "exit status 3") {
		t.Errorf("state does not say why the file is unfilled:\n%s", out)
	}
	out, _, _ = m.cli(t, "fleet", "--warnings", "0")
	if !strings.Contains(out, "source") || !strings.Contains(out, sealedPath) {
		t.Errorf("fleet's table does not say why the file is unfilled:\n%s", out)
	}
	mode("hang")
	d2 := fleetShows("a helper timing out", has("source-failed", "timed out"))
	mode("empty")
	fleetShows("a helper that printed nothing", has("source-failed", "printed nothing"))
	mode("nothing")
	d3 := fleetShows("a missing source", has("missing", "has nothing"))
	mode("ok")
	d4 := fleetShows("the restored source filled", func(ps []map[string]any) bool { return len(ps) == 0 })
	b, err := os.ReadFile(filepath.Join(root, sealedPath))
	if err != nil || string(b) != "restored-s3cr3t-app" {
		t.Fatalf("the restored file: %v", err)
	}
	t.Logf("fleet shows: a failing helper %s (the first pass and the first checkpoint), a timing-out helper %s, a missing source %s, the restored source cleared %s (each from the switch, with --retry-unfilled 100ms and --exec-timeout 2s)",
		d1.Round(time.Millisecond), d2.Round(time.Millisecond), d3.Round(time.Millisecond), d4.Round(time.Millisecond))
}

// background runs meshfold with args in this process against m, signed
// plans trusted from trust, until the returned stop (also the test's
// end), which waits for it to return; out is its output, logged when the
// test fails.
func (m *mesh) background(t testing.TB, trust string, args ...string) (stop func(), out *storetest.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	out = &storetest.SyncBuffer{}
	go func() {
		done <- run(ctx, append(args, "-s", m.e.ClientURL(), "--trust", trust), nil, out, out)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if code := <-done; code != 0 || t.Failed() {
				t.Logf("%s exited %d:\n%s", args[0], code, out.String())
			}
		})
	}
	t.Cleanup(stop)
	return stop, out
}

// A sealed secret put for a file that a --from DIR given before --from
// sealed also holds is shadowed: the node keeps the directory's content.
// Once the provisioner has reported it, a put warns on stderr naming the
// directory, and 'secret ls' says by which source (its KEY column, and
// shadowed_by in -o json), as does state's header; no output holds
// content (the F7 follow-up of a fresh user's findings).
func TestSecretShadowedByDir(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	trust := m.serveSigned(t)
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(filepath.Join(secrets, "app", filepath.Dir(sealedPath)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "app", sealedPath), []byte("dir-s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: sealedPath, Mode: "0600"}}},
	}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	m.background(t, trust, "node", "ace", "--runtime", "record", "--root", root, "--state-dir", filepath.Join(dir, "state"), "--log-level", "warn")
	key := filepath.Join(dir, "prov", "curve.key")
	_, provOut := m.background(t, trust, "provision", "ace", "--from", secrets, "--from", "sealed", "--key", key,
		"--account", "prov", "--resync", "0", "--log-level", "info")

	file := filepath.Join(t.TempDir(), "secret")
	put := func(label string) (string, string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(label+"-s3cr3t"), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errs string
		waitUntil(t, testCtx(t), "secret put to be taken (the provisioner registers its key at start)", func() bool {
			var code int
			out, errs, code = m.cli(t, "secret", "put", "ace", "app", sealedPath, "-f", file, "--by", "alice")
			return code == 0
		})
		if strings.Contains(out+errs, "s3cr3t") {
			t.Fatalf("secret put prints content:\n%s%s", out, errs)
		}
		return out, errs
	}
	put("put1")
	// Where its key is, so that a provisioner of the same name for
	// another mesh is seen to share it (a fresh user's finding L13).
	if !strings.Contains(provOut.String(), `msg="sealed secrets: curve key file" key=`+key+" created=true default=false") {
		t.Errorf("the provisioner does not log its key file:\n%s", provOut.String())
	}
	const warning = "reports this file shadowed: it fills it from dir "
	ls := func() string {
		out, errs, code := m.cli(t, "secret", "ls", "ace")
		if code != 0 || strings.Contains(out+errs, "s3cr3t") {
			t.Fatalf("secret ls: exit %d\n%s%s", code, out, errs)
		}
		return out
	}
	waitUntil(t, testCtx(t), "secret ls to say the put is shadowed by the directory", func() bool {
		return strings.Contains(ls(), "current, shadowed by dir "+secrets+" (tried first: the node holds its content)")
	})
	if b, err := os.ReadFile(filepath.Join(root, sealedPath)); err != nil || string(b) != "dir-s3cr3t" {
		t.Fatalf("the node's file does not hold the directory's content (err %v)", err)
	}
	out, _, code := m.cli(t, "secret", "ls", "ace", "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 || rows[0]["shadowed_by"] != "dir "+secrets {
		t.Errorf("secret ls -o json: exit %d, %v, want one row shadowed_by %q:\n%s", code, err, "dir "+secrets, out)
	}
	st, _, _ := m.cli(t, "state", "ace")
	if !strings.Contains(st, "not filled, or filled from a source that shadows a put, as the provisioner reports it:") ||
		!strings.Contains(st, "sealed secret shadowed since") || strings.Contains(st, "s3cr3t") {
		t.Errorf("state does not head the shadowed file's line:\n%s", st)
	}

	// The provisioner has reported it: a put now warns, naming the source.
	_, errs := put("put2")
	if !strings.Contains(errs, "meshfold: warning: ace's provisioner "+warning+secrets+", given before --from sealed") {
		t.Errorf("a put to a shadowed file does not warn:\n%s", errs)
	}

	// The directory's file removed: the put fills, and nothing is shadowed.
	if err := os.Remove(filepath.Join(secrets, "app", sealedPath)); err != nil {
		t.Fatal(err)
	}
	put("put3")
	waitUntil(t, testCtx(t), "the put to fill the file once the directory no longer has it", func() bool {
		b, _ := os.ReadFile(filepath.Join(root, sealedPath))
		return string(b) == "put3-s3cr3t"
	})
	waitUntil(t, testCtx(t), "secret ls to say nothing shadows the put", func() bool {
		return !strings.Contains(ls(), "shadowed")
	})
	if _, errs := put("put4"); strings.Contains(errs, "shadowed") {
		t.Errorf("a put that nothing shadows warns:\n%s", errs)
	}
}

// A put while the node's agent is down, or while no provisioner of the
// node is up, is stored and exits 0, and says on stderr which is down
// and since when; the file is filled once it is back (a fresh user's
// finding L10: such a put said nothing). A put with both up says
// nothing of the kind.
func TestSecretPutWhileDown(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	trust := m.serveSigned(t)
	dir := t.TempDir()
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: sealedPath, Mode: "0600"}}},
	}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	agent := func() func() {
		stop, _ := m.background(t, trust, "node", "ace", "--runtime", "record", "--root", root, "--state-dir", state, "--log-level", "warn")
		return stop
	}
	prov := func() func() {
		stop, _ := m.background(t, trust, "provision", "ace", "--from", "sealed", "--key", filepath.Join(dir, "prov", "curve.key"),
			"--account", "prov", "--resync", "0", "--log-level", "warn")
		return stop
	}
	stopAgent, stopProv := agent(), prov()
	file := filepath.Join(t.TempDir(), "secret")
	var out string // the last put's stdout
	var took time.Duration
	put := func(label string, extra ...string) string {
		t.Helper()
		if err := os.WriteFile(file, []byte(label+"-s3cr3t"), 0o600); err != nil {
			t.Fatal(err)
		}
		var errs string
		waitUntil(t, testCtx(t), "secret put to be taken (the provisioner registers its key at start)", func() bool {
			var code int
			began := time.Now()
			out, errs, code = m.cli(t, append([]string{"secret", "put", "ace", "app", sealedPath, "-f", file, "--by", "alice"}, extra...)...)
			took = time.Since(began)
			return code == 0
		})
		if strings.Contains(out+errs, "s3cr3t") {
			t.Fatalf("secret put prints content:\n%s%s", out, errs)
		}
		return errs
	}
	// says checks that the last put's stdout says each of whats.
	says := func(case_ string, whats ...string) {
		t.Helper()
		for _, w := range whats {
			if !strings.Contains(out, w) {
				t.Errorf("%s: the put's stdout does not say %q:\n%s", case_, w, out)
			}
		}
		t.Logf("%s: the put took %s and printed:\n%s", case_, took.Round(time.Millisecond), out)
	}
	filled := func(label string) {
		t.Helper()
		waitUntil(t, testCtx(t), "the node's file to hold "+label, func() bool {
			b, _ := os.ReadFile(filepath.Join(root, sealedPath))
			return string(b) == label+"-s3cr3t"
		})
	}
	stateSays := func(what string) {
		t.Helper()
		waitUntil(t, testCtx(t), "state to say "+what, func() bool {
			out, _, _ := m.cli(t, "state", "ace")
			return strings.Contains(strings.Join(strings.Fields(out), " "), what)
		})
	}
	// --wait 30s: a put filled at once does not wait it out, under any
	// load a test meets.
	if errs := put("up", "--wait", "30s"); strings.Contains(errs, "down since") || strings.Contains(errs, "is up since") {
		t.Errorf("a put with the agent and the provisioner up says one is down:\n%s", errs)
	}
	// It says the node got it, with the put's digest (a fresh user's
	// finding U7: put never said), well within its wait.
	if f := strings.Fields(out); len(f) < 7 || f[5] != "digest" {
		t.Fatalf("put's revision line: %q", out)
	} else {
		says("up", "\nfilled on ace (digest "+f[6]+")\n")
	}
	if took >= 30*time.Second {
		t.Errorf("a put filled at once took %s: it waited out its --wait", took)
	}
	filled("up")
	put("up", "--wait", "30s")
	says("the same content again", "filled on ace (digest ", "it held this content already")
	put("nowait", "--wait", "0")
	if strings.Contains(out, "filled") {
		t.Errorf("put --wait 0 waited: %q", out)
	}
	filled("nowait")

	stopAgent()
	stateSays("agent DOWN since")
	errs := put("agentdown")
	if !strings.Contains(errs, "note: node ace's agent is down since ") || !strings.Contains(errs, "agent stopped, lease released") ||
		!strings.Contains(errs, "the file is filled when the agent is back") {
		t.Errorf("a put while the agent is down does not say so:\n%s", errs)
	}
	t.Logf("a put while the agent is down says:\n%s", errs)
	says("agent down", "not filled yet: ace's provisioner did not report this put within 2s (--wait)", "node ace's agent is down: the file is filled when it is back")
	agent()
	filled("agentdown")

	stopProv()
	stateSays("prov DOWN since")
	errs = put("provdown", "--wait", "30s")
	if !strings.Contains(errs, "note: no provisioner of ace is up since ") || !strings.Contains(errs, "'meshfold provision ace …' runs again") ||
		strings.Contains(errs, "agent is down") {
		t.Errorf("a put while no provisioner is up does not say so:\n%s", errs)
	}
	t.Logf("a put while no provisioner is up says:\n%s", errs)
	says("provisioner down", "not filled yet: no provisioner of ace is up (the note above says since when); the file is filled when 'meshfold provision ace …' starts")
	if took >= 30*time.Second {
		t.Errorf("a put with no provisioner up took %s: it waited for none", took)
	}
	stopProv = prov()
	filled("provdown")

	// A provisioner killed -9 leaves its lease until the TTL: a lease not
	// renewed for more than half of it may be down. (One held here by a
	// process that does not renew it: the same key.)
	stopProv()
	stateSays("prov DOWN since")
	leases, err := store.OpenNodeLeases(testCtx(t), m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := store.NewHolder("provisioner", "ace")
	hv, _ := json.Marshal(h)
	if _, err := leases.Create(testCtx(t), store.ProvisionerLeaseKey("ace"), hv); err != nil {
		t.Fatal(err)
	}
	put("killed", "--wait", "3s")
	says("provisioner killed", "not filled yet: ace's provisioner did not report this put within 3s (--wait)",
		fmt.Sprintf("its provisioner (pid %d on %s) last renewed its lease ", h.PID, h.Host), "(TTL 5s; a live one renews it every 1.25s): it may be down")
	waitUntil(t, testCtx(t), "the unrenewed lease to expire", func() bool {
		_, err := leases.Get(testCtx(t), store.ProvisionerLeaseKey("ace"))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})

	// A provisioner whose --account is not the plan's: the node refuses
	// its writes, and the put says so (U7's third case).
	stopProv = func() func() {
		stop, _ := m.background(t, trust, "provision", "ace", "--from", "sealed", "--key", filepath.Join(dir, "prov", "curve.key"),
			"--account", "nbody", "--resync", "0", "--log-level", "warn")
		return stop
	}()
	// Its fill on start is refused; state says when the file was last
	// filled.
	stateSays("last filled at ")
	stateSays("a newer one is not written: refused since ")
	put("wrongaccount")
	says("wrong account", "not filled yet: refused: wrong-account: the node refuses writes from nbody", "start the provisioner with --account prov",
		"last filled on the node at ", "(gone if the node was rebooted or re-imaged since)")
	stopProv()
	stopProv = prov()
	filled("wrongaccount")

	// A provisioner that refuses the node's plans for their signer (its
	// --trust names another key: a trust file left stale by a key
	// rotation) holds no plan, fills nothing and reports no put: the put
	// says so at once, naming the key and what to do, instead of waiting
	// out --wait with "did not report this put".
	stopProv()
	rt, err := store.ReadTrustFile(trust)
	if err != nil {
		t.Fatal(err)
	}
	_, stale := testSigner(t)
	stopProv = func() func() {
		stop, _ := m.background(t, stale, "provision", "ace", "--from", "sealed", "--key", filepath.Join(dir, "prov", "curve.key"),
			"--account", "prov", "--resync", "0", "--log-level", "warn")
		return stop
	}()
	stateSays("its provisioner refuses the node's plans")
	put("untrusted", "--wait", "30s")
	says("untrusted provisioner", "not filled yet: ace's provisioner refuses the node's plans for their signer (since ",
		"is signed by key "+rt.Keys()[0]+", which this provisioner does not trust: if it is the reconciler's, add it to --trust (MESHFOLD_TRUST)",
		"it fills no file of ace until it trusts them (it reads its trust when it starts: restart it)",
		"last filled on the node at ", "(gone if the node was rebooted or re-imaged since)")
	if took >= 30*time.Second {
		t.Errorf("a put to a provisioner that refuses the node's plans took %s: it waited out its --wait", took)
	}
	stopProv()
	stopProv = prov()
	filled("untrusted")

	// The ceiling a put announces is the real one: the sealed record and
	// the fill request carrying the content fit the server's max_payload
	// (a fresh user's finding U23: 800,000 bytes failed with a raw "nats:
	// maximum payload exceeded", exit 1).
	big := filepath.Join(t.TempDir(), "big")
	putSize := func(n int) (string, string, int) {
		t.Helper()
		if err := os.WriteFile(big, bytes.Repeat([]byte{'b'}, n), 0o600); err != nil {
			t.Fatal(err)
		}
		return m.cli(t, "secret", "put", "ace", "app", sealedPath, "-f", big, "--by", "alice", "--wait", "30s")
	}
	before, _, _ := m.cli(t, "secret", "ls", "ace")
	_, errs, code := putSize(900000)
	const ceiling = "content is 900000 bytes; a sealed secret holds at most "
	i := strings.Index(errs, ceiling)
	if code != exitUsage || i < 0 || !strings.Contains(errs, " bytes on this server (max_payload 1 MiB): nothing stored") {
		t.Fatalf("a put over the ceiling: exit %d, want %d saying %q…:\n%s", code, exitUsage, ceiling, errs)
	}
	n, err := strconv.Atoi(strings.Fields(errs[i+len(ceiling):])[0])
	if err != nil || n < 700000 || n >= 900000 {
		t.Fatalf("the ceiling said: %q (%v)", errs, err)
	}
	if after, _, _ := m.cli(t, "secret", "ls", "ace"); after != before {
		t.Errorf("a refused put stored something:\n%s\n%s", before, after)
	}
	if _, errs, code := putSize(n + 1); code != exitUsage || !strings.Contains(errs, fmt.Sprintf("content is %d bytes; a sealed secret holds at most %d bytes", n+1, n)) {
		t.Errorf("a put one byte over the ceiling: exit %d\n%s", code, errs)
	}
	out, errs, code = putSize(n)
	if code != 0 || !strings.Contains(out, "\nfilled on ace (digest ") {
		t.Errorf("a put at the ceiling (%d bytes): exit %d, not filled:\n%s%s", n, code, out, errs)
	}
	if fi, err := os.Stat(filepath.Join(root, sealedPath)); err != nil || fi.Size() != int64(n) {
		t.Errorf("the node's file after a put of %d bytes: %v %v", n, fi, err)
	}
	t.Logf("a sealed secret holds at most %d bytes on a server of max_payload 1 MiB (%s %s %s, --by alice)", n, "ace", "app", sealedPath)

	// secret rm: the node keeps the file; state says when it was last
	// filled, not "not filled" (a fresh user's finding U10).
	if _, errs, code := m.cli(t, "secret", "rm", "ace", "app", sealedPath, "--by", "carol"); code != 0 {
		t.Fatalf("secret rm: %s", errs)
	}
	stateSays("ace app " + sealedPath + " last filled at ")
	stateSays("no source gives a newer one: missing since ")
	if st, _, _ := m.cli(t, "state", "ace"); strings.Contains(st, "not filled: missing") {
		t.Errorf("state says a file the node keeps is not filled:\n%s", st)
	}
}

// A --key file that does not exist while the node has a registered curve
// key is refused (exit 2, naming --new-key), not created and registered
// over it (a fresh user's finding U34: a mistyped path re-keyed the node);
// --new-key rotates. A key file that does not parse exits 2 saying what
// to do.
func TestMissingKeyFileRefused(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	trust := m.serveSigned(t)
	dir := t.TempDir()
	kv, err := store.OpenSecrets(testCtx(t), m.js, m.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	registered := func() string {
		pub, _, err := provision.RegisteredKey(testCtx(t), kv, "ace")
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	key := filepath.Join(dir, "prov", "curve.key")
	stop, _ := m.background(t, trust, "provision", "ace", "--from", "sealed", "--key", key, "--account", "prov", "--resync", "0")
	waitUntil(t, testCtx(t), "the provisioner to register its key", func() bool { return registered() != "" })
	stop()
	first := registered()

	typo := filepath.Join(dir, "prv", "curve.key")
	_, errs, code := m.cli(t, "provision", "ace", "--from", "sealed", "--key", typo, "--account", "prov", "--trust", trust)
	if code != exitUsage || !strings.Contains(errs, "--new-key") || !strings.Contains(errs, first) || !strings.Contains(errs, "is the path right?") {
		t.Errorf("a missing key file beside a registered key: exit %d, want 2 naming --new-key and the registered key:\n%s", code, errs)
	}
	if _, err := os.Stat(typo); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the mistyped key file was created: %v", err)
	}
	if got := registered(); got != first {
		t.Errorf("the registered key changed to %s", got)
	}

	bad := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(bad, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code = m.cli(t, "provision", "ace", "--from", "sealed", "--key", bad, "--account", "prov", "--trust", trust)
	if code != exitUsage || !strings.Contains(errs, "not a curve seed") || !strings.Contains(errs, "restore the key file") {
		t.Errorf("a key file that does not parse: exit %d, want 2 saying what to do:\n%s", code, errs)
	}

	// --new-key: the rotation the operator meant.
	stop, _ = m.background(t, trust, "provision", "ace", "--from", "sealed", "--key", typo, "--new-key", "--account", "prov", "--resync", "0")
	waitUntil(t, testCtx(t), "the new key to be registered", func() bool { return registered() != first })
	stop()
}

// A registered curve key that is no curve public key (a stray put of the
// key) refuses a put naming the node, the key, its bucket and the fix,
// not only the value (a fresh user's finding V5: `store: "{\"v\":1}" is
// not a curve public key`).
func TestSecretPutGarbageCurveKey(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: sealedPath, Mode: "0600"}}},
	}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(ctx, "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenSecrets(ctx, m.js, m.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, store.CurveKeyName("ace"), []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := m.cli(t, "secret", "put", "ace", "app", sealedPath, "-f", file, "--by", "alice")
	if code != exitError || !strings.Contains(errs, "node ace's registered curve key (key ace.curve-key of bucket "+kv.Bucket()+`) holds "{\"v\":1}", which is no curve public key`) ||
		!strings.Contains(errs, "restart node ace's provisioner") || strings.Contains(errs, "s3cr3t") {
		t.Errorf("secret put to a garbage curve key: exit %d, stderr %q", code, errs)
	}
}

// secret ls, of a secret sealed to a key registered before the node's
// current one, says when the key changed and to check for a stolen
// provisioner credential before putting again, not a plain "put again"
// (a tester's finding G3: ls told the operator to re-seal every genuine
// secret to the thief's key).
func TestSecretLsKeyChangedSinceThePut(t *testing.T) {
	m := startMesh(t)
	m.serveSigned(t)
	w := &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: sealedPath, Mode: "0600"}}},
	}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	kv, err := store.OpenSecrets(testCtx(t), m.js, m.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	register := func() {
		kp, err := nkeys.CreateCurveKeys()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		if _, err := kv.Put(testCtx(t), store.CurveKeyName("ace"), []byte(pub)); err != nil {
			t.Fatal(err)
		}
	}
	register() // the genuine provisioner's
	f := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(f, []byte("genuine-s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := m.cli(t, "secret", "put", "ace", "app", sealedPath, "-f", f, "--by", "alice", "--wait", "0"); code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	register() // a thief's, with the node's provisioner credential
	out, _, code := m.cli(t, "secret", "ls", "ace")
	if code != 0 || strings.Contains(out, "old key: put again") ||
		!strings.Contains(out, "registered curve key changed at") || !strings.Contains(out, "stolen provisioner credential") ||
		strings.Contains(out, "s3cr3t") {
		t.Errorf("secret ls after the key changed:\n%s", out)
	}
	// -o json carries the change's time on the row, for scripts.
	out, _, code = m.cli(t, "secret", "ls", "ace", "-o", "json")
	var rows []struct {
		Current    bool       `json:"current"`
		KeyChanged *time.Time `json:"key_changed"`
	}
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 || rows[0].Current || rows[0].KeyChanged == nil ||
		strings.Contains(out, "s3cr3t") {
		t.Errorf("secret ls -o json after the key changed (%v):\n%s", err, out)
	}
}
