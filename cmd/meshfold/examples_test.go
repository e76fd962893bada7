package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// exampleCall is one `meshfold …` invocation of a help's example.
type exampleCall struct {
	line    string   // the example's line, for messages
	args    []string // after "meshfold", quotes removed, $VARs as written
	capture string   // VAR of VAR=$(meshfold …), or ""
	piped   bool     // its stdin is another command's output
	exit    int      // the code its comment says ("refused, exit 3"), else 0
}

var exitComment = regexp.MustCompile(`exit ([0-9])`)

// exampleCalls reads the meshfold invocations of an Example text: each
// line (a trailing \ joins the next), split on |, && and ;, with shell
// quotes and # comments, VAR=$(meshfold …) captured. Commands other than
// meshfold (jq, echo, vault) are not calls.
func exampleCalls(t *testing.T, example string) []exampleCall {
	t.Helper()
	var calls []exampleCall
	for _, line := range strings.Split(strings.ReplaceAll(example, "\\\n", " "), "\n") {
		words, comment := shellWords(t, strings.TrimSpace(line))
		exit := 0
		if m := exitComment.FindStringSubmatch(comment); m != nil && strings.Contains(comment, "refused") {
			exit, _ = strconv.Atoi(m[1])
		}
		var seg []string
		piped := false
		flush := func(next string) {
			if len(seg) > 0 {
				c := exampleCall{line: strings.TrimSpace(line), piped: piped, exit: exit}
				if v, inner, ok := strings.Cut(seg[0], "=$("); ok && len(seg) == 1 {
					c.capture = v
					seg, _ = shellWords(t, strings.TrimSuffix(inner, ")"))
				}
				if len(seg) > 0 && seg[0] == "meshfold" {
					c.args = seg[1:]
					calls = append(calls, c)
				}
			}
			seg, piped = nil, next == "|"
		}
		for _, w := range words {
			switch w {
			case "|", "&&", ";":
				flush(w)
			default:
				seg = append(seg, w)
			}
		}
		flush("")
	}
	return calls
}

// shellWords splits a line as sh would, enough for the examples: words,
// '…' and "…" quotes (removed), $(…) kept as one word, |, && and ; as
// words of their own, and the comment after an unquoted #.
func shellWords(t *testing.T, s string) (words []string, comment string) {
	t.Helper()
	var w strings.Builder
	in := false // a word is open
	end := func() {
		if in {
			words = append(words, w.String())
			w.Reset()
			in = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			end()
		case c == '#' && !in:
			return words, s[i+1:]
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				t.Fatalf("unclosed quote in example %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			in, i = true, i+1+j
		case c == '$' && i+1 < len(s) && s[i+1] == '(':
			depth, j := 0, i+1
			for ; j < len(s); j++ {
				if s[j] == '(' {
					depth++
				} else if s[j] == ')' {
					if depth--; depth == 0 {
						break
					}
				}
			}
			w.WriteString(s[i : j+1])
			in, i = true, j
		case c == '|' || c == ';':
			end()
			words = append(words, string(c))
		case c == '&' && i+1 < len(s) && s[i+1] == '&':
			end()
			words = append(words, "&&")
			i++
		default:
			w.WriteByte(c)
			in = true
		}
	}
	end()
	return words, ""
}

// expand replaces each $VAR or ${VAR} of arg by vars[VAR], else the
// environment's.
func expand(arg string, vars map[string]string) string {
	return os.Expand(arg, func(k string) string {
		if v, ok := vars[k]; ok {
			return v
		}
		return os.Getenv(k)
	})
}

// walkCommands calls f on every command an operator may see.
func walkCommands(c *cobra.Command, f func(*cobra.Command)) {
	if c.Hidden || c.Name() == "completion" || c.Name() == "help" {
		return
	}
	f(c)
	for _, s := range c.Commands() {
		walkCommands(s, f)
	}
}

// Every example of every command's help is a command line meshfold
// takes: the command exists, its flags parse, its arguments pass the
// command's own check and its required flags are given (a fresh user's
// finding: the help of build, secret and auth showed none, and some
// showed placeholders no command takes).
func TestExamplesParse(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"BUILD": "sha256:" + strings.Repeat("0", 64), "B": "sha256:" + strings.Repeat("0", 64)}
	n := 0
	walkCommands(newRoot(nil, nil, nil), func(c *cobra.Command) {
		for _, call := range exampleCalls(t, c.Example) {
			n++
			args := make([]string, len(call.args))
			for i, a := range call.args {
				args[i] = expand(a, vars)
			}
			root := newRoot(nil, nil, nil) // fresh flags for each call
			cmd, rest, err := root.Find(args)
			if err != nil || cmd == root {
				t.Errorf("%s: example %q: no such command (%v)", c.CommandPath(), call.line, err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), call.line, err)
				continue
			}
			if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), call.line, err)
			}
			if err := cmd.ValidateRequiredFlags(); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), call.line, err)
			}
			if err := cmd.ValidateFlagGroups(); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), call.line, err)
			}
		}
	})
	if n < 100 {
		t.Errorf("only %d example calls read: the reader misses some", n)
	}
}

// The examples of build, secret and auth, and of each of their
// subcommands, run as written (in a fresh directory, against a test
// server, in order, a captured $BUILD carried to the next), and exit as
// their comment says (0 unless "refused, exit N"); only those that need
// another machine or run for good are left to TestExamplesParse.
func TestExamplesRun(t *testing.T) {
	// Not parallel: t.Setenv.
	m := startMesh(t)
	m.serveSigned(t)
	t.Setenv("NATS_URL", m.e.ClientURL())
	for _, e := range []string{"NATS_CREDS", "NATS_NKEY", "NATS_CONTEXT", "NATS_CA", "NATS_CERT", "NATS_KEY"} {
		t.Setenv(e, "")
	}
	// Node ace's provisioner has registered its curve key: secret put
	// seals to it.
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	kv, err := store.OpenSecrets(testCtx(t), m.js, m.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testCtx(t), store.CurveKeyName("ace"), []byte(pub)); err != nil {
		t.Fatal(err)
	}
	// Not run: what needs another machine or runs until stopped.
	skip := func(call exampleCall) string {
		switch {
		case strings.Contains(call.line, ".example:"):
			return "another machine's server"
		case slices.Contains([]string{"serve", "node", "provision", "reconcile", "console"}, call.args[0]):
			return "runs until stopped"
		case call.piped:
			return "reads another program's output (vault)"
		case call.args[0] == "auth" && call.args[1] == "revoke" && !slices.Contains(call.args, "--no-push"):
			return "pushes to a server in operator mode"
		case call.args[0] == "fleet" && slices.Contains(call.args, "--creds"):
			return "a server in operator mode"
		case call.args[0] == "auth" && (call.args[1] == "enable-named" || call.args[1] == "add-operator" && !slices.Contains(call.args, "--no-stream")):
			return "updates the stream on a server in operator mode (TestAddOperatorUpgradesTheStreamLast)"
		}
		return ""
	}
	root := t.TempDir()
	for _, group := range []string{"build", "secret", "auth"} {
		if group == "secret" {
			// ace's newest want declares the file the secret examples put
			// (a put of a file no want declares is refused without --ahead).
			w := &events.Want{Modules: []events.WantModule{{Name: "mesh-build-go", Build: "img:mbg-1", RunsAs: "mbg",
				Files: []events.File{{Path: "/run/mesh-build-go/broker.creds", Mode: "0600"}}}}}
			if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := newRootApp(nil, nil, nil)
		g, _, err := r.Find([]string{group})
		if err != nil {
			t.Fatal(err)
		}
		walkCommands(g, func(c *cobra.Command) {
			name := strings.TrimPrefix(c.CommandPath(), "meshfold ")
			if c.Example == "" {
				t.Errorf("%s: no example in its help", name)
				return
			}
			dir := filepath.Join(root, strings.ReplaceAll(name, " ", "-"))
			setupExampleDir(t, dir, name)
			t.Chdir(dir)
			vars := map[string]string{}
			for _, call := range exampleCalls(t, c.Example) {
				if why := skip(call); why != "" {
					t.Logf("%s: not run (%s): %s", name, why, call.line)
					continue
				}
				args := make([]string, len(call.args))
				for i, a := range call.args {
					args[i] = expand(a, vars)
					if strings.HasPrefix(args[i], "/etc/meshfold/") { // a system path, under the test's directory
						args[i] = filepath.Join(dir, args[i])
					}
				}
				code, out, errs := runCLI(testCtx(t), args...)
				if code != call.exit {
					t.Errorf("%s: example %q: exit %d, its help says %d:\n%s%s", name, call.line, code, call.exit, out, errs)
				}
				if call.capture != "" {
					vars[call.capture] = strings.TrimSpace(out)
				}
				if name == "build" && call.capture == "BUILD" { // the want the group's example names
					write(t, filepath.Join(dir, "ace.json"), `{"modules":[{"name":"mesh-build-go","build":"`+vars["BUILD"]+`","runs_as":"mbg"}]}`, 0o644)
				}
			}
		})
	}
}

// setupExampleDir makes dir hold what the examples of the command name
// expect to find: the bundles build pushes, the file secret put seals,
// the auth directory the auth verbs change.
func setupExampleDir(t *testing.T, dir, name string) {
	t.Helper()
	write(t, filepath.Join(dir, "mesh-build-go"), "#!/bin/sh\nexec sleep 3600\n", 0o755)
	write(t, filepath.Join(dir, "bundles", "mesh-build-go", "run"), "#!/bin/sh\nexec sleep 3600\n", 0o755)
	write(t, filepath.Join(dir, "bundles", "mesh-build-go", "meshfold.json"), `{"command":["run"]}`, 0o644)
	write(t, filepath.Join(dir, "broker.creds"), "example content\n", 0o600)
	write(t, filepath.Join(dir, "tls.key"), "example key\n", 0o600)
	if strings.HasPrefix(name, "build rm") {
		// A build to remove, pushed before: $BUILD.
		t.Chdir(dir)
		code, out, errs := runCLI(testCtx(t), "build", "push", "./mesh-build-go")
		if code != 0 {
			t.Fatalf("build push: %d %s", code, errs)
		}
		t.Setenv("BUILD", strings.TrimSpace(out))
	}
	if strings.HasPrefix(name, "auth ") && name != "auth init" {
		if code, _, errs := runCLI(testCtx(t), "auth", "init", "--dir", filepath.Join(dir, "mesh-auth")); code != 0 {
			t.Fatalf("auth init: %d %s", code, errs)
		}
		if name != "auth add-node" {
			if code, _, errs := runCLI(testCtx(t), "auth", "add-node", "ace", "--dir", filepath.Join(dir, "mesh-auth")); code != 0 {
				t.Fatalf("auth add-node: %d %s", code, errs)
			}
		}
		if name == "auth add-user" { // issued again after its revocation
			if code, _, errs := runCLI(testCtx(t), "auth", "revoke", "operator-read", "--no-push", "--dir", filepath.Join(dir, "mesh-auth")); code != 0 {
				t.Fatalf("auth revoke: %d %s", code, errs)
			}
		}
		if name == "auth rotate-reconciler" { // a serve's data directory: its seed and trust file, as serve writes them
			signer, _, _, err := reconcilerKeys(filepath.Join(dir, "meshfold-data", signingKeyFile))
			if err == nil {
				err = store.WriteTrustFile(filepath.Join(dir, "meshfold-data", trustFileName), signer.PublicKey())
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}
