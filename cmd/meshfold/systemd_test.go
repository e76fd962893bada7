package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The unit file docs/operations.md shows passes `systemd-analyze verify`
// (skipped where systemd-analyze is missing). Its binary path is pointed
// at this test's own executable, which exists: verify checks that
// ExecStart names an executable file.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "meshfold-node.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	for _, want := range []string{"ExecStart=/usr/local/bin/meshfold node ${NODE} ", "KillMode=process", "--runtime process"} {
		if !strings.Contains(unit, want) {
			t.Fatalf("the unit lacks %q", want)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit = strings.ReplaceAll(unit, "/usr/local/bin/meshfold", self)
	unit = strings.ReplaceAll(unit, "EnvironmentFile=/etc/meshfold/node.env", "EnvironmentFile=-/etc/meshfold/node.env")
	path := filepath.Join(t.TempDir(), "meshfold-node.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
