package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logBufferSize and logFlushAge bound what a logBuffer holds: it writes
// out once it holds logBufferSize bytes, and logFlushAge after the
// oldest line it holds was logged. A variable for the tests.
var (
	logBufferSize = 64 << 10
	logFlushAge   = 100 * time.Millisecond
)

// logBuffer is the log writer of the long-running roles (serve,
// reconcile): it gathers log lines in memory and writes them to w in one
// write, instead of a write system call a line. A first refold of an
// effect-dense history logs a line for every journal entry it publishes
// (docs/architecture.md, "The reconciler's log is written in batches").
//
// It writes what it holds when it holds logBufferSize bytes,
// logFlushAge after the oldest line it holds, after a line at error
// level (flushOnError), and on Close, which the command's end calls (a
// panic of the command's goroutine too), so a clean stop loses nothing.
// A process killed outright (SIGKILL, a crash of the runtime, a panic of
// another goroutine) loses at most the lines of its last logFlushAge;
// the journal entries those lines copy are in the stream, which is the
// journal's record.
type logBuffer struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte
	timer  *time.Timer
	armed  bool // timer runs for the lines held
	closed bool
}

func newLogBuffer(w io.Writer) *logBuffer { return &logBuffer{w: w} }

// Write holds p, a log line, writing what it holds once that is
// logBufferSize bytes or more; after Close it writes p at once. Its
// error is w's, from a write of what it held.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.w.Write(p)
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= logBufferSize {
		return len(p), b.flushLocked()
	}
	if !b.armed {
		b.armed = true
		if b.timer == nil {
			b.timer = time.AfterFunc(logFlushAge, func() { _ = b.Flush() })
		} else {
			b.timer.Reset(logFlushAge)
		}
	}
	return len(p), nil
}

// Flush writes what b holds; its error is w's.
func (b *logBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

func (b *logBuffer) flushLocked() error {
	if b.armed {
		b.timer.Stop()
		b.armed = false
	}
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Close writes what b holds; every later line is written at once.
func (b *logBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.flushLocked()
	b.closed = true
	return err
}

// flushOnError is a handler that writes its buffer out after each record
// at error level or above: an error is what an operator reads first, and
// often the last thing a failing process logs.
type flushOnError struct {
	slog.Handler
	buf *logBuffer
}

func (h flushOnError) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelError {
		_ = h.buf.Flush()
	}
	return err
}

func (h flushOnError) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushOnError{h.Handler.WithAttrs(attrs), h.buf}
}

func (h flushOnError) WithGroup(name string) slog.Handler {
	return flushOnError{h.Handler.WithGroup(name), h.buf}
}
