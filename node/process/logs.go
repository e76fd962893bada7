package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshfold/meshfold/node"
)

// maxLogPage bounds one page of output (well under a NATS message).
const maxLogPage = 256 << 10

// logPoll is how often a follow looks for new output while it waits.
const logPoll = 200 * time.Millisecond

// Logs returns a page of module's captured stdout and stderr from its
// current log file (rotated files are not read). A cursor is
// "<inode>:<offset>" of that file; after a rotation the page starts at
// the new file's beginning.
//
// Errors: node.ErrNoModule; the log cannot be read.
func (r *Runtime) Logs(ctx context.Context, name string, q node.LogQuery) (node.LogPage, error) {
	r.ready()
	r.mu.Lock()
	m := r.mods[name]
	r.mu.Unlock()
	if m == nil {
		return node.LogPage{}, fmt.Errorf("%w %q", node.ErrNoModule, name)
	}
	path := filepath.Join(m.dir, logFile)
	wait := min(time.Duration(q.WaitMS)*time.Millisecond, node.MaxLogWait)
	deadline := time.Now().Add(wait)
	for {
		page, err := readLog(path, q)
		if err != nil || len(page.Lines) > 0 || wait <= 0 || time.Now().After(deadline) {
			return page, err
		}
		t := time.NewTimer(logPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return page, nil
		case <-t.C:
		}
	}
}

// readLog reads one page of path for q.
func readLog(path string, q node.LogQuery) (node.LogPage, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return node.LogPage{Lines: []string{}, Cursor: q.Cursor}, nil
	}
	if err != nil {
		return node.LogPage{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return node.LogPage{}, err
	}
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	size := fi.Size()
	var from int64
	if q.Cursor != "" {
		ci, co, ok := parseCursor(q.Cursor)
		if ok && ci == ino && co <= size {
			from = co
		}
	} else {
		// The tail: back from the end, at most a page.
		from = max(size-maxLogPage, 0)
	}
	n := min(size-from, maxLogPage)
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, from); err != nil && !errors.Is(err, io.EOF) {
		return node.LogPage{}, err
	}
	// Whole lines only: a partial last line waits for its newline, unless
	// the page is full of one line longer than a page.
	end := bytes.LastIndexByte(buf, '\n') + 1
	if end == 0 && n == maxLogPage {
		end = len(buf)
	}
	buf = buf[:end]
	start := 0
	if q.Cursor == "" && from > 0 {
		// The tail began mid-file: drop the partial first line.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			start = i + 1
		}
	}
	lines := strings.Split(strings.TrimSuffix(string(buf[start:]), "\n"), "\n")
	if len(buf[start:]) == 0 {
		lines = []string{}
	}
	if q.Cursor == "" && q.Tail > 0 && len(lines) > q.Tail {
		lines = lines[len(lines)-q.Tail:]
	}
	return node.LogPage{Lines: lines, Cursor: strconv.FormatUint(ino, 10) + ":" + strconv.FormatInt(from+int64(end), 10)}, nil
}

func parseCursor(c string) (ino uint64, off int64, ok bool) {
	a, b, found := strings.Cut(c, ":")
	if !found {
		return 0, 0, false
	}
	i, err1 := strconv.ParseUint(a, 10, 64)
	o, err2 := strconv.ParseInt(b, 10, 64)
	return i, o, err1 == nil && err2 == nil && o >= 0
}
