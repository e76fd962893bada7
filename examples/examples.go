package examples

import (
	"embed"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed mesh-build-go idle
var files embed.FS

// MeshBuildGoCreds is the filled file mesh-build-go waits for.
const MeshBuildGoCreds = "/run/mesh-build-go/broker.creds"

// WriteMeshBuildGo writes the mesh-build-go bundle directory under dir
// (dir/mesh-build-go, its script executable) and returns its path, for
// `meshfold build push` or bundle.Pack.
//
// Errors: the file system's.
func WriteMeshBuildGo(dir string) (string, error) { return write(dir, "mesh-build-go") }

// WriteIdle writes the idle bundle directory under dir (dir/idle) and
// returns its path.
//
// Errors: the file system's.
func WriteIdle(dir string) (string, error) { return write(dir, "idle") }

func write(dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	err := fs.WalkDir(files, name, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := files.ReadFile(name)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if filepath.Base(filepath.Dir(target)) == "bin" {
			mode = 0o755
		}
		return os.WriteFile(target, data, mode)
	})
	return out, err
}
