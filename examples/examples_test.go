package examples_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/examples"
	"github.com/meshfold/meshfold/node/bundle"
)

// The written bundle packs to the same build as the directory in the
// repository (what the README pushes), and its script behaves as
// incident 1 needs: exit 1 with "missing broker credential" without the
// file.
func TestMeshBuildGo(t *testing.T) {
	dir, err := examples.WriteMeshBuildGo(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	pa, err := bundle.Pack(dir, &a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := bundle.Pack("mesh-build-go", &b)
	if err != nil {
		t.Fatal(err)
	}
	if pa.Build != pb.Build {
		t.Fatalf("written bundle %s, repository's %s", pa.Build, pb.Build)
	}
	idle, err := examples.WriteIdle(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Pack(idle, &a); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cmd := exec.Command(filepath.Join(dir, "bin", "run"))
	cmd.Env = append(os.Environ(), "MESHFOLD_ROOT="+root, "MESHFOLD_NODE=ace", "BROKER_CREDS="+examples.MeshBuildGoCreds)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "missing broker credential") {
		t.Fatalf("without the file: %v, %s", err, out)
	}
}
