package audit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPure holds reconcile/audit and its test-support package
// reconcile/audit/audittest to reconcile's rule (DESIGN.md §5.6):
// no NATS (directly or through a dependency), no clock, no I/O, no
// goroutine. reconcile's own TestPure checks only its root package.
func TestPure(t *testing.T) {
	for _, dir := range []string{".", "./audittest"} {
		t.Run(dir, func(t *testing.T) { checkPure(t, dir) })
	}
}

func checkPure(t *testing.T, dir string) {
	out, err := exec.Command("go", "list", "-deps", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "nats-io") || strings.Contains(dep, "synadia-io") {
			t.Errorf("%s depends on %s", dir, dep)
		}
		if strings.HasPrefix(dep, "github.com/meshfold/meshfold/") && !strings.HasPrefix(dep, "github.com/meshfold/meshfold/events") &&
			!strings.HasPrefix(dep, "github.com/meshfold/meshfold/reconcile") {
			t.Errorf("%s depends on %s: only events and reconcile are allowed", dir, dep)
		}
	}
	forbiddenImports := map[string]bool{
		"os": true, "io/fs": true, "io/ioutil": true, "net": true, "net/http": true,
		"syscall": true, "os/exec": true, "log": true, "log/slog": true, "sync": true,
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "unsafe": true,
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true,
		"After": true, "AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}
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
