package main

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The quickstart of docs/operations.md ("Install from a package") gives the
// node agent and the provisioner of ace, beside the packaged serve, the keys
// that serve writes: each unit's command line, expanded as systemd expands it
// from its EnvironmentFiles once the quickstart's own files are written,
// trusts serve's --data directory. (A fresh user's finding: the provisioner
// was told to trust /etc/meshfold/reconcilers.pub, which nothing installs or
// writes, and exited 2 every two seconds; no declared file was filled.)
func TestQuickstartTrustsServe(t *testing.T) {
	written := quickstartFiles(t)
	serve := execStart(t, "meshfold-serve.service", written)
	data := flagValue(serve, "--data")
	if data == "" {
		t.Fatalf("serve's command line names no --data: %q", serve)
	}
	for _, unit := range []string{"meshfold-node@.service", "meshfold-provision@.service"} {
		args := execStart(t, unit, written)
		trust, from := flagValue(args, "--trust"), flagValue(args, "--trust-from")
		switch {
		case trust != "" && from != "":
			t.Errorf("%s: both --trust %s and --trust-from %s (the agent refuses both)", unit, trust, from)
		case from != data:
			t.Errorf("%s after the quickstart: %q; want --trust-from %s, where serve writes its key", unit, strings.Join(args, " "), data)
		}
	}
}

// quickstartFiles returns the files the quickstart writes under /etc/meshfold
// (its `echo '…' > /etc/meshfold/FILE` lines), by path.
func quickstartFiles(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Install from a package\n")
	if !ok {
		t.Fatal(`docs/operations.md has no "### Install from a package"`)
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the install section has no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	echo := regexp.MustCompile(`^echo '([^']*)' > (/etc/meshfold/\S+)`)
	files := map[string]string{}
	for _, line := range strings.Split(block, "\n") {
		if m := echo.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			files[m[2]] = m[1] + "\n"
		}
	}
	if len(files) == 0 {
		t.Fatal("the quickstart writes no file under /etc/meshfold")
	}
	return files
}

// packaged maps what the package installs under /etc/meshfold to its source.
var packaged = map[string]string{
	"/etc/meshfold/serve.env":     "serve.env",
	"/etc/meshfold/node.env":      "node.env",
	"/etc/meshfold/provision.env": "provision.env",
	"/etc/meshfold/reconcile.env": "reconcile.env",
	"/etc/meshfold/console.env":   "console.env",
}

// execStart returns the ExecStart of unit (instance ace) expanded as systemd
// does: its EnvironmentFiles read in order (a later one's variable replaces an
// earlier one's; a missing file named with "-" skipped), each unbraced $VAR
// split into words. A file comes from written first, then the package.
func execStart(t *testing.T, unit string, written map[string]string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("files", unit))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	var cmd string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.ReplaceAll(line, "%i", "ace")
		if path, ok := strings.CutPrefix(line, "EnvironmentFile="); ok {
			optional := strings.HasPrefix(path, "-")
			path = strings.TrimPrefix(path, "-")
			content, ok := written[path]
			if !ok {
				if src, pkg := packaged[path]; pkg {
					c, err := os.ReadFile(filepath.Join("files", src))
					if err != nil {
						t.Fatal(err)
					}
					content, ok = string(c), true
				}
			}
			if !ok {
				if !optional {
					t.Fatalf("%s: EnvironmentFile %s is neither installed nor written by the quickstart", unit, path)
				}
				continue
			}
			sc := bufio.NewScanner(strings.NewReader(content))
			for sc.Scan() {
				l := strings.TrimSpace(sc.Text())
				if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
					env[k] = v
				}
			}
		}
		if c, ok := strings.CutPrefix(line, "ExecStart="); ok {
			cmd = c
		}
	}
	if cmd == "" {
		t.Fatalf("%s has no ExecStart", unit)
	}
	var args []string
	for _, w := range strings.Fields(cmd) {
		if name, ok := strings.CutPrefix(w, "$"); ok && !strings.HasPrefix(name, "{") {
			args = append(args, strings.Fields(env[name])...)
			continue
		}
		args = append(args, w)
	}
	return args
}

// flagValue returns the value of --name VALUE or --name=VALUE in args, or "".
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}
