package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/store"
)

// A creds file (or TLS file) that is missing or malformed is the command
// line's fault: every command that takes --creds exits 2 (usage), at once,
// naming the file, as the exit-code table says of "a file that does not
// parse" (a fresh user's finding: --creds /nonexistent exited 1, as an
// unreachable server does).
func TestBadCredsIsUsage(t *testing.T) {
	// Not parallel: t.Setenv.
	for _, e := range []string{"NATS_URL", "NATS_CREDS", "NATS_NKEY", "NATS_CONTEXT", "NATS_CA", "NATS_CERT", "NATS_KEY"} {
		t.Setenv(e, "")
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := write("want.json", `{"modules":[]}`)
	fleet := write("fleet.yaml", "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: all\n    modules: [{name: web, build: \"img:1\"}]\n")
	secret := write("secret", "s")
	bundle := write("run", "#!/bin/sh\n")
	if err := os.Chmod(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	trust := write("trusted.pub", pub+"\n")
	authDir := filepath.Join(dir, "auth")
	if code, _, errs := runCLI(testCtx(t), "auth", "init", "--dir", authDir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	// args of each command that takes --creds: enough for it to reach its
	// connect (every other check passes).
	args := map[string][]string{
		"ack":               {"ace", "--by", "a"},
		"apply":             {"-f", fleet, "--by", "a"},
		"approve":           {"ace", "nats", "img:1", "--by", "a"},
		"audit":             {"ace"},
		"auth revoke":       {"operator", "--dir", authDir},
		"auth add-operator": {"alice", "--dir", authDir},
		"auth enable-named": {"--dir", authDir},
		"build ls":          nil,
		"build push":        {bundle},
		"build rm":          {"sha256:" + strings.Repeat("0", 64)},
		"console":           {"--listen", "127.0.0.1:0"},
		"fleet":             nil,
		"logs":              {"ace", "web"},
		"node":              {"ace", "--root", filepath.Join(dir, "root"), "--state-dir", filepath.Join(dir, "state"), "--trust", trust},
		"pause":             {"ace", "--by", "a"},
		"poke":              {"ace", "--by", "a"},
		"provision":         {"ace", "--from", dir, "--account", "prov", "--trust", trust},
		"reconcile":         {"--signing-key", filepath.Join(t.TempDir(), "signing.nk")},
		"resume":            {"ace", "--by", "a"},
		"retire":            {"ace", "--by", "a"},
		"gate":              {"ace", "db", "--by", "a"},
		"ungate":            {"ace", "db", "--by", "a"},
		"revoke":            {"ace", "nats", "img:1", "--by", "a"},
		"rollout abort":     {"web", "--by", "a"},
		"rollout ls":        nil,
		"rollout pause":     {"web", "--by", "a"},
		"rollout promote":   {"web", "--by", "a"},
		"rollout resume":    {"web", "--by", "a"},
		"rollout revert":    {"web", "--by", "a"},
		"rollout status":    {"web"},
		"rollout why":       {"web", "ace"},
		"secret ls":         nil,
		"secret put":        {"ace", "web", "/run/web/token", "-f", secret, "--by", "a"},
		"secret rm":         {"ace", "web", "/run/web/token", "--by", "a"},
		"state":             {"ace"},
		"waive":             {"ace", "web", "/run/web/token", "--by", "a"},
		"want":              {"ace", "-f", want},
	}
	// Every command with --creds is in the table: a new one is tested too.
	root, _ := newRootApp(nil, nil, nil)
	var missing []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Flags().Lookup("creds") != nil {
			if _, ok := args[strings.TrimPrefix(c.CommandPath(), "meshfold ")]; !ok {
				missing = append(missing, c.CommandPath())
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if len(missing) > 0 {
		t.Fatalf("commands taking --creds that this test does not run: %v", missing)
	}
	garbage := write("garbage.creds", "not a creds file\n")
	url := "nats://127.0.0.1:" + freePort(t) // never dialled: the file is checked first
	names := make([]string, 0, len(args))
	for n := range args {
		names = append(names, n)
	}
	slices.Sort(names)
	authJSON := func() string {
		b, err := os.ReadFile(filepath.Join(authDir, "auth.json"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := authJSON()
	ctx := testCtx(t)
	for _, n := range names {
		for _, bad := range [][]string{
			{"--creds", filepath.Join(dir, "nonexistent.creds")},
			{"--creds", garbage},
			{"--tls-ca", filepath.Join(dir, "nonexistent-ca.pem")},
		} {
			cmdArgs := append(append(append(strings.Fields(n), args[n]...), bad...), "--server", url)
			code, _, errs := runCLI(ctx, cmdArgs...)
			if code != exitUsage || !strings.Contains(errs, bad[1]) {
				t.Errorf("%s: exit %d, want %d naming %s:\n%s", strings.Join(cmdArgs, " "), code, exitUsage, bad[1], errs)
			}
		}
	}
	if authJSON() != before {
		t.Errorf("auth revoke or add-operator with a bad creds or TLS file changed the directory all the same")
	}
}
