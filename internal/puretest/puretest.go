package puretest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const mod = "github.com/meshfold/meshfold/"

var forbiddenImports = map[string]bool{
	"os": true, "io/fs": true, "io/ioutil": true, "net": true, "net/http": true,
	"syscall": true, "os/exec": true, "log": true, "log/slog": true, "sync": true,
	"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "unsafe": true,
}

var clock = map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true,
	"After": true, "AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}

// Check fails t for each way the package in dir (relative to the test's
// directory) is not pure. core names the one meshfold tree besides events
// it may import ("reconcile", "rollout"). Only its non-test files are read.
func Check(t *testing.T, dir, core string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "nats-io") || strings.Contains(dep, "synadia-io") {
			t.Errorf("%s depends on %s", dir, dep)
		}
		if strings.HasPrefix(dep, mod) && !strings.HasPrefix(dep, mod+"events") && !strings.HasPrefix(dep, mod+core) {
			t.Errorf("%s depends on %s: only events and %s are allowed", dir, dep, core)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); forbiddenImports[p] {
				t.Errorf("%s imports %s", name, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: starts a goroutine", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && clock[n.Sel.Name] {
					t.Errorf("%s: reads the clock (time.%s)", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
