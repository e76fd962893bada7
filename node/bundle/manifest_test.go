package bundle_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/node/bundle"
)

func TestParseManifest(t *testing.T) {
	for _, tc := range []struct {
		name, in, field string
	}{
		{"ok", `{"command":["bin/run","-x"],"env":{"A":"b"},"stop_signal":"SIGINT","stop_timeout":"3s","on_fill":"signal:HUP"}`, ""},
		{"unknown field", `{"command":["x"],"comand":["y"]}`, bundle.ManifestName},
		{"empty command", `{"command":[]}`, "command"},
		{"missing command", `{}`, "command"},
		{"bad signal", `{"command":["x"],"stop_signal":"SIGFOO"}`, "stop_signal"},
		{"bad timeout", `{"command":["x"],"stop_timeout":"soon"}`, "stop_timeout"},
		{"bad on_fill", `{"command":["x"],"on_fill":"reload"}`, "on_fill"},
		{"bad on_fill signal", `{"command":["x"],"on_fill":"signal:NOPE"}`, "on_fill"},
		{"escaping command", `{"command":["../x"]}`, "command[0]"},
		{"reserved env", `{"command":["x"],"env":{"MESHFOLD_ROOT":"/"}}`, "env.MESHFOLD_ROOT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bundle.ParseManifest([]byte(tc.in))
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var me *bundle.ManifestError
			if !errors.As(err, &me) || me.Field != tc.field || !errors.Is(err, bundle.ErrInvalidManifest) {
				t.Fatalf("err = %v, want a ManifestError on %s", err, tc.field)
			}
		})
	}
}

func TestManifestDefaults(t *testing.T) {
	m, err := bundle.ParseManifest([]byte(`{"command":["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Signal() != syscall.SIGTERM || m.Timeout() != 10*time.Second {
		t.Fatalf("defaults: %v %v", m.Signal(), m.Timeout())
	}
	if r, s := m.FillAction(); r || s != 0 {
		t.Fatalf("default on_fill: %v %v", r, s)
	}
	m.OnFill = "signal:SIGUSR1"
	if _, s := m.FillAction(); s != syscall.SIGUSR1 {
		t.Fatalf("on_fill signal: %v", s)
	}
}
