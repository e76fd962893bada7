package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The docs say where to get nats-server for a deployment of one's own, and
// name the version go.mod builds and the tests run (a fresh user's
// finding: no doc said where to get it). When go.mod moves to another
// nats-server, this fails until the docs name the new one: the install
// command, the version it prints, the container image, and the compose
// file's image of the same minor version.
func TestDocsNameTheNatsServerGoModNames(t *testing.T) {
	t.Parallel()
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\d+)\.(\d+)\.(\d+)\s*$`).FindStringSubmatch(string(mod))
	if m == nil {
		t.Fatal("go.mod requires no github.com/nats-io/nats-server/v2")
	}
	version, minor := m[1]+"."+m[2]+"."+m[3], m[1]+"."+m[2]
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ops, readme, compose := read("../../docs/operations.md"), read("../../README.md"), read("../../deploy/compose.yaml")
	for _, want := range []string{
		"### Getting nats-server",
		"go install github.com/nats-io/nats-server/v2@v" + version + "\n",
		"go build -o bin/nats-server github.com/nats-io/nats-server/v2\n",
		"→ nats-server: v" + version + "\n",
		"`nats:" + version + "`",
	} {
		if !strings.Contains(ops, want) {
			t.Errorf("docs/operations.md does not say %q (go.mod: nats-server v%s)", want, version)
		}
	}
	if !strings.Contains(readme, "(docs/operations.md#getting-nats-server)") {
		t.Error("README.md does not point to operations.md's Getting nats-server")
	}
	if !strings.Contains(compose, "image: nats:"+minor+"\n") {
		t.Errorf("deploy/compose.yaml's servers are not nats:%s (go.mod: nats-server v%s)", minor, version)
	}
}
