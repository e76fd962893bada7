package embedded_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// logRecords keeps the records of a logger and wakes waiters on each.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
	ch   chan struct{}
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
	default:
	}
	return nil
}

// count returns how many records at level have a message starting with prefix.
func (l *logRecords) count(level slog.Level, prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level && strings.HasPrefix(r.Message, prefix) {
			n++
		}
	}
	return n
}

// waitFor waits until count(level, prefix) > 0 or the deadline.
func (l *logRecords) waitFor(t *testing.T, level slog.Level, prefix string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for l.count(level, prefix) == 0 {
		select {
		case <-l.ch:
		case <-deadline:
			t.Fatalf("no %v log line %q within %s", level, prefix, d)
		}
	}
}

// smallFS is storetest.SmallFS under /tmp/diskfull-*.
func smallFS(t *testing.T, size string) (string, func(size string)) {
	t.Helper()
	return storetest.SmallFS(t, "diskfull-", size)
}

// TestFullDataDirRecoversWithoutRestart fills a real 4 MB filesystem
// under the embedded server until it refuses a write, then grows the
// filesystem: the refusal says the server cannot store, serve logs the
// episode at ERROR once, and storing resumes without a restart, logged.
func TestFullDataDirRecoversWithoutRestart(t *testing.T) {
	dir, resize := smallFS(t, "4m")
	r := startFullRig(t, dir+"/data", 5*time.Second)
	ctx, logs, stream, pub, want, publish := r.ctx, r.logs, r.stream, r.pub, r.want, r.publish
	var refused error
	for i := 0; i < 4000; i++ { // 20 MB: far more than 4 MB holds
		if refused = publish(); refused != nil {
			break
		}
	}
	if !errors.Is(refused, store.ErrStorageFull) {
		t.Fatalf("a write to a full store: got %v, want an error matching store.ErrStorageFull", refused)
	}
	if !strings.HasPrefix(refused.Error(), "append mesh.w.want: the server cannot store: its data directory is full (or its storage limit reached): insufficient resources") {
		t.Errorf("the refusal says %q", refused)
	}
	t.Logf("refused: %v", refused)
	const stopped, resumed = "JetStream stopped storing: the data directory", "JetStream stores again"
	logs.waitFor(t, slog.LevelError, stopped, 10*time.Second)
	// A user's verb does not retry a full store until its timeout.
	start := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := pub.AppendRetrying(rctx, "w", want)
	rcancel()
	if took := time.Since(start); !errors.Is(err, store.ErrStorageFull) || took > 10*time.Second {
		t.Fatalf("a verb's append to the still full store: got %v after %s, want store.ErrStorageFull at once", err, took.Round(time.Millisecond))
	}

	resize("32m")
	freed := time.Now()
	var first time.Duration
	for {
		err := publish()
		if err == nil {
			first = time.Since(freed)
			break
		}
		if time.Since(freed) > 30*time.Second {
			t.Fatalf("no write stored within 30 s of the filesystem growing to 32 MB: %v", err)
		}
		select {
		case <-logs.ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("first write stored %s after the filesystem grew", first.Round(time.Millisecond))
	logs.waitFor(t, slog.LevelWarn, resumed, 10*time.Second)
	if n := logs.count(slog.LevelError, stopped); n != 1 {
		t.Errorf("%d ERROR lines %q for one episode, want 1", n, stopped)
	}
	// The stream held on through JetStream's restart.
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs < 2 {
		t.Errorf("the stream holds %d messages after the restart of JetStream", info.State.Msgs)
	}
}

// TestFilesystemFilledByAnotherProcessRecovers is a fresh user's finding
// G1: the store under its limit, another process fills the filesystem
// (a file written beside the data directory) until the server fails a
// write ("Critical write error … no space left on device"), then the
// file is removed. A file store keeps a failed write's error and refused
// every later write, and serve logged "stores again" while the stream
// took none for 10 minutes: a write is stored again within 30 s of the
// room coming back.
func TestFilesystemFilledByAnotherProcessRecovers(t *testing.T) {
	dir, _ := smallFS(t, "32m")
	r := startFullRig(t, dir+"/data", 3*time.Second)
	logs, publish := r.logs, r.publish
	for range 5 {
		if err := publish(); err != nil {
			t.Fatal(err)
		}
	}
	// Another process's file takes the filesystem's room, to a few kB.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break // no space left
		}
	}
	f.Close()
	var refused error
	for range 200 { // a block's tail takes some writes before one fails
		if refused = publish(); refused != nil {
			break
		}
	}
	if refused == nil {
		t.Fatal("every write to a full filesystem was stored")
	}
	logs.waitFor(t, slog.LevelError, "JetStream stopped storing: the data directory", 10*time.Second)
	t.Logf("refused: %v", refused)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	for {
		err := publish()
		if err == nil {
			break
		}
		if time.Since(freed) > 30*time.Second {
			t.Fatalf("no write stored within 30 s of the filler's removal: %v", err)
		}
	}
	t.Logf("first write stored %s after the room came back", time.Since(freed).Round(time.Millisecond))
	logs.waitFor(t, slog.LevelWarn, "JetStream stores again", 10*time.Second)
}

// fullRig is an embedded server on a data directory whose log the test
// reads, its stream, and a publisher of one want of ~5 kB (32 modules,
// as the fresh user's) to node w, each publish bounded by ask.
type fullRig struct {
	ctx    context.Context
	logs   *logRecords
	stream jetstream.Stream
	pub    *store.Publisher
	want   *events.Want
	ask    time.Duration
	js     jetstream.JetStream
}

// startFullRig starts the server on dataDir and ensures the stream; the
// server stops when the test ends.
func startFullRig(t *testing.T, dataDir string, ask time.Duration) *fullRig {
	t.Helper()
	r := &fullRig{logs: &logRecords{ch: make(chan struct{}, 1)}, ask: ask}
	e, err := embedded.Start(embedded.Config{DataDir: dataDir, Listen: "127.0.0.1:-1", Logger: slog.New(r.logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var mods []events.WantModule
	for i := range 32 {
		mods = append(mods, events.WantModule{Name: fmt.Sprintf("mod%d", i), Build: fmt.Sprintf("img:sha256:%064d", i), RunsAs: "nobody"})
	}
	r.ctx, r.stream, r.pub, r.js = ctx, stream, store.NewPublisher(js, cfg.Subjects()), js
	r.want = events.Stamp(&events.Want{Modules: mods}, time.Now())
	return r
}

// publish appends the rig's want to node w, within its ask.
func (r *fullRig) publish() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.ask)
	defer cancel()
	_, err := r.pub.Append(ctx, "w", r.want)
	return err
}

// An agent that claims its node's lease while the filesystem is full
// (another process filled it): the previous agent's key names a process
// that is gone, so the claim writes it again, and the server, whose file
// store failed a write, answers none. The claim waited for as long as it
// took with nothing in its log past "lease held: waiting" (a fresh
// user's finding G1: 11 minutes): it says why it waits, at once.
func TestLeaseClaimSaysItsWriteIsNotStored(t *testing.T) {
	dir, _ := smallFS(t, "32m")
	r := startFullRig(t, dir+"/data", 3*time.Second)
	kv, err := store.OpenNodeLeases(r.ctx, r.js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// The previous agent of ace: a process of this host that is gone.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	h := store.NewHolder("node", "ace")
	h.PID = gone.Process.Pid
	value, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(r.ctx, "ace", value); err != nil {
		t.Fatal(err)
	}
	fillFS(t, dir)
	// Writes to the bucket until one fails: its file store keeps the
	// error (a block's tail takes some writes first).
	pad := make([]byte, 1024)
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
		_, err := kv.Put(pctx, fmt.Sprintf("pad%d", i), pad)
		cancel()
		if err != nil {
			break
		}
		if i == 5000 {
			t.Fatal("every write to a full filesystem was stored")
		}
	}
	logs := &logRecords{ch: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(r.ctx)
	claimed := make(chan error, 1)
	go func() {
		l, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), slog.New(logs))
		if err == nil {
			l.Release(context.Background())
		}
		claimed <- err
	}()
	defer func() {
		cancel()
		<-claimed
	}()
	defer func() {
		if t.Failed() {
			logs.mu.Lock()
			for _, rec := range logs.recs {
				t.Logf("claim said: %s", rec.Message)
			}
			logs.mu.Unlock()
			select {
			case err := <-claimed:
				t.Logf("claim: %v", err)
				claimed <- err
			default:
			}
		}
	}()
	logs.waitFor(t, slog.LevelWarn, "lease ace not claimed yet: its write has not been stored since ", 20*time.Second)
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, rec := range logs.recs {
		if strings.HasPrefix(rec.Message, "lease ace not claimed yet") {
			t.Logf("said: %s", rec.Message)
			if !strings.Contains(rec.Message, "a full data directory?") || !strings.Contains(rec.Message, "said again each minute") {
				t.Errorf("the claim's line does not say why it waits, or when it says it again: %s", rec.Message)
			}
		}
	}
}

// fillFS writes a file beside the data directory until the filesystem
// under dir has no room.
func fillFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			return
		}
	}
}
