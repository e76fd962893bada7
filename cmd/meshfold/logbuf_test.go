package main

import (
	"bytes"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// lockedBuffer is a bytes.Buffer safe for a logBuffer's timer and the
// test to use at once, counting the writes it took.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Writes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writes
}

// A logBuffer writes the lines it holds in one write, in order, on
// Close; lines logged after Close are written at once.
func TestLogBufferWritesEveryLineOnClose(t *testing.T) {
	// Not parallel: it sets logFlushAge or logBufferSize.
	defer func(age time.Duration) { logFlushAge = age }(logFlushAge)
	logFlushAge = time.Hour // only Close writes here
	var out lockedBuffer
	b := newLogBuffer(&out)
	log := slog.New(flushOnError{slog.NewTextHandler(b, nil), b})
	for i := range 100 {
		log.Warn("journaled", "n", i)
	}
	if out.Writes() != 0 {
		t.Fatalf("%d writes before Close; want none (the lines held)", out.Writes())
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 100 || out.Writes() != 1 {
		t.Fatalf("Close wrote %d lines in %d writes; want 100 in 1", len(lines), out.Writes())
	}
	for i, l := range lines {
		if !strings.HasSuffix(l, " n="+strconv.Itoa(i)) {
			t.Fatalf("line %d is %q: out of order", i, l)
		}
	}
	log.Info("after")
	if !strings.Contains(out.String(), "msg=after") || out.Writes() != 2 {
		t.Fatalf("a line after Close was not written at once: %d writes", out.Writes())
	}
}

// A line at error level is written at once, with every line held before
// it; a full buffer is written at once too.
func TestLogBufferWritesOnErrorAndWhenFull(t *testing.T) {
	// Not parallel: it sets logFlushAge or logBufferSize.
	defer func(age time.Duration, size int) { logFlushAge, logBufferSize = age, size }(logFlushAge, logBufferSize)
	logFlushAge, logBufferSize = time.Hour, 1<<20
	var out lockedBuffer
	b := newLogBuffer(&out)
	log := slog.New(flushOnError{slog.NewTextHandler(b, nil), b})
	log.Warn("held")
	log.Error("failed")
	if s := out.String(); !strings.Contains(s, "msg=held") || !strings.Contains(s, "msg=failed") {
		t.Fatalf("after an error line, wrote %q; want both lines", s)
	}
	logBufferSize = 200
	w := out.Writes()
	for out.Writes() == w {
		log.Info("filler", "pad", strings.Repeat("x", 50))
		if len(out.String()) > 1<<20 {
			t.Fatal("a full buffer was never written")
		}
	}
	_ = b.Flush()
	if !strings.HasSuffix(out.String(), "\n") {
		t.Fatalf("a line was split: %q", out.String())
	}
}

// A line held is written logFlushAge after it was logged, without a
// Close: what a process killed outright may lose is bounded by it.
func TestLogBufferWritesAfterItsAge(t *testing.T) {
	// Not parallel: it sets logFlushAge or logBufferSize.
	defer func(age time.Duration) { logFlushAge = age }(logFlushAge)
	logFlushAge = time.Millisecond
	var out lockedBuffer
	b := newLogBuffer(&out)
	defer b.Close()
	for round := range 2 { // the timer is armed again after it fired
		line := "line" + strconv.Itoa(round)
		_, _ = b.Write([]byte(line + "\n"))
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), line); {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %q not written 10 s after it was held", round, line)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// A command that panics after logging (serve and reconcile log through
// the buffer) still has its lines written, before the panic goes on: they
// are what explains it.
func TestLogBufferWrittenOnPanic(t *testing.T) {
	// Not parallel: it sets logFlushAge or logBufferSize.
	defer func(age time.Duration, cs []func(*app) *cobra.Command) { logFlushAge, commands = age, cs }(logFlushAge, commands)
	logFlushAge = time.Hour // only the command's end writes here
	commands = append(slices.Clip(commands), func(a *app) *cobra.Command {
		return &cobra.Command{Use: "panics", RunE: func(*cobra.Command, []string) error {
			a.bufferLogs()
			log, err := a.logger()
			if err != nil {
				return err
			}
			log.Warn("before the panic")
			panic("boom")
		}}
	})
	var stdout, stderr lockedBuffer
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the command's panic", p)
			}
		}()
		run(t.Context(), []string{"panics"}, strings.NewReader(""), &stdout, &stderr)
	}()
	if !strings.Contains(stderr.String(), "before the panic") {
		t.Fatalf("stderr after the panic: %q; want the line logged before it", stderr.String())
	}
}
