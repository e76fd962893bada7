package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/meshfold/meshfold/events"
)

// -o yaml is the JSON of the same struct: the same field names in the same
// order, values that stay strings (a mode, a YAML 1.1 boolean word) quoted.
func TestYAMLIsTheJSON(t *testing.T) {
	t.Parallel()
	v := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "yes", Build: "on", RunsAs: "no",
		Files: []events.File{{Path: "/etc/a", Mode: "0600"}}, RequiresApproval: true}}}, time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC))
	b, err := toYAML(v)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{"v: 1\n", "modules:\n  - name: \"yes\"\n", "    build: \"on\"\n", "    runs_as: \"no\"\n",
		"mode: \"0600\"", "requires_approval: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("yaml lacks %q:\n%s", want, out)
		}
	}
	// Read back, it is the JSON's value.
	var fromYAML, fromJSON any
	if err := yaml.Unmarshal(b, &fromYAML); err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(v)
	if err := json.Unmarshal(j, &fromJSON); err != nil {
		t.Fatal(err)
	}
	y2, _ := json.Marshal(fromYAML)
	j2, _ := json.Marshal(fromJSON)
	if string(y2) != string(j2) {
		t.Errorf("yaml reads back as\n%s\nthe json is\n%s", y2, j2)
	}
}
