package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/process"
	"github.com/meshfold/meshfold/store"
)

// A real module whose exec check fails 4 s and passes 4 s, under its shim,
// for 40 s (a fresh user's finding M5: 30 haves in 100 s, one per
// transition): with the agent's default hold its haves report its fall
// once and no recovery, since no pass lasts the hold; with no hold (1 ns)
// they report every transition. The counts are logged: the figures of
// docs/operations.md's "Stream growth".
func TestFlappingCheckHaves(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a flapping check for 2 × 40 s: not in -short")
	}
	for _, c := range []struct {
		name string
		hold time.Duration
	}{{"no hold", time.Nanosecond}, {"default hold", 0}} {
		t.Run(c.name, func(t *testing.T) {
			m := newMesh(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			acct := moduleAccount(t)
			build := m.pushExample(func(dir string) (string, error) {
				b := filepath.Join(dir, "flapcheck")
				if err := os.MkdirAll(b, 0o755); err != nil {
					return "", err
				}
				spec, err := json.Marshal(map[string]any{
					"command": []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"},
					// Passes in the even 4 s spells of the clock, fails in the odd.
					"health": map[string]any{"exec": []string{"/bin/sh", "-c", `[ $(( $(date +%s) / 4 % 2 )) -eq 0 ]`},
						"interval": "500ms", "failures": 1},
				})
				if err != nil {
					return "", err
				}
				return b, os.WriteFile(filepath.Join(b, "meshfold.json"), spec, 0o644)
			})
			nd := m.newNode("c0")
			rt, _ := nd.processRuntime(process.Backoff{})
			nd.startAgentFaults(rt, node.Faults{}, func(cfg *node.Config) { cfg.HealthHold = c.hold })
			if _, err := m.want(ctx, nd.name, events.WantModule{Name: "app", Build: build, RunsAs: acct}); err != nil {
				t.Fatal(err)
			}
			if _, err := waitStatus(ctx, rt, "app", func(s process.Status) bool { return s.Health == events.Unhealthy }); err != nil {
				t.Fatalf("app never unhealthy: %v", err)
			}
			from := time.Now()
			const span = 40 * time.Second
			// The span is the measurement, not a synchronisation: the
			// check flaps on its own clock meanwhile.
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(span):
			}
			var haves, words int
			var last events.Health
			err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), nd.name, 1, 0, func(msg store.Msg) error {
				h, ok := msg.Event.Payload.(*events.Have)
				if !ok || msg.Event.Time.Before(from) || msg.Event.Time.After(from.Add(span)) {
					return nil
				}
				haves++
				for _, mod := range h.Modules {
					if mod.Name == "app" && mod.Health != last {
						words++
						last = mod.Health
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d haves in %s of a check failing 4 s, passing 4 s (%d changes of its word)", c.name, haves, span, words)
			if c.hold == 0 && haves > 2 {
				t.Errorf("with the default hold: %d haves in %s, want at most 2 (its fall; no pass lasts the hold)", haves, span)
			}
		})
	}
}
