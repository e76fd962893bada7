package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

// Exit codes, the same in every command (exitCodesHelp says them to
// the user; README.md "Exit codes" too).
const (
	exitOK       = 0
	exitError    = 1 // failed, or refused for the state of things
	exitUsage    = 2 // the command line is wrong, or names what the stream does not hold
	exitConflict = 3 // a stale --expect (someone else published first), apply over another fleet's nodes, build rm of a named build
)

// exitCodeTable is the one table of exit codes: meshfold --help prints
// it (exitCodesHelp) and README.md's "Exit codes" table holds the same
// rows (TestExitCodeTableIsTheReadmes checks it). Each meaning is
// written as the README shows it, in Markdown (code in backticks).
var exitCodeTable = []struct {
	Code    int
	Meaning string
}{
	{exitOK, "done: printed what was asked, or published"},
	{exitError, "failed, or refused for the state of things: the server cannot be reached, a read or a publish failed, a build is not pushed yet, a rollout verb the rollout would ignore (`promote` of a rollout not `waiting-promote`: its canary not done, or its agent down), a `pause` of a node paused already or a `resume` of one not paused, a retired node named to `poke`, `pause`, `resume` or `approve`, no agent answered (`logs`), an `auth revoke` that a server of the cluster did not apply (down, or refused it: the files are revoked, the lines say which server), an `auth add-operator` or `enable-named` that left the stream as it was (a reconciler of an older build answered, or none did: the creds are issued), a named operator's verb on a stream that does not store named operators' events yet"},
	{exitUsage, "usage: the command line is wrong (a flag, an argument, a file that is missing or does not parse: a want or fleet file, the `--creds`, `--nkey`, `--context` or TLS files, a provisioner's `--key` curve key file, or one missing while its node has a registered key, unless `--new-key`; a `--replicas` above 1 against a server that is not clustered), or it names a node, fleet or event the stream does not hold (`state`, `audit`, `retire`, `rollout status`, `secret put` … of a mistyped name; `want` of a node it holds no event of, unless `--new`), a module or path the node's newest want does not declare (`secret put`, `approve`, `revoke`, `waive`, unless `--ahead`), or a module the node's agent does not run (`logs NODE MODULE`); nothing was published. A dry run (`apply --dry-run`) exits as the command itself would"},
	{exitConflict, "conflict: someone else published first (a stale `want --expect`), or an `apply` over nodes another fleet's rollout names or read before another apply started the fleet's rollout, or a `want` on a target of a running rollout (unless `--force`), or a `build rm` of a build that a node's want or have, or a rollout's next steps or revert, still names; nothing was published or removed"},
}

// exitCodesHelp is the root command's table of exit codes, exitCodeTable
// as text: backticks dropped, each meaning wrapped at 76 columns under
// its code.
var exitCodesHelp = func() string {
	var b strings.Builder
	b.WriteString("Exit codes, the same for every command:")
	for _, e := range exitCodeTable {
		fmt.Fprintf(&b, "\n  %d  ", e.Code)
		col := 5
		for i, w := range strings.Fields(strings.ReplaceAll(e.Meaning, "`", "")) {
			if i > 0 && col+1+utf8.RuneCountInString(w) > 76 {
				b.WriteString("\n     ")
				col = 5
			} else if i > 0 {
				b.WriteByte(' ')
				col++
			}
			b.WriteString(w)
			col += utf8.RuneCountInString(w)
		}
	}
	return b.String()
}()

// exitError carries a specific exit code out of a command.
type codedError struct {
	code int
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func withCode(code int, err error) error { return &codedError{code: code, err: err} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the CLI with args and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root, a := newRootApp(stdin, stdout, stderr)
	// A panic of the command skips the close below: the log lines held
	// (those before the panic, which explain it) are written out on the
	// way, before the runtime prints the panic.
	defer a.closeLogs()
	root.SetArgs(args)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.cancel = cancel
	cmd, err := root.ExecuteContextC(ctx)
	a.closeLogs()
	if err == nil {
		return exitOK
	}
	if d := a.commandDenied(err); d != nil {
		err = a.explainDenied(cmd, d)
	}
	err = explainOversized(err)
	err = a.explainStream(err)
	err = a.explainReplicas(cmd, err)
	err = store.StorageFullError(err) // a KV put or a stream create refused for lack of room; appends say it already
	err = a.explainUnanswered(ctx, err)
	fmt.Fprintln(stderr, "meshfold:", err)
	var ce *codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	if isUsage(err) || unknownName(err) || errors.Is(err, store.ErrBadConfig) {
		return exitUsage // a creds, nkey, context or TLS file missing or malformed is the command line's fault too
	}
	return exitError
}

// unknownName reports whether err says a name or sequence on the command
// line is one the stream does not hold (a node with no event, a fleet
// with no rollout, a sequence that is not the node's event, a module the
// node's agent does not run): exit 2 in
// every command, as a node a verb refuses for the same reason is
// (checkKnown, checkWanted).
func unknownName(err error) bool {
	return errors.Is(err, query.ErrUnknownNode) || errors.Is(err, feed.ErrNoRollout) || errors.Is(err, audit.ErrNotInHistory) ||
		errors.Is(err, node.ErrNoModule)
}

// isUsage reports whether err is cobra's complaint about the command line
// (a missing required flag, an unknown flag or command, wrong arguments).
func isUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"required flag", "unknown flag", "unknown shorthand flag", "unknown command",
		"accepts ", "requires at least", "requires exactly", "invalid argument", "flag needs an argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// app is what every command shares: the streams and the global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	logFormat      string
	logLevel       string
	otlpEndpoint   string
	conn           connFlags
	stream         streamFlags

	// cancel ends the command's context (run sets it): a permission the
	// server denies a client command ends the command at once, and
	// denied keeps the first such violation for run to explain.
	cancel   context.CancelCauseFunc
	deniedMu sync.Mutex
	denied   error
	// deniedNeeds, when set, says which role the command needs, for
	// explainDenied to add ("'meshfold node bob' runs as the node role: …").
	deniedNeeds string
	// deniedSpared, when set, reports the subjects whose denial the
	// command carries on without (watchDeniedUntil): a provisioner whose
	// own creds predate its lease fills without one.
	deniedSpared func(subject string) bool
	// asking, while stateKnows asks the reconciler's state, ends that ask:
	// a violation then ends the ask, not the command. askDenied is the
	// subject of the first such violation (or of a state service subject
	// at any time), askSaid whether stateKnows said it. Under deniedMu.
	asking    context.CancelCauseFunc
	askDenied string
	askSaid   bool

	// logs, when set (bufferLogs), is the log writer: stderr through a
	// buffer, which run closes once the command ends.
	logs *logBuffer
}

// bufferLogs makes the loggers a returns from now on write through a
// buffer (logBuffer): the long-running roles call it before they make
// any logger, so that every line they log goes through the one buffer,
// in order.
func (a *app) bufferLogs() {
	if a.logs == nil {
		a.logs = newLogBuffer(a.stderr)
	}
}

// closeLogs writes out what the log buffer holds (if any): run calls it
// when the command ends, before it prints the command's error, and on
// a panic of the command. A second call writes nothing more.
func (a *app) closeLogs() {
	if a.logs != nil {
		_ = a.logs.Close()
	}
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root, _ := newRootApp(stdin, stdout, stderr)
	return root
}

func newRootApp(stdin io.Reader, stdout, stderr io.Writer) (*cobra.Command, *app) {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "meshfold",
		Short: "An event-sourced reconciler for a mesh of nodes, on NATS JetStream",
		Long: `meshfold keeps a fleet of nodes reconciled through an event log on NATS
JetStream.

Controllers publish what each node should run (want); nodes publish what runs
(have), the filled-file writes they refused or made, and when an apply settled;
a reconciler folds every node's events, in stream order, and publishes plans
for the nodes and knocks for the provisioner clients.

Start with:  meshfold serve     (an embedded NATS server and the reconciler)

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// --version says what `meshfold version` says, as meshfold-shim's
	// --version and most tools' do.
	v := versionInfo()
	root.Version = v.Version
	root.SetVersionTemplate(fmt.Sprintf("meshfold %s\ncommit   %s\ngo       %s %s/%s\n", v.Version, v.Commit, v.Go, runtime.GOOS, runtime.GOARCH))
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&a.otlpEndpoint, "otlp-endpoint", "", "send traces over OTLP/HTTP to this collector (http://host:4318; default $OTEL_EXPORTER_OTLP_ENDPOINT; off when neither is set); serve, reconcile, node, provision and want trace")
	for _, c := range commands {
		root.AddCommand(c(a))
	}
	return root, a
}

// commands are registered by each verb's file in init, so that a verb is
// one file.
var commands []func(*app) *cobra.Command

func register(c func(*app) *cobra.Command) { commands = append(commands, c) }

// logger returns the logger the flags ask for, writing to stderr
// (through the log buffer once bufferLogs was called).
func (a *app) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--log-level %q: want debug, info, warn or error", a.logLevel))
	}
	opts := &slog.HandlerOptions{Level: level}
	var w io.Writer = a.stderr
	if a.logs != nil {
		w = a.logs
	}
	var h slog.Handler
	switch a.logFormat {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, withCode(exitUsage, fmt.Errorf("--log-format %q: want text or json", a.logFormat))
	}
	if a.logs != nil {
		h = flushOnError{h, a.logs}
	}
	return slog.New(h), nil
}
