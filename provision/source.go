package provision

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// Source is where a provisioner finds a file's content (DESIGN.md §12).
// A client tries its sources in order; the first with content wins.
type Source interface {
	// Content returns the content of module's file path on node.
	//
	// Errors: one wrapping [ErrNoSource] when this source has nothing
	// for the file (saying why, e.g. "no file"); a [*RemovedError] when
	// the file was removed from this source on purpose (`secret rm`), so
	// that no later source is consulted; any other is a failure of the
	// source, which keeps the later sources out too (keepsLaterOut). None
	// ever holds content. It is called concurrently, for different files
	// and for the same one (a retry beside a sealed put).
	Content(ctx context.Context, node, module, path string) ([]byte, error)
	// String names the source in logs and fill statuses ("dir /srv/x").
	String() string
}

// ErrNoSource: a source has no content for the file.
var ErrNoSource = errors.New("no source")

// NoSourceError is a source's "nothing for this file": Where it looked
// (a path, a helper, a bucket key) and Why. It matches [ErrNoSource].
type NoSourceError struct{ Where, Why string }

func (e *NoSourceError) Error() string { return "no source: " + e.Why }

// Is makes the error match [ErrNoSource].
func (e *NoSourceError) Is(target error) bool { return target == ErrNoSource }

// ErrRemoved: a source holds a removal of the file (`meshfold secret
// rm`): the file is left as it is and no later source is consulted for
// it until the source has content again (a new put).
var ErrRemoved = errors.New("removed")

// RemovedError is a source's removal of a file: Where (a bucket key),
// By whom and At when. It matches [ErrRemoved].
type RemovedError struct {
	Where, By string
	At        time.Time
}

func (e *RemovedError) Error() string {
	return fmt.Sprintf("removed by %s at %s ('meshfold secret rm'): the sources after it are not consulted until a new put",
		events.Text(e.By), e.At.UTC().Format(time.RFC3339))
}

// Is makes the error match [ErrRemoved].
func (e *RemovedError) Is(target error) bool { return target == ErrRemoved }

// MaxContent bounds what a source may return, in bytes: a fill request
// carries the content in one message (the server's max payload is 1 MiB
// by default).
const MaxContent = 1 << 20

// Dir is the directory source: Dir/<module>/<path> holds the content of
// module's file path (the same on every node: one directory per node).
type Dir string

func (d Dir) String() string { return "dir " + string(d) }

// Content reads Dir/<module>/<path>.
func (d Dir) Content(_ context.Context, _, module, path string) ([]byte, error) {
	src := filepath.Join(string(d), module, filepath.FromSlash(path))
	content, err := os.ReadFile(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &NoSourceError{Where: src, Why: "no file " + src}
	}
	if err != nil {
		return nil, err // the path, the operation and the errno; never content
	}
	return content, nil
}

// DefaultExecTimeout bounds one run of an exec helper.
const DefaultExecTimeout = 10 * time.Second

// ExitNothing is the one exit code by which an exec helper says it has
// nothing for the file (DESIGN.md §12): the sources after it are asked.
// Every other outcome that is not content (any other non-zero exit, exit
// 0 with no output, a timeout) is a failing source, which keeps the later
// sources out while it fails, so that an outage of the helper's backend
// (Vault, sops' KMS) never hands the file to an older fallback. 104 is
// used by none of curl (1–99), vault (1, 2), sops (1–8, 21–25, 49–52,
// 61, 85, 91, 92, 100, 111, 128, 200–203), gpg, age or the shell
// (126, 127, 128+signal), so a helper that execs one of them, or runs
// under set -e, cannot say it by accident (docs/architecture.md, G2).
const ExitNothing = 104

// Exec is a helper command (DESIGN.md §12, as git's and docker's
// credential helpers): run as `sh -c 'COMMAND "$@"' sh NODE MODULE PATH`,
// with MESHFOLD_NODE, MESHFOLD_MODULE and MESHFOLD_PATH added to the
// provisioner's environment, its stdin empty. Exit 0 with output: the
// output is the content. Exit [ExitNothing]: no source (a
// [*NoSourceError]). Anything else failed: a non-zero exit (a backend
// that is down, a denied token), exit 0 with no output (a pipeline whose
// first command failed ends so), a helper that cannot start (the shell's
// exit 126 or 127: not found, not executable), runs past Timeout (its
// process group is killed) or prints more than [MaxContent]. Its stdout is
// never logged; the first line of its stderr, cut, is logged at warn
// when it differs from the line the helper printed last for the same
// file (at debug otherwise), so a helper failing on every retry says so
// once. Use it by pointer (it keeps those lines).
type Exec struct {
	// Command is a shell command line; the node, module and path follow
	// it as arguments.
	Command string
	// Timeout bounds one run; 0 means [DefaultExecTimeout].
	Timeout time.Duration
	// Log receives the stderr line; nil uses slog.Default().
	Log *slog.Logger

	// said is the last stderr line logged per module and path.
	said sync.Map
}

func (x *Exec) String() string { return "exec " + events.Cut(x.Command, 80) }

// Content runs the helper for one file.
func (x *Exec) Content(ctx context.Context, node, module, path string) ([]byte, error) {
	timeout := x.Timeout
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", x.Command+` "$@"`, "sh", node, module, path)
	cmd.Env = append(os.Environ(), "MESHFOLD_NODE="+node, "MESHFOLD_MODULE="+module, "MESHFOLD_PATH="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	stdout, stderr := &limited{max: MaxContent}, &limited{max: 4096}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	x.logStderr(module, path, firstLine(stderr.buf.Bytes()))
	var exit *exec.ExitError
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		return nil, fmt.Errorf("helper timed out after %s", timeout)
	case stdout.over:
		return nil, fmt.Errorf("helper printed more than %d bytes; a filled file holds at most %d", MaxContent, MaxContent)
	case errors.As(err, &exit) && (exit.ExitCode() == 126 || exit.ExitCode() == 127):
		// The shell's own codes: the command was not found (127) or could
		// not be run (126). That is a helper that cannot start, not a
		// secret the helper lacks. Its stderr stays in the log (one line,
		// above): a status is shown in fleet and the console.
		why := map[int]string{126: "not executable", 127: "command not found"}[exit.ExitCode()]
		return nil, fmt.Errorf("helper could not start: %s: %s (its stderr line is in the provisioner's log)", exit.ProcessState, why)
	case errors.As(err, &exit) && exit.ExitCode() == ExitNothing:
		return nil, &NoSourceError{Where: x.String(), Why: fmt.Sprintf("helper has nothing for the file (exit %d)", ExitNothing)}
	case errors.As(err, &exit):
		// Not "nothing": vault and sops exit so for a missing key and for
		// a backend that is down alike, and only the helper can tell them
		// apart (by exiting ExitNothing for the former).
		return nil, fmt.Errorf("helper failed: %s (only exit %d says it has nothing for the file; its stderr line is in the provisioner's log)", exit.ProcessState, ExitNothing)
	case err != nil:
		return nil, fmt.Errorf("helper: %w", err)
	case stdout.buf.Len() == 0:
		return nil, fmt.Errorf("helper printed nothing and exited 0 (a pipeline whose first command failed ends so): a failure; exit %d says it has nothing for the file", ExitNothing)
	}
	return stdout.buf.Bytes(), nil
}

// logStderr logs line, a run's first stderr line for module's path, at
// warn when it is not the one logged last for that file, else at debug;
// a run with no stderr forgets the last.
func (x *Exec) logStderr(module, path, line string) {
	key := module + "\x00" + path
	if line == "" {
		x.said.Delete(key)
		return
	}
	log := x.Log
	if log == nil {
		log = slog.Default()
	}
	level := slog.LevelWarn
	if prev, ok := x.said.Swap(key, line); ok && prev == line {
		level = slog.LevelDebug
	}
	log.Log(context.Background(), level, "exec source said", "source", x.String(), "module", module, "path", path, "stderr", line)
}

// limited keeps at most max bytes written to it and notes an overflow.
type limited struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); len(p) > room {
		l.over = true
		if room > 0 {
			l.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return l.buf.Write(p)
}

// firstLine is the first non-empty line of b, cut and escaped.
func firstLine(b []byte) string {
	sc := bufio.NewScanner(io.LimitReader(bytes.NewReader(b), 4096))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			return events.ErrorText(l)
		}
	}
	return ""
}

// notConsulted ends the why of a sealed secret that exists but does not
// open: nothing is written to the file.
const notConsulted = "the sources after it are not consulted (an older content must not come back): nothing is written to the file until 'meshfold secret put' seals it to this provisioner's key"

// notConsultedUnread ends the why of a sealed source whose bucket could
// not be read: it may hold a put.
const notConsultedUnread = "the sources after it are not consulted while the sealed secrets cannot be read (a put there may be newer than what they hold): nothing is written to the file until a pass reads them"

// errSealedUnread marks a failed read of the sealed secrets bucket (no
// answer: an election, a loaded server; a denial): whether it holds a
// put for the file is not known.
var errSealedUnread = errors.New("the sealed secrets bucket was not read")

// notConsultedFailed ends the why of any other source that failed (a
// helper that timed out, could not start, printed more than
// [MaxContent], exited non-zero but not [ExitNothing], or printed nothing;
// a directory that could not be read): it may hold newer
// content than the sources after it.
const notConsultedFailed = "the sources after it are not consulted while it fails (it may hold newer content than theirs): nothing is written to the file until it answers"

// keepsLaterOut returns the why's ending that says a failed source keeps
// the later sources out, as a removal does. Every failure does (an error
// that is neither [ErrNoSource] nor [ErrRemoved]): a sealed secret that
// exists but does not open with this provisioner's key
// (store.ErrSealedToOther, store.ErrCannotOpen), a sealed source that
// could not be read (errSealedUnread), and any other source that failed,
// a helper that timed out, could not start, printed too much (a fresh
// user's finding U29) or exited non-zero but not [ExitNothing] (a
// backend that is down: a tester's finding G2). What a later source
// holds may be older than what the failed one holds: "the first source
// that has content wins" means the first that answers, not the first
// that answers in time.
func keepsLaterOut(err error) string {
	switch {
	case errors.Is(err, store.ErrSealedToOther) || errors.Is(err, store.ErrCannotOpen):
		return notConsulted
	case errors.Is(err, errSealedUnread):
		return notConsultedUnread
	}
	return notConsultedFailed
}

// errFillState maps a source error to the state a fill status reports.
func errFillState(err error) store.FillState {
	switch {
	case errors.Is(err, store.ErrSealedToOther):
		return store.FillSealedToOther
	case errors.Is(err, store.ErrCannotOpen):
		return store.FillCannotOpen
	case errors.Is(err, ErrNoSource):
		return store.FillMissing
	}
	return store.FillSourceFailed
}
