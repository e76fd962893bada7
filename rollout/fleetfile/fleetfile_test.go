package fleetfile_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/fleetfile"
)

const good = `fleet: web                       # a subject token
nodes:
  ace: {site: eu, role: build}
  bob: {site: us}
  cat: {site: eu}
groups:
  - name: base
    select: {}
    modules:
      - {name: provisioner, build: "sha256:1", runs_as: prov, provisioner: true}
  - name: build
    select: {role: build}
    modules:
      - {name: mesh-build-go, build: "sha256:2", runs_as: mbg,
         files: [{path: /run/mesh-build-go/broker.creds, mode: 0600}]}
rollout: {batch: 2, max_unavailable: "25%", canary: 1, min_healthy: 10s,
          healthy_deadline: 5m, auto_revert: true}
`

func TestParse(t *testing.T) {
	f, warns, err := fleetfile.Parse([]byte(good))
	if err != nil || len(warns) > 0 {
		t.Fatalf("Parse: %v %v", err, warns)
	}
	if f.Name != "web" || len(f.Nodes) != 3 || len(f.Groups) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	want := rollout.Params{Batch: rollout.Amount{N: 2}, MaxUnavailable: rollout.Amount{N: 25, Percent: true},
		Canary: rollout.Amount{N: 1}, MinHealthy: rollout.Duration(10e9).Ptr(), HealthyDeadline: rollout.Duration(300e9), AutoRevert: true}
	if got := f.Rollout; *got.MinHealthy != *want.MinHealthy || got.Resolve(3, 3) != want.Resolve(3, 3) {
		t.Fatalf("rollout block %+v, want %+v", f.Rollout, want)
	}
	ace, _ := f.Want("ace")
	if got := names(ace); got != "mesh-build-go:sha256:2,provisioner:sha256:1" {
		t.Fatalf("ace wants %s", got)
	}
	if ace[0].Files[0].Mode != "0600" {
		t.Fatalf("mode read as %q", ace[0].Files[0].Mode)
	}
	bob, _ := f.Want("bob")
	if got := names(bob); got != "provisioner:sha256:1" {
		t.Fatalf("bob wants %s", got)
	}
	if _, ok := f.Want("zed"); ok {
		t.Fatal("zed is not owned")
	}
	// A pure function of the file: the same bytes, the same wants.
	again, _, _ := fleetfile.Parse([]byte(good))
	for _, n := range f.Nodes {
		a, _ := f.Want(n.Name)
		b, _ := again.Want(n.Name)
		if !rollout.EqualWant(a, b) {
			t.Fatalf("%s: two parses, two wants", n.Name)
		}
	}
}

func TestParseJSON(t *testing.T) {
	f, _, err := fleetfile.Parse([]byte(`{"fleet":"web","nodes":{"ace":{}},"groups":[{"name":"all","select":{},"modules":[{"name":"web","build":"b1"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := f.Want("ace"); names(w) != "web:b1" {
		t.Fatalf("ace wants %s", names(w))
	}
}

func names(ms []events.WantModule) string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name+":"+m.Build)
	}
	return strings.Join(out, ",")
}

// TestErrors: every error names its line and field.
func TestErrors(t *testing.T) {
	many := new(strings.Builder)
	for i := range events.MaxModules + 1 {
		fmt.Fprintf(many, "      - {name: m%d, build: b}\n", i)
	}
	for _, c := range []struct {
		name, file string
		is         error
		want       string
	}{
		{"two groups", "fleet: web\nnodes:\n  ace: {role: db}\ngroups:\n  - name: base\n    select: {}\n    modules:\n      - {name: web, build: b1}\n  - name: db\n    select: {role: db}\n    modules:\n      - {name: web, build: b2}\n",
			fleetfile.ErrTwoGroups, "12:9: error: groups[1].modules[0].name: module in two of the node's groups: web is in groups base and db of node ace"},
		{"unknown field", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: base\n    modules:\n      - {name: web, biuld: b1}\n",
			fleetfile.ErrUnknownField, "6:21: error: groups[0].modules[0].biuld: unknown field"},
		{"unknown top field", "fleet: web\nnodes: {ace: {}}\ngroups: []\nrolout: {batch: 2}\n",
			fleetfile.ErrUnknownField, "4:1: error: rolout: unknown field"},
		{"bad path", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: base\n    modules:\n      - name: web\n        build: b1\n        files: [{path: relative, mode: \"0600\"}]\n",
			events.ErrBadPath, `6:9: error: groups[0].modules[0].files[0].path: "relative": must be absolute`},
		{"over the limits", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: base\n    modules:\n" + many.String(),
			events.ErrTooMany, "5:5: error: groups[0].modules: too many: 33, the limit is 32 (events.MaxModules)"},
		{"union over the limits", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: a\n    modules:\n      - {name: p, build: b, provisioner: true}\n  - name: b\n    modules:\n      - {name: q, build: b, provisioner: true}\n",
			events.ErrProvisioners, "2:9: error: nodes.ace: its want (the union of its groups): modules[1].provisioner"},
		{"bad amount", "fleet: web\nnodes: {ace: {}}\ngroups: []\nrollout:\n  batch: 0\n",
			rollout.ErrBadAmount, "5:10: error: rollout.batch: batch 0"},
		{"bad duration", "fleet: web\nnodes: {ace: {}}\ngroups: []\nrollout:\n  min_healthy: soon\n",
			rollout.ErrBadDuration, `5:16: error: rollout.min_healthy: "soon"`},
		// A fresh user's finding U30: every target failed, and reverted,
		// at its deadline by construction.
		{"min_healthy not below healthy_deadline", "fleet: web\nnodes: {ace: {}}\ngroups: []\nrollout: {min_healthy: 40s, healthy_deadline: 20s}\n",
			rollout.ErrNoTimeToBeDone, "4:24: error: rollout.min_healthy: min_healthy 40s is not below healthy_deadline 20s: no target can be done in time"},
		{"min_healthy not below the default deadline", "fleet: web\nnodes: {ace: {}}\ngroups: []\nrollout:\n  min_healthy: 5m\n",
			rollout.ErrNoTimeToBeDone, "5:16: error: rollout.min_healthy: min_healthy 5m0s is not below the default healthy_deadline 5m0s: no target can be done in time"},
		{"healthy_deadline not above the default min_healthy", "fleet: web\nnodes: {ace: {}}\ngroups: []\nrollout:\n  healthy_deadline: 10s\n",
			rollout.ErrNoTimeToBeDone, "5:21: error: rollout.healthy_deadline: the default min_healthy 10s is not below healthy_deadline 10s: no target can be done in time"},
		{"missing fleet", "nodes: {ace: {}}\ngroups: []\n", fleetfile.ErrMissing, "1:1: error: fleet: required"},
		{"bad node", "fleet: web\nnodes: {Ace: {}}\ngroups: []\n", events.ErrBadName, "2:9: error: nodes.Ace"},
		// The Kubernetes habit (a fresh user's finding U14: "wrong
		// shape: want a value").
		{"labels key", "fleet: web\nnodes: {bob: {labels: {role: web}}}\ngroups: []\n", fleetfile.ErrShape,
			"2:23: error: nodes.bob.labels: wrong shape: a node's labels are its value: `bob: {role: web}` (label values are strings; `labels:` is not a key)"},
		{"label not a string", "fleet: web\nnodes:\n  bob:\n    role: [web, db]\n", fleetfile.ErrShape,
			"4:11: error: nodes.bob.role: wrong shape: want a value: a node's labels are its value, each a string: `bob: {role: web}`"},
		// A syntax error names where it begins, line and column (yaml.v3
		// says "line N" one short, no column), and what was expected (a
		// fresh user's finding: "line 9: error: file: yaml: line 9: …").
		{"not yaml", "fleet: [\n", fleetfile.ErrSyntax, "1:8: error: file: not YAML: did not find expected node content"},
		{"unclosed list", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: base\n    modules:\n      - name: web\n        runs_as: [web\nrollout:\n  batch: 1\n",
			fleetfile.ErrSyntax, "7:19: error: file: not YAML: did not find expected ',' or ']' (a '[' list not closed by ']', or two items without a ',' between them)"},
		{"unclosed mapping", "fleet: web\nnodes:\n  ace: {role: web\n", fleetfile.ErrSyntax, "3:9: error: file: not YAML: did not find expected ',' or '}'"},
		{"bad indentation", "fleet: web\nnodes:\n  ace:\n    role: web\n   bad: x\n", fleetfile.ErrSyntax,
			"5:4: error: file: not YAML: did not find expected key (a line indented where a key of the mapping above it was expected: check its indentation)"},
		{"tab", "fleet: web\nrollout:\n  batch: 1\n\tcanary: 1\n", fleetfile.ErrSyntax, "4:1: error: file: not YAML: found a tab character that violates indentation (indent with spaces, never tabs)"},
		{"unclosed quote", "fleet: \"web\nnodes: {}\n", fleetfile.ErrSyntax, "1:8: error: file: not YAML: found unexpected end of stream"},
		{"duplicate key", "fleet: web\nnodes:\n  ace: {}\n  ace: {role: db}\ngroups: []\n", fleetfile.ErrDuplicateKey, "4:3: error: nodes.ace: key appears twice (the last would silently win): write it once (first at 3:3)"},
		{"duplicate top key", "fleet: web\nfleet: api\nnodes: {ace: {}}\ngroups: []\n", fleetfile.ErrDuplicateKey, "2:1: error: fleet: key appears twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := fleetfile.Parse([]byte(c.file))
			if err == nil {
				t.Fatal("no error")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error\n%v\nlacks\n%s", err, c.want)
			}
		})
	}
}

// TestSelectorMatchingNothing: a group that selects no owned node is an
// error, at its select, saying what it would do and what the nodes'
// labels are (a fresh user's finding U13: a typo, `role: wbe`, rolled
// out the module's removal to every node behind a warning); with
// AllowEmptyGroup it is the warning it was.
func TestSelectorMatchingNothing(t *testing.T) {
	_, _, err := fleetfile.Parse([]byte("fleet: web\nnodes: {ace: {role: web}, bob: {role: db}}\ngroups:\n  - name: g\n    select: {role: wbe}\n    modules: [{name: web, build: b2}]\n"))
	var errs fleetfile.Errors
	if !errors.As(err, &errs) || len(errs) != 1 || !errors.Is(err, fleetfile.ErrMatchesNone) || errs[0].Warning {
		t.Fatalf("a group selecting no node: %v", err)
	}
	want := "5:5: error: groups[0].select: selects no owned node: its modules (web) are in no node's want, so the rollout removes them from every node that runs them; " +
		"no owned node has role: wbe (they have role: db, web): fix the selector or the nodes' labels, or, if the group is meant to select nothing yet, apply with --allow-empty-group"
	if got := errs[0].Error(); got != want {
		t.Fatalf("error\n%s\nwant\n%s", got, want)
	}
	_, _, err = fleetfile.Parse([]byte("fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: gpu\n    select: {gpu: \"yes\"}\n    modules: [{name: cuda, build: c1}]\n"))
	if err == nil || !strings.Contains(err.Error(), "no owned node has a label gpu") {
		t.Fatalf("a label no node has: %v", err)
	}
	_, warns, err := fleetfile.ParseWith([]byte("fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: gpu\n    select: {gpu: \"yes\"}\n    modules: [{name: cuda, build: c1}]\n"),
		fleetfile.Options{AllowEmptyGroup: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 1 || !errors.Is(warns[0], fleetfile.ErrMatchesNone) || warns[0].Line != 5 || warns[0].Column != 5 {
		t.Fatalf("warnings %v", warns)
	}
	if got := warns[0].Error(); got != "5:5: warning: groups[0].select: selects no owned node" {
		t.Fatalf("warning %q", got)
	}
}

// TestNewStart: the targets are the nodes whose want changes; distinct
// wants are carried once; nodes past a page go to pages.
func TestNewStart(t *testing.T) {
	f, _, err := fleetfile.Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	var cands []rollout.Candidate
	for i, n := range f.Nodes {
		w, _ := f.Want(n.Name)
		c := rollout.Candidate{Node: n.Name, Want: w, Prev: uint64(i + 1)}
		if n.Name == "cat" {
			c.Current = w // unchanged
		}
		cands = append(cands, c)
	}
	start, pages := rollout.NewStart("alice", "", f.Rollout, cands)
	if len(pages) != 0 || start.Pages != 1 || len(start.Wants) != 2 || len(start.Nodes) != 3 {
		t.Fatalf("start %+v pages %d", start, len(pages))
	}
	if start.Nodes[2].Want != 0 || start.Nodes[0].Want != 1 || start.Nodes[1].Want != 2 {
		t.Fatalf("nodes %+v", start.Nodes)
	}
	if err := rollout.Stamp(start, testTime).Validate(); err != nil {
		t.Fatal(err)
	}
	big := make([]rollout.Candidate, rollout.MaxNodesPerEvent*2+5)
	for i := range big {
		big[i] = rollout.Candidate{Node: fmt.Sprintf("n%d", i), Want: []events.WantModule{{Name: "web", Build: "b2"}}}
	}
	start, pages = rollout.NewStart("alice", "", rollout.Params{}, big)
	if start.Pages != 3 || len(pages) != 2 || len(pages[1]) != 5 || len(start.Wants) != 1 {
		t.Fatalf("pages %d/%d", start.Pages, len(pages))
	}
}

var testTime = mustTime("2026-12-01T20:00:00Z")

// A fleet file of deeply nested brackets on one line is refused with
// yaml's depth error, placed, at the cost of a few parses: the column
// was found by parsing the line's prefix at every byte (a fresh user's
// 40 KB file of 20,000 nested '[': over 10 minutes at 11 % of a CPU,
// never answered). Measured in bytes allocated, not time: not parallel,
// so the package's other tests allocate nothing meanwhile.
func TestDeepNestingRefusedCheaply(t *testing.T) {
	const depth = 20000
	data := []byte("x: " + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "\n")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := fleetfile.Parse(data)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "exceeded max depth") || !strings.Contains(err.Error(), "1:") {
		t.Fatalf("Parse of %d nested brackets: %v; want yaml's depth error, with its line", depth, err)
	}
	const most = 512 << 20
	if got := after.TotalAlloc - before.TotalAlloc; got > most {
		t.Errorf("Parse of %d nested brackets allocated %d MB, want at most %d MB", depth, got>>20, most>>20)
	} else {
		t.Logf("allocated %d MB: %v", got>>20, err)
	}
}
