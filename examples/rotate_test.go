package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// stubMeshfold is a stand-in for meshfold that the rotation script calls:
// `secret put NODE …` records the call and marks NODE put, printing
// "filled on NODE" ("not filled yet: …" when NODE.unfilled exists; when
// NODE.refuse exists it stores nothing and exits 2, as meshfold refusing
// an empty file); `state NODE -o json` prints NODE.after.json once NODE
// was put (when the test wrote one), NODE.json before.
const stubMeshfold = `#!/bin/sh
dir=$(dirname "$0")
case $1 in
secret)
	shift 2
	node=$1 file=
	while [ $# -gt 0 ]; do [ "$1" = -f ] && file=$2; shift; done
	if [ -e "$dir/$node.refuse" ]; then
		echo "meshfold: empty content: nothing to seal" >&2
		exit 2
	fi
	echo "put $node $(cat "$file")" >> "$dir/calls"
	touch "$dir/$node.put"
	echo "revision 7 digest 0000"
	if [ -e "$dir/$node.unfilled" ]; then
		echo "not filled yet: no provisioner of $node is up"
	else
		echo "filled on $node (digest 0000)"
	fi
	;;
state)
	if [ -e "$dir/$2.put" ] && [ -e "$dir/$2.after.json" ]; then cat "$dir/$2.after.json"; else cat "$dir/$2.json"; fi
	;;
esac
`

// The rotation recipe of docs/operations.md ("Rotating a secret across a
// fleet"): nodes are put one at a time, each only after the one before
// ran healthy for MIN_HEALTHY; a node whose module turns unhealthy or
// restarts stops the rotation, leaves the nodes after it untouched, and
// with --rollback the old content is put again to it and to those before.
func TestRotateSecretScript(t *testing.T) {
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("jq not installed")
	}
	script, err := filepath.Abs(filepath.Join("rotate-secret", "rotate-secret.sh"))
	if err != nil {
		t.Fatal(err)
	}
	const healthy = `{"view":{"runtime":[{"module":"app","build":"b","state":"running","restarts":2,"health":"healthy"}]}}`
	for _, c := range []struct {
		name  string
		after map[string]string // node → its state once put
		marks []string          // files NODE.refuse, NODE.unfilled: the stub's answers
		code  int
		calls string
		says  string
	}{
		{"all healthy", nil, nil, 0, "put a new\nput b new\nput c new\n", "rotated on a b c"},
		// A put refused at once stored nothing on b: b is not put back,
		// and the line says what happened (a fresh user's finding: it
		// said "not filled within 10s").
		{"b refused", nil, []string{"b.refuse"}, 1, "put a new\nput a old\n", "b: the put was refused (exit 2, see above): nothing was stored for b"},
		{"b not filled", nil, []string{"b.unfilled"}, 1, "put a new\nput b new\nput a old\nput b old\n", "b: the put was not filled within 10s"},
		{"b unhealthy", map[string]string{"b": `{"view":{"runtime":[{"module":"app","build":"b","state":"running","restarts":2,"health":"unhealthy"}]}}`},
			nil, 1, "put a new\nput b new\nput a old\nput b old\n", "b: app not healthy for 1s within 3s: health unhealthy"},
		{"b crashes", map[string]string{"b": `{"view":{"runtime":[{"module":"app","build":"b","state":"failed","restarts":3,"exit":"status 1"}]}}`},
			nil, 1, "put a new\nput b new\nput a old\nput b old\n", "b: app restarted (3 restarts, status 1)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, body string, mode os.FileMode) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), mode); err != nil {
					t.Fatal(err)
				}
			}
			write("meshfold", stubMeshfold, 0o755)
			write("new", "new", 0o600)
			write("old", "old", 0o600)
			for _, n := range []string{"a", "b", "c"} {
				write(n+".json", healthy, 0o600)
			}
			for _, m := range c.marks {
				write(m, "", 0o600)
			}
			for n, s := range c.after {
				write(n+".after.json", s, 0o600)
			}
			cmd := exec.Command(script, "-f", filepath.Join(dir, "new"), "--by", "alice", "--rollback", filepath.Join(dir, "old"), "app", "/run/app/token", "a", "b", "c")
			cmd.Env = append(os.Environ(), "MESHFOLD="+filepath.Join(dir, "meshfold"), "MIN_HEALTHY=1", "HEALTHY_DEADLINE=3", "INTERVAL=0.2")
			out, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			calls, _ := os.ReadFile(filepath.Join(dir, "calls"))
			if code != c.code || string(calls) != c.calls || !strings.Contains(string(out), c.says) {
				t.Errorf("exit %d (want %d), puts:\n%s(want:\n%s)output:\n%s(want %q)", code, c.code, calls, c.calls, out, c.says)
			}
		})
	}
}
