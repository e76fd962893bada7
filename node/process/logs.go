package process

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/process/shim"
)

// maxLogPage bounds one page of output, as encoded in a reply (well under
// a NATS message): a line counts its text and its tag.
const maxLogPage = 256 << 10

// tagCost is what one line's tag adds to a reply's encoding (its time,
// its stream, the JSON around them).
const tagCost = 64

// logPoll is how often a follow looks for new output while it waits.
const logPoll = 200 * time.Millisecond

// Logs returns a page of module's captured stdout and stderr, read across
// the rotated files the rotation keeps and the current one, oldest first.
// Without a cursor the page starts q.Tail lines before the end (0: a
// page's worth), or at the first line written at or after q.Since,
// whichever is later; a cursor ("<inode>:<offset>" of one of the files)
// continues where the previous page ended, into the next file at its end.
// A cursor whose file the rotation deleted starts at the oldest line
// kept; so does the cursor of a page read before the module wrote
// anything, so a follow begun then misses none of its first lines. The
// page's More says whether more output was there to read.
//
// Errors: node.ErrNoModule; a malformed Since; the log cannot be read.
func (r *Runtime) Logs(ctx context.Context, name string, q node.LogQuery) (node.LogPage, error) {
	r.ready()
	r.mu.Lock()
	m := r.mods[name]
	r.mu.Unlock()
	if m == nil {
		return node.LogPage{}, fmt.Errorf("%w %q", node.ErrNoModule, name)
	}
	path := filepath.Join(m.dir, shim.LogFile)
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

// logFileAt is one file of a module's log, open.
type logFileAt struct {
	f    *os.File
	ino  uint64
	size int64
}

// openLogs opens the rotated files of the log at path (lumberjack's
// <name>-<time><ext>, whose names sort by time) and path itself, oldest
// first. The files stay readable, by descriptor, through a rotation that
// renames or deletes them meanwhile.
func openLogs(path string) ([]logFileAt, error) {
	dir, base := filepath.Split(path)
	ext := filepath.Ext(base)
	prefix := strings.TrimSuffix(base, ext) + "-"
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, prefix) && strings.HasSuffix(n, ext) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = append(names, base)
	var out []logFileAt
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			continue // rotated away since the listing
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			continue
		}
		lf := logFileAt{f: f, size: fi.Size()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			lf.ino = st.Ino
		}
		if slices.ContainsFunc(out, func(o logFileAt) bool { return o.ino == lf.ino }) {
			_ = f.Close() // the current file, renamed between the listing and its open
			continue
		}
		out = append(out, lf)
	}
	return out, nil
}

// readLog reads one page of the log at path (and its rotated files) for q.
func readLog(path string, q node.LogQuery) (node.LogPage, error) {
	files, err := openLogs(path)
	if err != nil {
		return node.LogPage{}, err
	}
	defer func() {
		for _, lf := range files {
			_ = lf.f.Close()
		}
	}()
	if len(files) == 0 {
		// Nothing written yet: a follow goes on from the first line,
		// however much comes before its next read (not from a tail of it).
		cur := q.Cursor
		if cur == "" {
			cur = startCursor
		}
		return node.LogPage{Lines: []string{}, Cursor: cur}, nil
	}
	var since time.Time
	if q.Since != "" {
		if since, err = time.Parse(time.RFC3339Nano, q.Since); err != nil {
			return node.LogPage{}, fmt.Errorf("since %q: want an RFC 3339 time", q.Since)
		}
	}
	// Where the page starts: file i, offset off.
	i, off := 0, int64(0)
	switch {
	case q.Cursor != "":
		ci, co, ok := parseCursor(q.Cursor)
		at := slices.IndexFunc(files, func(lf logFileAt) bool { return lf.ino == ci })
		if ok && at >= 0 && co <= files[at].size {
			i, off = at, co
		}
	default:
		i, off = tailStart(files, q.Tail)
		if !since.IsZero() {
			si, so := sinceStart(files, since)
			if si > i || (si == i && so > off) {
				i, off = si, so
			}
		}
	}
	page := node.LogPage{Lines: []string{}}
	budget := maxLogPage
	for ; i < len(files); i, off = i+1, 0 {
		lf := files[i]
		newest := i == len(files)-1
		for off < lf.size {
			buf := make([]byte, min(lf.size-off, int64(budget)))
			if _, err := lf.f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
				return node.LogPage{}, err
			}
			end := bytes.LastIndexByte(buf, '\n') + 1
			if end == 0 {
				switch {
				case newest && off+int64(len(buf)) == lf.size:
					// A partial last line waits for its newline.
					page.Cursor = cursorOf(lf.ino, off)
					return page, nil
				case len(page.Lines) > 0:
					page.More, page.Cursor = true, cursorOf(lf.ino, off)
					return page, nil
				}
				end = len(buf) // one line longer than a page, or an older file's unended last line: cut
			}
			for pos := 0; pos < end; {
				l := buf[pos:end]
				next := end
				if j := bytes.IndexByte(l, '\n'); j >= 0 {
					l, next = l[:j], pos+j+1
				}
				at, stream, text := shim.ParseLogLine(string(l))
				if cost := len(text) + tagCost; cost > budget && len(page.Lines) > 0 {
					page.More, page.Cursor = true, cursorOf(lf.ino, off+int64(pos))
					return page, nil
				}
				budget -= len(text) + tagCost
				page.Lines = append(page.Lines, text)
				page.Tags = append(page.Tags, node.LogTag{At: at, Stream: stream})
				pos = next
			}
			off += int64(end)
			if budget <= tagCost {
				page.More, page.Cursor = off < lf.size || !newest, cursorOf(lf.ino, off)
				return page, nil
			}
		}
		page.Cursor = cursorOf(lf.ino, off)
	}
	return page, nil
}

// tailStart is where the last n lines begin (n 0: a page's worth of
// bytes), counting back across files.
func tailStart(files []logFileAt, n int) (int, int64) {
	if n <= 0 {
		back := int64(maxLogPage / 2)
		for i := len(files) - 1; i >= 0; i-- {
			if files[i].size >= back {
				off := files[i].size - back
				return i, lineAfter(files[i], off)
			}
			back -= files[i].size
		}
		return 0, 0
	}
	// The files are one stream of lines: the last n begin after the
	// (n+1)th newline from the end (a partial last line is not counted).
	need := n + 1
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	for i := len(files) - 1; i >= 0; i-- {
		lf := files[i]
		end := lf.size
		if i == len(files)-1 {
			end = lastNewline(lf, end, buf) + 1
		}
		for end > 0 {
			from := max(end-chunk, 0)
			b := buf[:end-from]
			if _, err := lf.f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
				return i, 0
			}
			for j := len(b) - 1; j >= 0; j-- {
				if b[j] == '\n' {
					need--
					if need == 0 {
						return i, from + int64(j) + 1
					}
				}
			}
			end = from
		}
	}
	return 0, 0
}

// lastNewline is the offset of the last newline before end, or -1.
func lastNewline(lf logFileAt, end int64, buf []byte) int64 {
	for end > 0 {
		from := max(end-int64(len(buf)), 0)
		b := buf[:end-from]
		if _, err := lf.f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
			return -1
		}
		if j := bytes.LastIndexByte(b, '\n'); j >= 0 {
			return from + int64(j)
		}
		end = from
	}
	return -1
}

// lineAfter is the start of the first whole line at or after off.
func lineAfter(lf logFileAt, off int64) int64 {
	if off == 0 {
		return 0
	}
	buf := make([]byte, 64<<10)
	for p := off - 1; p < lf.size; {
		n, err := lf.f.ReadAt(buf, p)
		if j := bytes.IndexByte(buf[:n], '\n'); j >= 0 {
			return p + int64(j) + 1
		}
		if err != nil {
			break
		}
		p += int64(n)
	}
	return lf.size
}

// sinceStart is where the first line stamped at or after since begins
// (lines are in time order; untagged lines are skipped).
func sinceStart(files []logFileAt, since time.Time) (int, int64) {
	for i, lf := range files {
		rd := bufio.NewReaderSize(io.NewSectionReader(lf.f, 0, lf.size), 64<<10)
		var off int64
		for {
			l, err := rd.ReadSlice('\n')
			if len(l) > len(shim.LogTimeForm) {
				if at, err := time.Parse(shim.LogTimeForm, string(l[:len(shim.LogTimeForm)])); err == nil && !at.Before(since) {
					return i, off
				}
			}
			off += int64(len(l))
			if err != nil && err != bufio.ErrBufferFull {
				break
			}
		}
	}
	last := files[len(files)-1]
	return len(files) - 1, last.size
}

// startCursor is the cursor of a log with no file yet: no file has inode
// 0, so the next page starts at the oldest line kept.
var startCursor = cursorOf(0, 0)

func cursorOf(ino uint64, off int64) string {
	return strconv.FormatUint(ino, 10) + ":" + strconv.FormatInt(off, 10)
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
