package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store/storetest"
)

// readmeImpossible are the README commands a test cannot follow, and why.
var readmeImpossible = map[string]string{
	"make test": "it is this very suite (go vet, then every test with the race detector): a test cannot run the suite it is part of",
}

// TestReadmeCommands follows every command of README.md's shell blocks, in
// order, as a reader with one scratch directory and its own ports would
// (issue 25): with a meshfold binary built once standing for `go run
// ./cmd/meshfold` (the README says ./bin/meshfold may), the README's /tmp
// directories moved under the scratch directory, serve on a port of its own
// (--listen; every client finds it through NATS_URL, as the README's
// default URL would) and the console on another. Each command must exit 0,
// unless its comment says which exit it has ("refused, exit 1").
//
// The long-running ones (serve, node, provision, the loop that starts four
// agents, nats sub) run in the background, each in a process group of its
// own ended by its id; a new serve ends what the reader ran before (its
// terminal is done with). What the README tells a reader to wait for is
// waited for, with a deadline: serve's "serving NATS" line; a rollout
// status re-run until it says the phase the README's comment names; a
// promote (not one the README says is refused) only once the status says
// waiting-promote; logs until the module
// says it found its credential. `audit ace --why SEQ` takes SEQ from the
// demo's output, as the README says. The `nats` lines need the nats CLI:
// when it is not installed they are listed as skipped and the one that
// publishes (`nats pub --jetstream`) is done through nats.go, so that the
// commands after it act on what it made. readmeImpossible lists the rest.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the walkthrough's node agents run modules as Linux processes")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, string(readme))
	if len(blocks) < 4 {
		t.Fatalf("%d shell blocks in the README: the walkthrough is gone?", len(blocks))
	}
	s := newReadmeSession(t, repo)
	for _, b := range blocks {
		for _, c := range b {
			s.follow(c)
		}
	}
	for _, line := range s.skipped {
		t.Log("not followed:", line)
	}
}

// readmeCmd is one command of a README shell block: its text (complete
// for bash: continuation lines, quotes, here-documents and loops joined)
// and the comments on and after it.
type readmeCmd struct {
	text    string
	comment string
}

// readmeBlocks returns the commands of each ```sh block of readme.
func readmeBlocks(t *testing.T, readme string) [][]readmeCmd {
	t.Helper()
	var blocks [][]readmeCmd
	re := regexp.MustCompile("(?ms)^```sh\n(.*?)^```")
	for _, m := range re.FindAllStringSubmatch(readme, -1) {
		var cmds []readmeCmd
		acc := ""
		for _, l := range strings.Split(m[1], "\n") {
			trim := strings.TrimSpace(l)
			if acc == "" && (trim == "" || strings.HasPrefix(trim, "#")) {
				if n := len(cmds); n > 0 && strings.HasPrefix(trim, "#") {
					cmds[n-1].comment += " " + strings.TrimSpace(strings.TrimPrefix(trim, "#"))
				}
				continue
			}
			acc += l + "\n"
			if strings.HasSuffix(l, `\`) || !bashComplete(t, acc) {
				continue
			}
			c := readmeCmd{text: acc}
			if i := strings.LastIndex(l, " # "); i >= 0 && !strings.ContainsAny(l[i:], `'"`) {
				c.comment = strings.TrimSpace(l[i+3:])
			}
			cmds = append(cmds, c)
			acc = ""
		}
		if acc != "" {
			t.Fatalf("a README shell block ends inside a command:\n%s", acc)
		}
		blocks = append(blocks, cmds)
	}
	return blocks
}

// bashComplete reports whether bash parses s as complete commands (no
// open quote, here-document or loop).
func bashComplete(t *testing.T, s string) bool {
	t.Helper()
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = strings.NewReader(s)
	out, err := cmd.CombinedOutput()
	return err == nil && !strings.Contains(string(out), "here-document")
}

// readmeSession is the reader's shell: a scratch directory (with the
// repository's examples beside it, as in a checkout), its variables kept
// from command to command, and what runs in the background.
type readmeSession struct {
	t        *testing.T
	repo     string
	dir      string
	env      string // the exported variables, as `export -p` writes them
	natsPort string
	httpPort string
	bg       []*readmeBg
	demoWhy  string // the --why SEQ command the demo printed
	skipped  []string
}

// readmeBg is a background command: the process group of its shell.
type readmeBg struct {
	text string
	pgid int
	out  string // its output file
	done chan struct{}
}

func newReadmeSession(t *testing.T, repo string) *readmeSession {
	t.Helper()
	s := newReadmeShell(t)
	s.repo = repo
	args := []string{"build", "-o", filepath.Join(s.dir, "bin", "meshfold")}
	if raceBuild {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/meshfold")...)
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.Symlink(filepath.Join(repo, "examples"), filepath.Join(s.dir, "examples")); err != nil {
		t.Fatal(err)
	}
	return s
}

// newReadmeShell returns a session's shell on a new scratch directory:
// its variables (the session's marker among them, readmeSessionEnv), its
// ports, and the watchdog that ends what the session started if this
// test process dies first (startReadmeWatchdog). Everything it starts is
// ended at cleanup.
func newReadmeShell(t *testing.T) *readmeSession {
	t.Helper()
	// Not t.TempDir: its parent is 0700, and modules run as nobody (the
	// README's runs_as) when the agents are root must reach their bundles.
	dir, err := os.MkdirTemp("", "meshfold-readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	s := &readmeSession{t: t, dir: dir, env: filepath.Join(dir, "env.sh"), natsPort: freePort(t), httpPort: freePort(t)}
	for _, sub := range []string{"xdg-state", "xdg-config", "xdg-cache"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	env := fmt.Sprintf("export PATH=%q\nexport NATS_URL=%q\nexport XDG_STATE_HOME=%q XDG_CONFIG_HOME=%q XDG_CACHE_HOME=%q\nexport %s=%q\nunset NATS_CREDS NATS_CONTEXT\n",
		bin+":"+os.Getenv("PATH"), "nats://127.0.0.1:"+s.natsPort,
		filepath.Join(dir, "xdg-state"), filepath.Join(dir, "xdg-config"), filepath.Join(dir, "xdg-cache"),
		readmeSessionEnv, dir)
	if err := os.WriteFile(s.env, []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
	startReadmeWatchdog(t, dir)
	t.Cleanup(s.stopAll)
	return s
}

// freePort is storetest.FreePort as a string.
func freePort(t *testing.T) string {
	t.Helper()
	return fmt.Sprint(storetest.FreePort(t))
}

// rewrite makes a README command the session's: the binary for go run,
// the scratch directory for /tmp, the session's ports.
func (s *readmeSession) rewrite(c string) string {
	c = strings.ReplaceAll(c, "go run ./cmd/meshfold", "meshfold")
	c = strings.ReplaceAll(c, "/tmp/meshfold-walk", filepath.Join(s.dir, "walk"))
	c = strings.ReplaceAll(c, "/tmp/meshfold-demo", filepath.Join(s.dir, "demo"))
	c = strings.ReplaceAll(c, "127.0.0.1:7070", "127.0.0.1:"+s.httpPort)
	if regexp.MustCompile(`^meshfold serve\b`).MatchString(c) {
		c = strings.Replace(c, "meshfold serve", "meshfold serve --listen 127.0.0.1:"+s.natsPort, 1)
	}
	return c
}

// script is c run in the session's shell: its variables before, and kept
// after (set -a exports every assignment).
func (s *readmeSession) script(c string) string {
	return "set -a\n. " + s.env + "\n" + c + "\n__rc=$?\nexport -p | grep '^declare -x ' > " + s.env + ".new && mv " + s.env + ".new " + s.env +
		"\nexit $__rc\n"
}

func (s *readmeSession) shell(c string) *exec.Cmd {
	cmd := exec.Command("bash", "-c", s.script(c))
	cmd.Dir = s.dir
	// The shell itself carries the session's marker from its start, not
	// only from the env file it sources: the watchdog's sweep reads the
	// marker in /proc/PID/environ, which holds a process's exec-time
	// environment. Unmarked, a shell outlived the sweep, woke from its
	// `wait` when the sweep killed its children, and wrote env.sh into
	// the directory the watchdog was removing (left behind in /tmp).
	cmd.Env = append(os.Environ(), readmeSessionEnv+"="+s.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// run runs c in the foreground within limit and returns its output and
// exit code.
func (s *readmeSession) run(c string, limit time.Duration) (string, string, int) {
	s.t.Helper()
	cmd := s.shell(c)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(limit):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group this test started
		}
	}()
	err := cmd.Wait()
	close(done)
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return out.String(), errb.String(), code
}

// must runs c and fails the test unless it exits 0.
func (s *readmeSession) must(readme, c string, limit time.Duration) string {
	s.t.Helper()
	out, errOut, code := s.run(c, limit)
	if code != 0 {
		s.t.Fatalf("README command exited %d (the README says nothing of a failure):\n%s\nran: %s\nstdout:\n%s\nstderr:\n%s%s",
			code, readme, c, out, errOut, s.bgLogs())
	}
	return out
}

// log records a command followed and its output, for -v and a failure.
func (s *readmeSession) log(c, out string) {
	s.t.Logf("$ %s\n%s", strings.TrimSpace(c), tail(out, 600))
}

// until re-runs c, as a reader re-runs a status, until its output holds
// want; it fails the test at the deadline.
func (s *readmeSession) until(readme, c, want string, limit time.Duration) string {
	s.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out := s.must(readme, c, time.Minute)
		if strings.Contains(out, want) {
			s.log(c, out)
			return out
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("README command never said %q within %s:\n%s\nlast output:\n%s%s", want, limit, readme, out, s.bgLogs())
		}
		time.Sleep(250 * time.Millisecond) // a reader re-running a status, bounded by the deadline
	}
}

var (
	readmeExitRE   = regexp.MustCompile(`\bexit (\d+)\b`)
	rolloutPhaseRE = regexp.MustCompile(`waiting-promote|completed|reverted|halted`)
	demoWhyRE      = regexp.MustCompile(`meshfold audit \S+ --why \d+`)
	natsReqRE      = regexp.MustCompile(`^nats req '([^']+)' ''`)
	natsPubRE      = regexp.MustCompile(`(?s)^nats pub --jetstream (\S+) \\\n\s*'(.*)'\s*$`)
)

// follow runs one README command as the README says.
func (s *readmeSession) follow(rc readmeCmd) {
	t := s.t
	t.Helper()
	text := strings.TrimSpace(rc.text)
	if why, ok := readmeImpossible[stripComment(text)]; ok {
		s.skipped = append(s.skipped, text+": "+why)
		return
	}
	c := s.rewrite(text)
	if m := readmeExitRE.FindStringSubmatch(rc.comment); m != nil && m[1] != "0" {
		// The README says this one fails ("too early: refused, exit 1").
		out, errOut, code := s.run(c, time.Minute)
		if fmt.Sprint(code) != m[1] {
			t.Fatalf("README command exited %d, the README says exit %s:\n%s\nstdout:\n%s\nstderr:\n%s%s", code, m[1], text, out, errOut, s.bgLogs())
		}
		t.Logf("$ %s\n(exit %d, as the README says)\n%s", c, code, tail(errOut, 600))
		return
	}
	switch {
	case strings.HasPrefix(text, "nats "):
		s.nats(text)
	case strings.HasPrefix(c, "meshfold serve"):
		s.stopAll() // the reader's earlier terminals are done with
		b := s.start(text, c)
		waitOutput(t, b, "serving NATS at", 2*time.Minute, s)
	case strings.HasPrefix(c, "meshfold node ") || strings.HasPrefix(c, "meshfold provision "):
		s.start(text, c)
	case strings.HasPrefix(c, "for ") && strings.Contains(c, "&\n"):
		// Starts agents in the background and ends: its group stays.
		cmd := s.shell(c)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("README command failed: %v\n%s\n%s", err, text, out)
		}
		s.bg = append(s.bg, &readmeBg{text: text, pgid: cmd.Process.Pid})
	case strings.Contains(c, "rollout status"):
		if phases := rolloutPhaseRE.FindAllString(rc.comment, -1); len(phases) > 0 {
			s.until(text, c, phases[len(phases)-1], 3*time.Minute)
			return
		}
		s.must(text, c, time.Minute)
	case strings.Contains(c, "rollout promote"):
		// A promote acts once the status says waiting-promote.
		fleet := strings.Fields(stripComment(c))[3]
		s.until(text, "meshfold rollout status "+fleet, "waiting-promote", 3*time.Minute)
		s.must(text, c, time.Minute)
	case strings.Contains(c, "meshfold logs ace mesh-build-go"):
		s.until(text, c, "broker credential found", 2*time.Minute)
	case strings.Contains(c, "rollout why"):
		// "the want, the crash loop (3 restarts, status 1), the revert"
		if out := s.must(text, c, time.Minute); !strings.Contains(out, "revert") {
			t.Errorf("%s: no revert:\n%s", text, out)
		}
	case strings.HasPrefix(c, "ls -l "):
		s.until(text, c, "-rw-------", time.Minute)
	case strings.Contains(c, "--why SEQ"):
		if s.demoWhy == "" {
			t.Fatalf("the demo printed no 'meshfold audit NODE --why SEQ' command, which the README says it does")
		}
		out := s.must(text, strings.Replace(c, "meshfold audit ace --why SEQ", s.demoWhy, 1), time.Minute)
		if !strings.Contains(out, "knock") {
			t.Errorf("%s: the chain does not name the knock:\n%s", s.demoWhy, out)
		}
	default:
		out := s.must(text, c, 3*time.Minute)
		s.log(c, out)
		if strings.HasPrefix(c, "meshfold demo") {
			s.demoWhy = demoWhyRE.FindString(out)
		}
	}
}

// stripComment drops a trailing " # …" comment from a one-line command.
func stripComment(c string) string {
	if i := strings.Index(c, " #"); i >= 0 && !strings.Contains(c, "\n") {
		c = c[:i]
	}
	return strings.TrimSpace(c)
}

// nats follows a nats CLI line: with the CLI installed, as written (sub in
// the background); without it, skipped and said so, except a JetStream
// publish, done here through nats.go so the commands after it find what
// it stored.
func (s *readmeSession) nats(text string) {
	t := s.t
	t.Helper()
	if _, err := exec.LookPath("nats"); err == nil {
		if strings.HasPrefix(text, "nats sub") {
			s.start(text, text)
			return
		}
		s.must(text, text, time.Minute)
		return
	}
	if m := natsReqRE.FindStringSubmatch(text); m != nil {
		nc := dial(t, "nats://127.0.0.1:"+s.natsPort)
		defer nc.Close()
		msg, err := nc.Request(m[1], nil, 10*time.Second)
		node := m[1][strings.LastIndex(m[1], ".")+1:]
		if err != nil || !strings.Contains(string(msg.Data), `"node":"`+node+`"`) {
			t.Fatalf("%s (through nats.go: the nats CLI is not installed): %v %s", text, err, msgData(msg))
		}
		s.skipped = append(s.skipped, "nats req "+m[1]+": asked through nats.go, the nats CLI is not installed here")
		return
	}
	m := natsPubRE.FindStringSubmatch(text)
	if m == nil {
		s.skipped = append(s.skipped, strings.SplitN(text, "\n", 2)[0]+": the nats CLI is not installed here")
		return
	}
	nc := dial(t, "nats://127.0.0.1:"+s.natsPort)
	defer nc.Close()
	msg, err := nc.Request(m[1], []byte(m[2]), 10*time.Second)
	if err != nil {
		t.Fatalf("%s (through nats.go: the nats CLI is not installed): %v", text, err)
	}
	if !strings.Contains(string(msg.Data), `"seq"`) || strings.Contains(string(msg.Data), `"error"`) {
		t.Fatalf("%s: the stream answered %s", text, msg.Data)
	}
	s.skipped = append(s.skipped, "nats pub --jetstream "+m[1]+": published through nats.go, the nats CLI is not installed here")
}

// start runs c in the background, its output to a file.
func (s *readmeSession) start(text, c string) *readmeBg {
	t := s.t
	t.Helper()
	out, err := os.CreateTemp(s.dir, "bg-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := s.shell(c)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out.Close()
	b := &readmeBg{text: text, pgid: cmd.Process.Pid, out: out.Name(), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(b.done) }()
	s.bg = append(s.bg, b)
	return b
}

// waitOutput waits until b's output holds want, or b ends, or the limit.
func waitOutput(t *testing.T, b *readmeBg, want string, limit time.Duration, s *readmeSession) {
	t.Helper()
	deadline := time.After(limit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		data, _ := os.ReadFile(b.out)
		if strings.Contains(string(data), want) {
			return
		}
		select {
		case <-b.done:
			data, _ := os.ReadFile(b.out)
			t.Fatalf("README command ended before saying %q:\n%s\n%s", want, b.text, data)
		case <-deadline:
			t.Fatalf("README command did not say %q within %s:\n%s\n%s", want, limit, b.text, data)
		case <-tick.C:
		}
	}
}

// bgLogs is the output of the background commands still known, for a
// failure's message.
func (s *readmeSession) bgLogs() string {
	var b strings.Builder
	for _, p := range s.bg {
		if p.out == "" {
			continue
		}
		data, _ := os.ReadFile(p.out)
		fmt.Fprintf(&b, "\n--- background: %s\n%s", strings.TrimSpace(p.text), tail(string(data), 3000))
	}
	logs, _ := filepath.Glob(filepath.Join(s.dir, "walk", "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		fmt.Fprintf(&b, "\n--- %s\n%s", filepath.Base(l), tail(string(data), 2000))
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// stopAll ends every background command's process group (SIGTERM, then
// SIGKILL after 15 s), then the module processes the walkthrough's agents
// left running (they outlive their agent by design).
func (s *readmeSession) stopAll() {
	for _, b := range s.bg {
		_ = syscall.Kill(-b.pgid, syscall.SIGTERM) // a group this test started
	}
	for _, b := range s.bg {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		for ctx.Err() == nil && syscall.Kill(-b.pgid, 0) == nil {
			time.Sleep(20 * time.Millisecond) // waiting for a group to go, bounded
		}
		cancel()
		if syscall.Kill(-b.pgid, 0) == nil {
			_ = syscall.Kill(-b.pgid, syscall.SIGKILL)
		}
		if b.done != nil {
			<-b.done
		}
	}
	s.bg = nil
	states, _ := filepath.Glob(filepath.Join(s.dir, "walk", "*-state", "process"))
	for _, d := range states {
		killModules(s.t, d)
	}
}

func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
