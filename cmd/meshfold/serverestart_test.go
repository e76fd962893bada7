package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// serveRestartRig is `meshfold serve` as a process of its own, on a fixed
// address and data directory so that a test can kill it -9 and start it
// again, with `meshfold node` agents (runtime record) beside it and a
// client connection that reconnects to the restarted server at once. The
// processes are this test binary as the helper, or bin when set.
type serveRestartRig struct {
	addr, data, dir, bin string
	serve                *meshfoldProcess
	agents               map[string]*meshfoldProcess
	js                   jetstream.JetStream
	cfg                  store.StreamConfig
}

func startServeRestartRig(t testing.TB, bin string) *serveRestartRig {
	t.Helper()
	addr := storetest.FreeAddr(t) // held while serve restarts
	dir := t.TempDir()
	r := &serveRestartRig{addr: addr, data: filepath.Join(dir, "data"), dir: dir, bin: bin, agents: map[string]*meshfoldProcess{},
		cfg: store.StreamConfig{}.WithDefaults()}
	r.startServe(t)
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "serve's stream", func() bool {
		_, err := r.js.Stream(testCtx(t), r.cfg.Name)
		return err == nil
	})
	return r
}

func (r *serveRestartRig) start(t testing.TB, args ...string) *meshfoldProcess {
	t.Helper()
	if r.bin != "" {
		return startMeshfoldCmd(t, exec.Command(r.bin, args...), args)
	}
	return startMeshfold(t, args...)
}

func (r *serveRestartRig) startServe(t testing.TB) {
	t.Helper()
	r.serve = r.start(t, "serve", "--data", r.data, "--listen", r.addr, "--log-level", "info")
}

func (r *serveRestartRig) startAgent(t testing.TB, node string) {
	t.Helper()
	r.agents[node] = r.start(t, "node", node, "--runtime", "record", "--root", filepath.Join(r.dir, node+"-root"),
		"--state-dir", filepath.Join(r.dir, node+"-state"), "--server", "nats://"+r.addr, "--trust-from", r.data, "--log-level", "info")
}

// agentEvents returns node's agent events as "up C" and "down C why",
// and the stream time of the newest; false when the stream cannot be
// read (the server is restarting).
func (r *serveRestartRig) agentEvents(t testing.TB, node string) ([]string, time.Time, bool) {
	t.Helper()
	var out []string
	var last time.Time
	ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second)
	defer cancel()
	err := store.ReadNode(ctx, r.js, r.cfg.Name, r.cfg.Subjects(), node, 0, 0, func(m store.Msg) error {
		if a, ok := m.Event.Payload.(*events.Agent); ok {
			s := string(a.State) + " " + a.Claim
			if a.Why != "" {
				s += " " + string(a.Why)
			}
			out, last = append(out, s), m.Event.Time
		}
		return nil
	})
	return out, last, err == nil
}

// waitAgentEvents waits until node's agent events match pred and returns
// them with the newest one's stream time.
func (r *serveRestartRig) waitAgentEvents(t testing.TB, node string, limit time.Duration, what string, pred func([]string) bool) ([]string, time.Time) {
	t.Helper()
	type seen struct {
		evs  []string
		last time.Time
	}
	s := waitfor.Value(t, limit, what, func() (seen, bool) {
		evs, last, ok := r.agentEvents(t, node)
		return seen{evs, last}, ok && pred(evs)
	})
	return s.evs, s.last
}

// fleetAgents returns each node's agent column of `fleet -o json`.
func (r *serveRestartRig) fleetAgents(t testing.TB) (map[string]string, bool) {
	var out bytes.Buffer
	var errb storetest.SyncBuffer
	if run(testCtx(t), []string{"fleet", "-o", "json", "--warnings", "0", "--server", "nats://" + r.addr}, nil, &out, &errb) != 0 {
		return nil, false
	}
	agent := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var row audit.FleetRow
		if json.Unmarshal([]byte(line), &row) == nil {
			agent[row.Node] = row.Agent
		}
	}
	return agent, true
}

// serveRestartResult is what one serve restart with live agents and a
// dead one showed.
type serveRestartResult struct {
	// falseDowns: the live agents with any agent event but their up.
	falseDowns int
	// stored, shown: the dead agent's down stored in the stream, and
	// seen in fleet, after its kill; back: serve's restart after it.
	stored, shown, back time.Duration
	// live: each live agent's agent events, and want: its up.
	live, want map[string][]string
}

// serveRestart starts serve and live+1 agents; once each is up it kills
// the last agent -9, then serve -9, keeps serve down for the lease TTL and
// a second, starts it again on its data, and waits (bounded) for the
// killed agent's down in the stream and in fleet with every live agent up.
func serveRestart(t testing.TB, bin string, live int) serveRestartResult {
	t.Helper()
	r := startServeRestartRig(t, bin)
	var nodes []string
	for i := range live + 1 {
		nodes = append(nodes, fmt.Sprintf("n%02d", i+1))
	}
	dead := nodes[live]
	claims := map[string]string{}
	for _, node := range nodes {
		r.startAgent(t, node)
	}
	for _, node := range nodes {
		evs, _ := r.waitAgentEvents(t, node, time.Minute, node+"'s up", func(evs []string) bool { return len(evs) == 1 })
		claims[node] = strings.TrimPrefix(evs[0], "up ")
	}

	// The dead agent first, then serve before its lease expires: its down
	// is left to the restarted serve.
	if err := r.agents[dead].cmd.Process.Kill(); err != nil { // SIGKILL, by pid
		t.Fatal(err)
	}
	killed := time.Now()
	if err := r.serve.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.serve.done
	// The outage itself (what is measured, not a wait for something):
	// longer than the lease TTL, so every lease has expired when the
	// server reads its store again.
	<-time.After(store.DefaultNodeLeaseTTL + time.Second)
	r.startServe(t)
	res := serveRestartResult{back: time.Since(killed), live: map[string][]string{}, want: map[string][]string{}}

	// Bound: the grace after serve's return, plus its start-up and the
	// reconciler's first load (seconds under the race detector).
	limit := time.Since(killed) + engine.AgentGrace(store.DefaultNodeLeaseTTL) + 20*time.Second
	wantDead := []string{"up " + claims[dead], "down " + claims[dead] + " expired"}
	_, at := r.waitAgentEvents(t, dead, limit, "the killed agent's down", func(evs []string) bool { return slices.Equal(evs, wantDead) })
	res.stored = at.Sub(killed)
	waitfor.Until(t, 30*time.Second, "fleet to show the live agents up and the killed one down", func() bool {
		agent, ok := r.fleetAgents(t)
		if !ok || agent[dead] != "down" {
			return false
		}
		if res.shown == 0 {
			res.shown = time.Since(killed)
		}
		for _, node := range nodes[:live] {
			if agent[node] != "up" {
				return false
			}
		}
		return true
	})
	// The dead agent's down was recorded when the grace ended, with every
	// lease still missing then: the live agents' histories are complete
	// (fleet's snapshot came after).
	for _, node := range nodes[:live] {
		evs, _, ok := r.agentEvents(t, node)
		if !ok {
			t.Fatalf("%s's events not read", node)
		}
		res.live[node], res.want[node] = evs, []string{"up " + claims[node]}
		if !slices.Equal(evs, res.want[node]) {
			res.falseDowns++
		}
	}
	return res
}

// After `meshfold serve` (embedded server and reconciler) is killed -9 and
// restarted on its data longer than the node lease TTL later, the agents
// that stayed alive have no down in their history (their leases expired
// only because no server ran), while an agent killed -9 just before serve
// is recorded down when the grace after serve's return ends.
func TestServeRestartKeepsLiveAgentsUp(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts processes: not in -short")
	}
	res := serveRestart(t, "", 4)
	grace := engine.AgentGrace(store.DefaultNodeLeaseTTL)
	t.Logf("agent killed -9, then serve, restarted %s later: down stored %s after the kill (%s after serve's start, grace %s), in fleet %s after the kill",
		res.back.Round(time.Millisecond), res.stored.Round(time.Millisecond), (res.stored - res.back).Round(time.Millisecond), grace, res.shown.Round(time.Millisecond))
	if res.stored-res.back < grace-time.Second {
		t.Errorf("the killed agent's down was stored %s after serve's start, before the grace (%s) ended", res.stored-res.back, grace)
	}
	for node, evs := range res.live {
		if !slices.Equal(evs, res.want[node]) {
			t.Errorf("%s's agent stayed alive through serve's restart; its agent events: %q, want %q", node, evs, res.want[node])
		}
	}
}

// BenchmarkServeRestartAgents: `meshfold serve` killed -9 and restarted
// 6 s later with 20 live agents and one killed -9 just before it: the
// live agents recorded down (false-downs), and the killed one's down
// stored and shown in fleet after its kill. MESHFOLD_BENCH_BIN runs a
// built meshfold for serve and the agents (an A/B of two builds).
//
//	go test ./cmd/meshfold -run '^$' -bench ServeRestartAgents -benchtime 1x
func BenchmarkServeRestartAgents(b *testing.B) {
	bin := os.Getenv("MESHFOLD_BENCH_BIN")
	for range b.N {
		res := serveRestart(b, bin, 20)
		b.ReportMetric(float64(res.falseDowns), "false-downs")
		b.ReportMetric(float64(res.stored.Milliseconds()), "down-stored-ms")
		b.ReportMetric(float64(res.shown.Milliseconds()), "down-shown-ms")
		b.Logf("serve restarted %s after the kill: %d of 20 live agents recorded down; the killed agent's down stored %s, in fleet %s after its kill",
			res.back.Round(time.Millisecond), res.falseDowns, res.stored.Round(time.Millisecond), res.shown.Round(time.Millisecond))
	}
}
