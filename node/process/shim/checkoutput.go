package shim

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

// An exec check's own output (stdout and stderr together) goes with the
// note of its fall into the module's log, which `meshfold logs` reads:
// "unhealthy after 3 failed exec checks: exec: status 1; its output: ready
// marker absent" (fresh12: the note said only "exec: status 1", and the
// check's own words were lost). Bounded: the last checkOutputMax bytes,
// on one line. Never a filled file's content: an output holding any
// secretWindow bytes in a row of a file the module declares (Spec.Files,
// read from spec.json when the output is judged: the runtime rewrites it
// when its plan's files change) is left out, said so.
const (
	checkOutputMax = 512
	// secretWindow: a run this long of a declared file's content in
	// the output leaves it out (a set -x trace, a cat of the file).
	secretWindow = 8
	// secretReadMax is how much of each declared file is compared.
	secretReadMax = 256 << 10
	// drainWait is how long the output is read after the check exited
	// (a child of it may hold the pipe open).
	drainWait = 100 * time.Millisecond
)

// tailBuffer keeps the last checkOutputMax bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - checkOutputMax; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
		t.cut = true
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.buf), t.cut
}

// capture reads r into a tailBuffer until r ends or done is closed and
// drainWait passed; the returned func waits for that and gives the tail.
func capture(r *os.File, done <-chan struct{}) func() ([]byte, bool) {
	var tb tailBuffer
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = io.Copy(&tb, r)
	}()
	return func() ([]byte, bool) {
		select {
		case <-ended:
		case <-done:
			_ = r.SetReadDeadline(time.Now().Add(drainWait))
			<-ended
		}
		_ = r.Close()
		return tb.bytes()
	}
}

// outputText is out as the note says it: "" when empty; else "; its
// output: …" on one line (line breaks as " / ", other control characters
// and invalid UTF-8 as "?"), "…" first when the start was cut; or a word
// that it was left out, when it holds a run of a declared file's content.
func outputText(out []byte, cut bool, files []string) string {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return ""
	}
	if holdsFileContent(out, files) {
		return "; its output left out: it holds part of a file the module declares (a filled file's content never enters a log line)"
	}
	var b bytes.Buffer
	b.WriteString("; its output: ")
	if cut {
		b.WriteString("…")
	}
	for len(out) > 0 {
		r, n := utf8.DecodeRune(out)
		switch {
		case r == '\n':
			b.WriteString(" / ")
		case r == utf8.RuneError && n == 1, unicode.IsControl(r):
			b.WriteByte('?')
		default:
			b.Write(out[:n])
		}
		out = out[n:]
	}
	return b.String()
}

// holdsFileContent reports whether out holds secretWindow bytes in a row
// of one of files' content (the first secretReadMax bytes of each regular
// file; an unreadable file holds nothing). A window of spaces or
// punctuation alone is no content.
func holdsFileContent(out []byte, files []string) bool {
	for _, f := range files {
		content := readDeclared(f)
		if len(content) < secretWindow {
			if len(content) > 0 && bytes.Contains(out, bytes.TrimSpace(content)) && len(bytes.TrimSpace(content)) > 0 {
				return true
			}
			continue
		}
		for i := 0; i+secretWindow <= len(out); i++ {
			w := out[i : i+secretWindow]
			if bytes.IndexFunc(w, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) < 0 {
				continue
			}
			if bytes.Contains(content, w) {
				return true
			}
		}
	}
	return false
}

// readDeclared reads the start of a declared file as the shim (root)
// sees it: not through a symlink at its end, nor a FIFO or device.
func readDeclared(path string) []byte {
	f, err := os.OpenFile(filepath.Clean(path), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, secretReadMax))
	return b
}

// declaredFiles returns the files the module declares now, as spec.json
// says (the runtime rewrites it when they change), else as the shim's
// spec said at its start.
func (s *shim) declaredFiles() []string {
	var sp Spec
	if err := ReadJSON(s.dir, SpecFile, &sp); err == nil && sp.Module == s.spec.Module {
		return sp.Files
	}
	return s.spec.Files
}
