package atomicfile

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv marks this test binary re-executed as a writer to be killed:
// its value is the step to stop at, and the target and the content's
// size follow after "--".
const helperEnv = "MESHFOLD_ATOMICFILE_WRITER"

// TestHelperWriter is not a test: re-executed by TestKilledWriter, it
// writes the target through Write, and at the step named in helperEnv
// says so on stdout and waits (until it is killed, or its stdin closes).
func TestHelperWriter(t *testing.T) {
	stop := os.Getenv(helperEnv)
	if stop == "" {
		t.Skip("a helper process of TestKilledWriter")
	}
	args := os.Args[len(os.Args)-2:]
	hook = func(s string) {
		if s == stop {
			os.Stdout.WriteString("at " + s + "\n")
			_, _ = io.Copy(io.Discard, os.Stdin)
		}
	}
	if err := Write(args[0], newContent(), 0o640); err != nil {
		t.Fatal(err)
	}
}

// newContent is what the killed writer writes: 1 MiB, so a partial file
// would show.
func newContent() []byte { return bytes.Repeat([]byte("new content\n"), 1<<20/12) }

// A writer killed with SIGKILL at any step leaves the target with its old
// content before the rename and its new one after: never empty, never
// partial. What it leaves beside the target is a temporary file IsTemp
// recognises. (A process crash; that the fsyncs make the same true of a
// power loss is not something a test here can show.)
func TestKilledWriter(t *testing.T) {
	old := []byte("old content\n")
	for _, c := range []struct {
		step string
		want []byte
	}{
		{"created", old},
		{"written", old},
		{"synced", old},
		{"renamed", newContent()},
	} {
		t.Run(c.step, func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, "record.json")
			if err := os.WriteFile(target, old, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriter$", "-test.count=1", "--", target, "x")
			cmd.Env = append(os.Environ(), helperEnv+"="+c.step)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			reaped := false
			defer func() {
				if !reaped {
					_ = cmd.Process.Kill() // by pid: the helper this test started
					_ = cmd.Wait()
				}
			}()
			at := make(chan string, 1)
			go func() {
				line, _ := bufio.NewReader(out).ReadString('\n')
				at <- strings.TrimSpace(line)
			}()
			select {
			case got := <-at:
				if got != "at "+c.step {
					t.Fatalf("the writer said %q, want %q; stderr:\n%s", got, "at "+c.step, stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the writer did not reach %s within 30 s", c.step)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			reaped = true
			got, err := os.ReadFile(target)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Fatalf("after a kill at %s the target holds %d bytes (%.20q…), want %d", c.step, len(got), got, len(c.want))
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if e.Name() != "record.json" && !IsTemp(e.Name(), "record.json") {
					t.Errorf("left beside the target: %s, not a temporary file", e.Name())
				}
			}
		})
	}
}

// Write replaces the content and sets the mode, umask or not; a symlink
// at the target is replaced, not followed; nothing is left beside it.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for _, c := range []struct {
		data string
		perm fs.FileMode
	}{{"one", 0o600}, {"two, longer", 0o644}, {"", 0o640 | fs.ModeSetgid}} {
		if err := Write(p, []byte(c.data), c.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != c.data {
			t.Fatalf("content %q, %v; want %q", got, err, c.data)
		}
		fi, err := os.Stat(p)
		if err != nil || fi.Mode() != c.perm {
			t.Fatalf("mode %v, %v; want %v", fi.Mode(), err, c.perm)
		}
	}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := Write(link, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(outside); string(got) != "keep" {
		t.Errorf("the symlink's target was written: %q", got)
	}
	if fi, err := os.Lstat(link); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the symlink was not replaced by a file: %v, %v", fi, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("directory holds %d entries, want f and link", len(ents))
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
}

// Create writes a file once: a second create fails with fs.ErrExist and
// leaves the first content, and leaves no temporary file.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := Create(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v, want fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "first" {
		t.Errorf("content %q, want first", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries, want the key alone", len(ents))
	}
}

// WriteIn writes a single name in its Dir: a name with a "/" (or "..")
// is refused, prepare runs on the temporary file, and its error is
// returned as it is.
func TestWriteIn(t *testing.T) {
	base := t.TempDir()
	inner := filepath.Join(base, "root")
	if err := os.MkdirAll(filepath.Join(inner, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(filepath.Join(inner, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	dir := rootDir{root}
	for _, name := range []string{"../escape", "sub/f", "..", "."} {
		if err := WriteIn(dir, name, []byte("x"), 0o600, nil); err == nil {
			t.Errorf("%s: written, not refused", name)
		}
	}
	if _, err := os.Stat(filepath.Join(inner, "escape")); err == nil {
		t.Error("a file appeared outside the directory")
	}
	var seen string
	if err := WriteIn(dir, "app.conf", []byte("x"), 0o640, func(f *os.File) error {
		seen = f.Name()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !IsTemp(filepath.Base(seen), "app.conf") {
		t.Errorf("prepare saw %q, not a temporary file of app.conf", seen)
	}
	boom := errors.New("boom")
	if err := WriteIn(dir, "other", []byte("x"), 0o600, func(*os.File) error { return boom }); err != boom {
		t.Errorf("prepare's error came back as %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(inner, "etc")); len(ents) != 1 {
		t.Errorf("etc holds %d entries, want app.conf alone", len(ents))
	}
}

// PlaceTree moves a tree whole, symlinks as they are, and refuses to
// replace a non-empty directory.
func TestPlaceTree(t *testing.T) {
	base := t.TempDir()
	tmp := filepath.Join(base, ".unpack")
	if err := os.MkdirAll(filepath.Join(tmp, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "bin", "run"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nonexistent", filepath.Join(tmp, "dangling")); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "bundle")
	if err := PlaceTree(tmp, target); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "bin", "run")); err != nil || string(got) != "#!/bin/sh\n" {
		t.Fatalf("placed file: %q, %v", got, err)
	}
	if _, err := os.Lstat(tmp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the temporary tree is still there: %v", err)
	}
	again := filepath.Join(base, ".again")
	if err := os.Mkdir(again, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PlaceTree(again, target); err == nil {
		t.Error("a tree replaced a non-empty directory")
	}
}

// BenchmarkWrite is the cost of one durable write of a small record (a
// spec.json's size), against os.WriteFile and a rename without fsyncs,
// what the process runtime did before. Run it on the file system that
// matters: TMPDIR decides.
func BenchmarkWrite(b *testing.B) {
	data := bytes.Repeat([]byte("x"), 300)
	dir := b.TempDir()
	p := filepath.Join(dir, "spec.json")
	b.Run("atomicfile", func(b *testing.B) {
		for b.Loop() {
			if err := Write(p, data, 0o600); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rename-no-fsync", func(b *testing.B) {
		tmp := filepath.Join(dir, ".spec.json.tmp")
		for b.Loop() {
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				b.Fatal(err)
			}
			if err := os.Rename(tmp, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
