package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/process"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// A real module that crashes three times after running and then runs
// for good is flapping in fleet's row right after its last crash and no
// longer once it has run crash-free for reconcile.FlapSettle (twice its
// crash gap being shorter), although its newest have is still the
// flapping one: the node agent sends no have while it runs (a fresh
// user's finding F9, where fleet said "app flapping ×3" five minutes
// after the module ran healthy again). The haves are the agent's own,
// folded as the reconciler folds them; the row is read at two times.
func TestFlappedModuleSettles(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*rolloutDeadline)
	defer cancel()
	acct := moduleAccount(t)
	counter := t.TempDir()
	if err := os.Chmod(counter, 0o777); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(counter, "runs")
	build := m.pushExample(func(dir string) (string, error) {
		b := filepath.Join(dir, "flap")
		if err := os.MkdirAll(b, 0o755); err != nil {
			return "", err
		}
		// Runs 1 to 3: up for a second, then exit 1; run 4 on: up.
		cmd := `n=$(cat ` + c + ` 2>/dev/null || echo 0); echo $((n+1)) > ` + c + `; ` +
			`if [ "$n" -lt 3 ]; then sleep 1; exit 1; fi; trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done`
		spec, err := json.Marshal(map[string][]string{"command": {"/bin/sh", "-c", cmd}})
		if err != nil {
			return "", err
		}
		return b, os.WriteFile(filepath.Join(b, "meshfold.json"), spec, 0o644)
	})
	nd := m.newNode("f0")
	rt, _ := nd.processRuntime(process.Backoff{})
	nd.startAgent(rt)
	if _, err := m.want(ctx, nd.name, events.WantModule{Name: "app", Build: build, RunsAs: acct}); err != nil {
		t.Fatal(err)
	}
	// The fourth run is up: three crashes after running, reported.
	var st *reconcile.State
	var last time.Time
	for {
		st = reconcile.NewState(nd.name)
		err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), nd.name, 1, 0, func(msg store.Msg) error {
			st.Fold(msg.Event)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rs := reconcile.RuntimeOf(st)
		if i := slices.IndexFunc(rs, func(r reconcile.ModuleRuntime) bool { return r.Module == "app" }); i >= 0 &&
			rs[i].State == events.Running && len(rs[i].Crashes) == reconcile.FlapRestarts {
			last = rs[i].Crashes[len(rs[i].Crashes)-1]
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no have of app running after three crashes: %+v", reconcile.RuntimeOf(st))
		case <-time.After(100 * time.Millisecond):
		}
	}
	if r := audit.FleetRowOf(st, last.Add(time.Second), time.Hour); !slices.Contains(r.Attention, "flapping") {
		t.Errorf("a second after the last crash: attention %v, want flapping", r.Attention)
	}
	settled := last.Add(reconcile.FlapSettle)
	if r := audit.FleetRowOf(st, settled, time.Hour); slices.Contains(r.Attention, "flapping") {
		t.Errorf("%s after the last crash, no crash since: attention %v, want no flapping", reconcile.FlapSettle, r.Attention)
	}
	text := audit.StateText(st.View(), reconcile.CompositionOf(st), settled, "test")
	if !strings.Contains(strings.Join(strings.Fields(text), " "), "last seen flapping 1m ago") {
		t.Errorf("state does not say when it last flapped:\n%s", text)
	}
	// And the module does run: the fourth run, no restart since.
	s, err := waitStatus(ctx, rt, "app", func(s process.Status) bool { return s.State == events.Running })
	if err != nil || s.Restarts != reconcile.FlapRestarts {
		t.Errorf("app: %+v, %v; want running after %d restarts", s, err, reconcile.FlapRestarts)
	}
}
