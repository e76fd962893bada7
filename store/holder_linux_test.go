package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// child starts `sleep 60`, a process of this test's own, and returns it
// with a Holder naming it as NewHolder names this process: same host,
// boot id and pid namespace, its pid and start time. The process is
// killed (by its pid) and reaped at cleanup.
func child(t *testing.T) (*exec.Cmd, store.Holder) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to run: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	h := store.NewHolder("node", "ace")
	if h.Boot == "" || h.PIDNS == "" || h.Start == 0 {
		t.Fatalf("NewHolder on Linux: %+v, want its boot id, pid namespace and start time", h)
	}
	h.PID, h.Start, h.Token = cmd.Process.Pid, startOf(t, cmd.Process.Pid), "child"
	return cmd, h
}

// startOf reads field 22 of /proc/<pid>/stat.
func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := bytes.Fields(data[bytes.LastIndexByte(data, ')')+1:])
	n, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// kill kills cmd with SIGKILL, by its pid, and reaps it.
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// A holder is proven dead only on this host, this boot and this pid
// namespace, when its pid is no process, a zombie, or another process;
// anything else may be alive.
func TestProvablyDead(t *testing.T) {
	t.Parallel()
	live, h := child(t)
	if store.ProvablyDead(h) {
		t.Errorf("a live process (pid %d) was taken for dead", h.PID)
	}
	me := store.NewHolder("node", "ace")
	if store.ProvablyDead(me) {
		t.Errorf("this process was taken for dead")
	}
	reused := h
	reused.Start++ // the pid is another process now
	if !store.ProvablyDead(reused) {
		t.Errorf("a pid that names another process (start %d, holder's %d) was not taken for dead", h.Start+1, reused.Start)
	}
	for name, edit := range map[string]func(*store.Holder){
		"another boot":          func(x *store.Holder) { x.Boot = "00000000-0000-0000-0000-000000000000" },
		"another host":          func(x *store.Holder) { x.Host += "-elsewhere" },
		"another pid namespace": func(x *store.Holder) { x.PIDNS = "pid:[1]" },
		"no identity":           func(x *store.Holder) { x.Boot, x.PIDNS, x.Start = "", "", 0 },
	} {
		x := reused
		edit(&x)
		if store.ProvablyDead(x) {
			t.Errorf("%s: a holder that may be alive was taken for dead: %+v", name, x)
		}
	}

	// Killed but not reaped: a zombie renews nothing.
	if err := live.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Wait for its exit without reaping it (WNOWAIT): it stays a zombie.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, h.PID, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if !store.ProvablyDead(h) {
		t.Errorf("a zombie (pid %d) was not taken for dead", h.PID)
	}
	_ = live.Wait()
	if !store.ProvablyDead(h) {
		t.Errorf("a reaped pid %d was not taken for dead", h.PID)
	}
	dead := h
	dead.Boot = "00000000-0000-0000-0000-000000000000"
	if store.ProvablyDead(dead) {
		t.Errorf("a gone pid recorded at another boot was taken for dead")
	}
}

// minuteBucket returns a lease bucket with a TTL of a minute: longer than
// a test's context, so no claim below succeeds by waiting out a key.
func minuteBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, _, js := storetest.Start(t)
	kv, err := js.CreateKeyValue(testCtx(t), jetstream.KeyValueConfig{Bucket: "MESH_NODES", History: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// The lease of a holder that died on this host (killed, its pid gone) is
// taken at once, by an update at the revision read: no wait for its key
// to expire (a minute here, longer than the test's context).
func TestLeaseOfADeadProcessIsTakenAtOnce(t *testing.T) {
	t.Parallel()
	kv := minuteBucket(t)
	ctx := testCtx(t)
	cmd, h := child(t)
	val, _ := json.Marshal(h)
	rev, err := kv.Create(ctx, "ace", val)
	if err != nil {
		t.Fatal(err)
	}
	kill(t, cmd)
	start := time.Now()
	l, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	t.Logf("took a dead process's lease after %s (TTL %s)", time.Since(start).Round(time.Millisecond), l.TTL())
	e, err := kv.Get(ctx, "ace")
	if err != nil {
		t.Fatal(err)
	}
	var got store.Holder
	if err := json.Unmarshal(e.Value(), &got); err != nil || got.PID != os.Getpid() || e.Revision() != rev+1 {
		t.Fatalf("key holds %s at revision %d, %v; want this process's claim at revision %d", e.Value(), e.Revision(), err, rev+1)
	}
}

// waitingLog is a slog handler that closes waiting when a claim logs that
// it waits for the holder.
type waitingLog struct {
	slog.Handler
	waiting chan struct{}
}

func (w waitingLog) Enabled(context.Context, slog.Level) bool { return true }

func (w waitingLog) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "lease held: waiting") {
		close(w.waiting)
	}
	return nil
}

// The lease of a live process, or of one recorded on another boot (or
// host), is not taken: the claim waits for a renewal or the key's
// expiry, and the key keeps its holder.
func TestLeaseOfALiveOrDistantHolderIsNotTaken(t *testing.T) {
	t.Parallel()
	cmd, live := child(t)
	distant := live
	distant.Boot, distant.Token = "00000000-0000-0000-0000-000000000000", "distant"
	// In this order: "another boot" kills the child, so "live" must run
	// first (a map's order once ran them the other way round and the
	// live case met a dead pid).
	for _, c := range []struct {
		name string
		h    store.Holder
	}{{"live", live}, {"another boot", distant}} {
		name, h := c.name, c.h
		t.Run(name, func(t *testing.T) {
			kv := minuteBucket(t)
			val, _ := json.Marshal(h)
			if _, err := kv.Create(testCtx(t), "ace", val); err != nil {
				t.Fatal(err)
			}
			if name == "another boot" && cmd.ProcessState == nil {
				kill(t, cmd) // its pid is gone here, but it was another boot's
			}
			ctx, cancel := context.WithCancel(testCtx(t))
			log := waitingLog{Handler: slog.DiscardHandler, waiting: make(chan struct{})}
			go func() { <-log.waiting; cancel() }()
			_, err := store.AcquireLease(ctx, kv, "ace", store.NewHolder("node", "ace"), slog.New(log))
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("claim: %v, want it waiting (then stopped)", err)
			}
			e, err := kv.Get(testCtx(t), "ace")
			if err != nil || string(e.Value()) != string(val) {
				t.Fatalf("key: %v %s, want the holder's kept", err, e.Value())
			}
		})
	}
}
