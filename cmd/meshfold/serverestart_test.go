package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
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
// client connection that reconnects to the restarted server at once.
type serveRestartRig struct {
	addr, data, dir string
	serve           *meshfoldProcess
	agents          map[string]*meshfoldProcess
	js              jetstream.JetStream
	cfg             store.StreamConfig
}

func startServeRestartRig(t *testing.T) *serveRestartRig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	r := &serveRestartRig{addr: addr, data: filepath.Join(dir, "data"), dir: dir, agents: map[string]*meshfoldProcess{},
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

func (r *serveRestartRig) startServe(t *testing.T) {
	t.Helper()
	r.serve = startMeshfold(t, "serve", "--data", r.data, "--listen", r.addr, "--log-level", "info")
}

func (r *serveRestartRig) startAgent(t *testing.T, node string) {
	t.Helper()
	r.agents[node] = startMeshfold(t, "node", node, "--runtime", "record", "--root", filepath.Join(r.dir, node+"-root"),
		"--state-dir", filepath.Join(r.dir, node+"-state"), "--server", "nats://"+r.addr, "--trust-from", r.data, "--log-level", "info")
}

// agentEvents returns node's agent events as "up C" and "down C why",
// and the stream time of the newest; nil when the stream cannot be read
// (the server is restarting).
func (r *serveRestartRig) agentEvents(t *testing.T, node string) ([]string, time.Time, bool) {
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
func (r *serveRestartRig) waitAgentEvents(t *testing.T, node string, limit time.Duration, what string, pred func([]string) bool) ([]string, time.Time) {
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

// killServe kills serve with SIGKILL, by its pid, and waits for its end.
func (r *serveRestartRig) killServe(t *testing.T) {
	t.Helper()
	if err := r.serve.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.serve.done
}

// After `meshfold serve` (embedded server and reconciler) is killed -9 and
// restarted on its data longer than the node lease TTL later, the agents
// that stayed alive have no down in their history (their leases expired
// only because no server ran), while an agent killed -9 just before serve
// is recorded down within the grace after serve's return.
func TestServeRestartKeepsLiveAgentsUp(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts processes: not in -short")
	}
	r := startServeRestartRig(t)
	live := []string{"n1", "n2", "n3", "n4"}
	const dead = "n5"
	claims := map[string]string{}
	for _, node := range append(slices.Clone(live), dead) {
		r.startAgent(t, node)
	}
	for _, node := range append(slices.Clone(live), dead) {
		evs, _ := r.waitAgentEvents(t, node, time.Minute, node+"'s up", func(evs []string) bool { return len(evs) == 1 })
		claims[node] = strings.TrimPrefix(evs[0], "up ")
	}

	// The dead agent first, then serve before its lease expires: its down
	// is left to the restarted serve.
	if err := r.agents[dead].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	r.killServe(t)
	// The outage itself (what the test is about, not a wait for
	// something): longer than the lease TTL, so every lease has expired
	// when the server reads its store again.
	outage := store.DefaultNodeLeaseTTL + time.Second
	<-time.After(outage)
	r.startServe(t)
	back := time.Now()

	grace := engine.AgentGrace(store.DefaultNodeLeaseTTL)
	// Bound: the grace after serve's return, plus its start-up and the
	// reconciler's first load (seconds under the race detector).
	limit := time.Since(killed) + grace + 20*time.Second
	wantDead := []string{"up " + claims[dead], "down " + claims[dead] + " expired"}
	_, at := r.waitAgentEvents(t, dead, limit, "the killed agent's down", func(evs []string) bool { return slices.Equal(evs, wantDead) })
	t.Logf("agent killed -9, serve killed -9 and restarted %s later: down stored %s after the kill, %s after serve's start (grace %s)",
		outage, at.Sub(killed).Round(time.Millisecond), at.Sub(back).Round(time.Millisecond), grace)
	if at.Sub(back) < grace-time.Second {
		t.Errorf("the killed agent's down was stored %s after serve's start, before the grace (%s) ended", at.Sub(back), grace)
	}

	// fleet says so too, once the reconciler's snapshots have it.
	waitfor.Until(t, 30*time.Second, "fleet to show the live agents up and the killed one down", func() bool {
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		if run(testCtx(t), []string{"fleet", "-o", "json", "--warnings", "0", "--server", "nats://" + r.addr}, nil, &out, &errb) != 0 {
			return false
		}
		agent := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var row audit.FleetRow
			if json.Unmarshal([]byte(line), &row) == nil {
				agent[row.Node] = row.Agent
			}
		}
		for _, node := range live {
			if agent[node] != "up" {
				return false
			}
		}
		return agent[dead] == "down"
	})
	// The dead agent's down was recorded when the grace ended, with every
	// lease still missing then: the live agents' histories are complete
	// (fleet's snapshot came after), and each is its one up.
	for _, node := range live {
		evs, _, ok := r.agentEvents(t, node)
		if !ok {
			t.Fatalf("%s's events not read", node)
		}
		if want := []string{"up " + claims[node]}; !slices.Equal(evs, want) {
			t.Errorf("%s's agent stayed alive through serve's restart; its agent events: %q, want %q", node, evs, want)
		}
	}
}
