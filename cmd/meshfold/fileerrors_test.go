package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A fleet file or want file that does not parse is named with the line
// and column of the fault, file:LINE:COLUMN:, and what was expected, exit
// 2, before any connection (a fresh user's finding: "line 9: error: file:
// yaml: line 9: …", one line short and no column; a want file's errors
// named no line).
func TestFileErrorsNameLineAndColumn(t *testing.T) {
	// Not parallel: t.Setenv.
	t.Setenv("NATS_URL", "nats://127.0.0.1:"+freePort(t)) // never dialled
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx := testCtx(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"apply", "--dry-run", "-f", write("unclosed.yaml", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: base\n    modules:\n      - name: web\n        runs_as: [web\nrollout:\n  batch: 1\n")},
			[]string{"unclosed.yaml:7:19: error: file: not YAML: did not find expected ',' or ']' (a '[' list not closed by ']'"}},
		{[]string{"apply", "--dry-run", "-f", write("indent.yaml", "fleet: web\nnodes:\n  ace:\n    role: web\n   bad: x\n")},
			[]string{"indent.yaml:5:4: error: file: not YAML: did not find expected key"}},
		{[]string{"apply", "--dry-run", "-f", write("fields.yaml", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: base\n    modules:\n      - {name: web, build: b1, files: /etc/x}\nrollout:\n  batch: two\n")},
			[]string{"fields.yaml:6:39: error: groups[0].modules[0].files: wrong shape: want a list\n", "fields.yaml:8:10: error: rollout.batch: \"two\""}},
		{[]string{"want", "ace", "-f", write("type.json", "{\"modules\":[{\"name\":\"app\",\"build\":\"img:1\",\n \"runs_as\": 5}]}")},
			[]string{"type.json:2:13: malformed payload: want: json: cannot unmarshal number"}},
		{[]string{"want", "ace", "-f", write("syntax.json", "{\"modules\":[{\"name\":\"app\",\n  \"build\":\"img:1\" \"runs_as\":\"x\"}]}")},
			[]string{"syntax.json:2:19: not a JSON object: invalid character"}},
		{[]string{"want", "ace", "-f", write("want.yaml", "modules:\n  - name: app\n")},
			[]string{"want.yaml:1:1: not a JSON object", "want -f takes JSON"}},
	} {
		code, _, errs := runCLI(ctx, c.args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d:\n%s", c.args, code, exitUsage, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%v: stderr lacks %q:\n%s", c.args, w, errs)
			}
		}
	}
}
