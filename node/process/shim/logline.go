package shim

import (
	"bufio"
	"bytes"
	"io"
	"sync"
	"time"
)

// A module's log file holds one line per line of output, tagged with when
// the shim read it and which stream it came from:
//
//	2026-12-01T21:50:31.123456789Z out listening on :8080
//	2026-12-01T21:50:32.000000001Z err warning: no cache
//	2026-12-01T21:50:33.500000000Z meshfold meshfold: exited: status 1; next start in 1s
//
// so stdout and stderr stay apart, --since needs no guess, and a reader
// finds lines across rotations. A line longer than maxLogLine is cut into
// several.
const (
	StreamOut   = "out"
	StreamErr   = "err"
	StreamShim  = "meshfold"
	LogTimeForm = "2006-01-02T15:04:05.000000000Z"
	maxLogLine  = 64 << 10
	copyBuf     = 4 << 10 // what copyLines reads through
)

// lineWriter writes tagged lines to one file; its methods are safe for
// concurrent use (stdout, stderr and the shim's notes share the file).
type lineWriter struct {
	mu    sync.Mutex
	out   io.Writer
	buf   []byte
	lines uint64 // lines written, under mu
}

// written is how many lines w has written.
func (w *lineWriter) written() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lines
}

// line writes text (no newline) as one line of stream.
func (w *lineWriter) line(stream string, text []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = time.Now().UTC().AppendFormat(w.buf[:0], LogTimeForm)
	w.buf = append(w.buf, ' ')
	w.buf = append(w.buf, stream...)
	w.buf = append(w.buf, ' ')
	w.buf = append(w.buf, text...)
	w.buf = append(w.buf, '\n')
	_, _ = w.out.Write(w.buf)
	w.lines++
}

// copyLines tags every line read from r as stream until r ends. It reads
// through a small buffer and gathers only a line longer than that, up to
// maxLogLine: a shim's two copiers would otherwise hold 128 kB for a
// module that writes short lines (issue 27's memory per shim).
func (w *lineWriter) copyLines(stream string, r io.Reader) {
	br := bufio.NewReaderSize(r, copyBuf)
	var long []byte // the start of a line longer than br's buffer
	for {
		data, err := br.ReadSlice('\n')
		if len(long) > 0 || err == bufio.ErrBufferFull {
			long = append(long, data...)
			for len(long) > maxLogLine {
				w.line(stream, long[:maxLogLine])
				long = long[:copy(long, long[maxLogLine:])]
			}
			data = long
			if err == bufio.ErrBufferFull && len(data) < maxLogLine {
				continue
			}
		}
		if len(data) > 0 {
			w.line(stream, bytes.TrimSuffix(data, []byte("\n")))
		}
		if cap(long) > 4*copyBuf {
			long = nil // a rare long line's buffer is not kept
		}
		long = long[:0]
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}

// ParseLogLine splits a stored line into its time, stream and text. A
// line not in the tagged form (a file written before tagging) is all
// text, of no stream and no time.
func ParseLogLine(l string) (at time.Time, stream, text string) {
	if len(l) > len(LogTimeForm)+1 && l[len(LogTimeForm)] == ' ' {
		if t, err := time.Parse(LogTimeForm, l[:len(LogTimeForm)]); err == nil {
			rest := l[len(LogTimeForm)+1:]
			for _, s := range []string{StreamOut, StreamErr, StreamShim} {
				if len(rest) > len(s) && rest[:len(s)] == s && rest[len(s)] == ' ' {
					return t, s, rest[len(s)+1:]
				}
			}
		}
	}
	return time.Time{}, "", l
}
