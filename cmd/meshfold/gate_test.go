package main

import (
	"context"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// approve --all approves on the nodes whose newest want names the module
// only, and says how many it skipped (a fresh user's finding M4: an
// approval on every node with a want let a later placement there run the
// module with no approval anyone looked at); --all --ahead still
// approves everywhere, deliberately.
func TestApproveAllSkipsNodesNotWantingTheModule(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	const other = `{"modules": [{"name": "web", "build": "w:1"}]}`
	for n, w := range map[string]string{"ace": goodWant, "bob": goodWant, "cat": other} {
		if code, _, stderr := c.run(t, "", "want", n, "--new", "-f", writeWantFile(t, w)); code != 0 {
			t.Fatalf("want %s: %s", n, stderr)
		}
	}
	code, stdout, stderr := c.run(t, "", "approve", "--all", "mesh-build-go", "g:2", "--by", "alice")
	if code != 0 || strings.Count(stdout, ": stream sequence ") != 2 || strings.Contains(stdout, "approve cat") {
		t.Fatalf("approve --all: exit %d, stdout %q, stderr %q; want ace and bob approved only", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "it skipped 1 node whose want does not (cat)") || !strings.Contains(stderr, "--ahead") {
		t.Errorf("approve --all does not say what it skipped and how to approve ahead:\n%s", stderr)
	}
	if _, ok := c.last(t, "cat", events.KindApprove); ok {
		t.Error("cat got an approval of a module its want does not name")
	}
	if code, stdout, stderr := c.run(t, "", "approve", "--all", "mesh-build-go", "g:3", "--by", "alice", "--ahead"); code != 0 || strings.Count(stdout, ": stream sequence ") != 3 {
		t.Fatalf("approve --all --ahead: exit %d, %q %q; want all three approved", code, stdout, stderr)
	}
}

// retire takes many nodes, as pause and poke do (a fresh user's finding
// m2: "accepts 1 arg(s), received 50"); one node refused refuses them all.
func TestRetireMany(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, n := range []string{"ace", "bob", "cat"} {
		if code, _, stderr := c.run(t, "", "want", n, "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
			t.Fatalf("want %s: %s", n, stderr)
		}
	}
	info, err := c.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.Msgs
	if code, stdout, stderr := c.run(t, "", "retire", "ace", "bob", "dog", "--by", "alice", "--force"); code != exitUsage || stdout != "" || !strings.Contains(stderr, "node dog") {
		t.Fatalf("retire with an unknown node: exit %d, %q %q; want exit 2 naming dog, nothing published", code, stdout, stderr)
	}
	if info, _ := c.stream.Info(context.Background()); info.State.Msgs != before {
		t.Fatalf("%d events published by a refused retire", info.State.Msgs-before)
	}
	code, stdout, stderr := c.run(t, "", "retire", "ace", "bob", "--by", "alice", "--force")
	if code != 0 || !strings.Contains(stdout, "retire ace: stream sequence") || !strings.Contains(stdout, "retire bob: stream sequence") {
		t.Fatalf("retire ace bob: exit %d, %q %q", code, stdout, stderr)
	}
	if _, ok := c.last(t, "cat", events.KindRetire); ok {
		t.Error("cat was retired")
	}
}
