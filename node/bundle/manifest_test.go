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
		{"limits", `{"command":["x"],"limits":{"memory":67108864,"cpu":0.5,"pids":64}}`, ""},
		{"tiny memory", `{"command":["x"],"limits":{"memory":4096}}`, "limits.memory"},
		{"negative cpu", `{"command":["x"],"limits":{"cpu":-1}}`, "limits.cpu"},
		{"one pid", `{"command":["x"],"limits":{"pids":1}}`, "limits.pids"},
		{"memory as text", `{"command":["x"],"limits":{"memory":"64M"}}`, bundle.ManifestName},
		{"unknown limit", `{"command":["x"],"limits":{"disk":1}}`, bundle.ManifestName},
		{"exec check", `{"command":["x"],"health":{"exec":["check.sh","-q"],"interval":"2s","timeout":"1s","grace":"30s","failures":5,"restart":true}}`, ""},
		{"http check", `{"command":["x"],"health":{"http":"http://127.0.0.1:8080/healthz"}}`, ""},
		{"tcp check", `{"command":["x"],"health":{"tcp":"127.0.0.1:8080"}}`, ""},
		{"notify check", `{"command":["x"],"health":{"notify":true,"interval":"5s"}}`, ""},
		{"no check kind", `{"command":["x"],"health":{"interval":"5s"}}`, "health"},
		{"two check kinds", `{"command":["x"],"health":{"tcp":"a:1","notify":true}}`, "health"},
		{"ftp check", `{"command":["x"],"health":{"http":"ftp://h/x"}}`, "health.http"},
		{"tcp without port", `{"command":["x"],"health":{"tcp":"localhost"}}`, "health.tcp"},
		{"escaping check", `{"command":["x"],"health":{"exec":["../c"]}}`, "health.exec[0]"},
		{"bad interval", `{"command":["x"],"health":{"tcp":"a:1","interval":"1ms"}}`, "health.interval"},
		{"bad grace", `{"command":["x"],"health":{"tcp":"a:1","grace":"-1s"}}`, "health.grace"},
		{"bad failures", `{"command":["x"],"health":{"tcp":"a:1","failures":-2}}`, "health.failures"},
		{"unknown check field", `{"command":["x"],"health":{"tcp":"a:1","retries":2}}`, bundle.ManifestName},
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
	h := bundle.Health{TCP: "a:1"}
	if i, to, g := h.Durations(); i != bundle.DefaultHealthInterval || to != bundle.DefaultHealthTimeout || g != 0 || h.FailuresOrDefault() != 3 {
		t.Fatalf("health defaults: %v %v %v %d", i, to, g, h.FailuresOrDefault())
	}
	if i, _, _ := (bundle.Health{Notify: true}).Durations(); i != 0 {
		t.Fatalf("a notify check without interval has a watchdog of %v", i)
	}
	m.OnFill = "signal:SIGUSR1"
	if _, s := m.FillAction(); s != syscall.SIGUSR1 {
		t.Fatalf("on_fill signal: %v", s)
	}
}
