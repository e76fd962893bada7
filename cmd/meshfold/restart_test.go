package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// Restarts after kill -9 (issue 24, "back within a second"): a role's
// process is killed with SIGKILL, by its pid, and started again at once,
// on the same host; each restart is timed from the new process's start
// to its first plan (serve, reconcile: the plan of a want published
// around the restart) or its first have (a node agent). The dead
// predecessor's lease is taken at once (store.AcquireLease), so none of
// them waits out a TTL.
//
// TestRestartAfterKill asserts only that every restart plans (or
// reports) eventually and logs the figures; BenchmarkRestartAfterKill
// reports p50 and max over 20 restarts per role, with meshfold built as
// shipped (no race detector):
//
//	go test ./cmd/meshfold -run '^$' -bench RestartAfterKill -benchtime 1x

func TestRestartAfterKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts processes: not in -short")
	}
	for _, role := range []string{"serve", "reconcile", "node"} {
		t.Run(role, func(t *testing.T) {
			waits := restartAfterKill(t, role, 3, helperCommand)
			t.Logf("%s: restart after kill -9 → first %s: %s", role, firstOf(role), figures(waits))
		})
	}
}

func BenchmarkRestartAfterKill(b *testing.B) {
	bin := meshfoldBinary(b)
	for _, role := range []string{"serve", "reconcile", "node"} {
		b.Run(role, func(b *testing.B) {
			var waits []time.Duration
			for range b.N {
				waits = append(waits, restartAfterKill(b, role, 20, func(args ...string) *exec.Cmd { return exec.Command(bin, args...) })...)
			}
			b.ReportMetric(float64(percentile(waits, 50).Milliseconds()), "p50-ms")
			b.ReportMetric(float64(slices.Max(waits).Milliseconds()), "max-ms")
			b.Logf("%s: restart after kill -9 → first %s: %s", role, firstOf(role), figures(waits))
		})
	}
}

// helperCommand runs this test binary as `meshfold args...`
// (TestHelperProcess).
func helperCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperProcess$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), "MESHFOLD_HELPER_PROCESS=1")
	return cmd
}

func firstOf(role string) string {
	if role == "node" {
		return "have"
	}
	return "plan"
}

func figures(waits []time.Duration) string {
	return fmt.Sprintf("%d restarts, p50 %s, max %s", len(waits), percentile(waits, 50).Round(time.Millisecond),
		slices.Max(waits).Round(time.Millisecond))
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// restartAfterKill starts role, then kills it with SIGKILL and starts it
// again at once, kills times, and returns each restart's time from the
// new process's start to its first plan (serve, reconcile) or have
// (node). It fails tb if one never comes (within a minute).
func restartAfterKill(tb testing.TB, role string, kills int, command func(args ...string) *exec.Cmd) []time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := tb.TempDir()
	var args []string
	var url string
	switch role {
	case "serve":
		addr := storetest.FreeAddr(tb)
		url = "nats://" + addr
		args = []string{"serve", "--data", filepath.Join(dir, "data"), "--listen", addr, "--log-level", "warn"}
	case "reconcile":
		m := startMesh(tb)
		url = m.e.ClientURL()
		args = []string{"reconcile", "--server", url, "--signing-key", filepath.Join(dir, signingKeyFile), "--log-level", "warn"}
	case "node":
		m := startMesh(tb)
		url = m.e.ClientURL()
		_, trust := testSigner(tb)
		args = []string{"node", "ace", "--runtime", "record", "--root", filepath.Join(dir, "root"),
			"--state-dir", filepath.Join(dir, "state"), "--server", url, "--trust", trust, "--log-level", "warn"}
	}

	connected := make(chan struct{}, 1)
	signal := func(*nats.Conn) {
		select {
		case connected <- struct{}{}:
		default:
		}
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(signal), nats.ReconnectHandler(signal))
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	subj := events.Subjects{Prefix: events.DefaultPrefix}
	// The first plan or have is seen live, on its plain subject.
	watched := subj.Event("*", events.KindPlan)
	if role == "node" {
		watched = subj.Event("ace", events.KindHave)
	}
	seen := make(chan string, 64)
	sub, err := nc.Subscribe(watched, func(m *nats.Msg) {
		select {
		case seen <- m.Subject:
		default:
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	defer sub.Unsubscribe()
	if role != "serve" { // serve's server is not there yet: its subscription is sent on connecting
		if err := nc.FlushWithContext(ctx); err != nil {
			tb.Fatal(err)
		}
	}

	var proc *exec.Cmd
	var stderr *storetest.SyncBuffer
	start := func() time.Time {
		proc, stderr = command(args...), &storetest.SyncBuffer{}
		proc.Stderr = stderr
		began := time.Now()
		if err := testproc.StartChild(proc); err != nil { // dies with a killed test
			tb.Fatal(err)
		}
		return began
	}
	defer func() {
		if proc != nil && proc.ProcessState == nil {
			_ = proc.Process.Kill() // by pid: the process this test started
			_ = proc.Wait()
		}
	}()
	pub := store.NewPublisher(js, subj)
	// reconnected waits for the connection to serve's new server.
	reconnected := func() {
		select {
		case <-connected:
		case <-ctx.Done():
			tb.Fatalf("never connected to serve; stderr:\n%s", stderr.String())
		}
	}
	want := func(node string) {
		w := &events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1", RunsAs: "app"}}}
		if _, err := pub.AppendRetrying(ctx, node, events.Stamp(w, time.Now())); err != nil {
			tb.Fatalf("want %s: %v", node, err)
		}
	}
	// first waits for the plan of node's want (serve, reconcile) or the
	// first have since (node).
	first := func(node string, began time.Time) time.Duration {
		tb.Helper()
		expect := subj.Event(node, events.KindPlan)
		if role == "node" {
			expect = watched
		}
		for {
			select {
			case s := <-seen:
				if s == expect {
					return time.Since(began)
				}
			case <-ctx.Done():
				tb.Fatalf("%s never sent its first %s after its start; stderr:\n%s", role, firstOf(role), stderr.String())
			}
		}
	}
	drain := func() {
		for {
			select {
			case <-seen:
			default:
				return
			}
		}
	}

	began := start()
	if role == "serve" {
		reconnected()
	}
	if role != "node" {
		want("n0")
	}
	first("n0", began)
	var waits []time.Duration
	for i := 1; i <= kills; i++ {
		if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
			tb.Fatal(err)
		}
		_ = proc.Wait()
		node := fmt.Sprintf("n%d", i)
		if role == "reconcile" {
			want(node) // while no reconciler runs: the restarted one plans it
		}
		drain()
		select {
		case <-connected:
		default:
		}
		began := start()
		if role == "serve" {
			reconnected()
			want(node) // once the restarted serve's NATS server takes it
		}
		waits = append(waits, first(node, began))
	}
	return waits
}
