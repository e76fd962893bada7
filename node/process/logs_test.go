package process

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
)

func TestReadLogTailCursorRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, logFile)
	write := func(s string) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	page, err := readLog(path, node.LogQuery{Tail: 2})
	if err != nil || len(page.Lines) != 0 {
		t.Fatalf("no file yet: %+v, %v", page, err)
	}
	write("one\ntwo\nthree\npart")
	page, err = readLog(path, node.LogQuery{Tail: 2})
	if err != nil || strings.Join(page.Lines, "|") != "two|three" {
		t.Fatalf("tail 2: %+v, %v; want two|three (a partial last line waits)", page, err)
	}
	cur := page.Cursor
	page, _ = readLog(path, node.LogQuery{Cursor: cur})
	if len(page.Lines) != 0 || page.Cursor != cur {
		t.Fatalf("nothing new: %+v", page)
	}
	write("ial\nfour\n")
	page, _ = readLog(path, node.LogQuery{Cursor: cur})
	if strings.Join(page.Lines, "|") != "partial|four" {
		t.Fatalf("after the cursor: %+v, want partial|four", page)
	}
	// Rotated: a new file at the path; the cursor's inode is gone, so the
	// page starts at the new file's beginning.
	if err := os.Rename(path, filepath.Join(dir, "module-old.log")); err != nil {
		t.Fatal(err)
	}
	write("five\n")
	page, _ = readLog(path, node.LogQuery{Cursor: page.Cursor})
	if strings.Join(page.Lines, "|") != "five" {
		t.Fatalf("after rotation: %+v, want five", page)
	}
}

// A follow that began before the module wrote anything reads its output
// from the first line, however much came before the follow's next read:
// it used to start half a page before the end, as a tail would, and
// `meshfold logs -f` lost the module's first 752 lines.
func TestFollowBeforeAnyOutput(t *testing.T) {
	e := newEnv(t, Backoff{Initial: time.Hour})
	flag := filepath.Join(t.TempDir(), "go")
	openUp(t, filepath.Dir(flag))
	// 20,000 lines, tagged, are several pages: far over the half page a
	// tail would start at.
	e.script("sha256:a", `while [ ! -e `+flag+` ]; do sleep 0.01; done; seq 1 20000; exec sleep 3600`, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "late", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	// `meshfold logs -f --tail 100`'s first request: nothing yet.
	page, err := r.Logs(ctx(t), "late", node.LogQuery{Tail: 100})
	if err != nil || len(page.Lines) != 0 {
		t.Fatalf("before any output: %q, %v; want no line", page.Lines, err)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitLog(t, r, "late", "20000")
	var got []string
	q := node.LogQuery{Cursor: page.Cursor, WaitMS: 1000}
	for len(got) < 20000 {
		page, err := r.Logs(ctx(t), "late", q)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Lines) == 0 {
			break
		}
		got = append(got, page.Lines...)
		q = node.LogQuery{Cursor: page.Cursor, WaitMS: 1000}
	}
	if len(got) != 20000 || got[0] != "1" || got[19999] != "20000" {
		first := ""
		if len(got) > 0 {
			first = got[0]
		}
		t.Fatalf("the follow read %d lines, first %q: want 1 to 20000", len(got), first)
	}
}

// readAll reads a module's whole kept log through Logs, page by page, as
// `meshfold logs --tail <more than it holds>` does, and returns the
// module's stdout lines.
func readAll(t *testing.T, r *Runtime, module string) (out []string, stderr []string, pages int) {
	t.Helper()
	q := node.LogQuery{Tail: 10_000_000}
	for {
		page, err := r.Logs(ctx(t), module, q)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Tags) != len(page.Lines) {
			t.Fatalf("page of %d lines with %d tags", len(page.Lines), len(page.Tags))
		}
		for i, l := range page.Lines {
			switch page.Tags[i].Stream {
			case streamOut:
				out = append(out, l)
			case streamErr:
				stderr = append(stderr, l)
			}
		}
		if !page.More {
			return out, stderr, pages
		}
		q = node.LogQuery{Cursor: page.Cursor}
	}
}

// A module writes 200,000 numbered lines across rotations: the reader
// returns every line the rotation keeps, in order, none twice; with
// fewer files kept, an unbroken run that ends at the last line.
func TestLogsAcrossRotations(t *testing.T) {
	const n = 200_000
	for _, tc := range []struct {
		name    string
		backups int
		all     bool
	}{{"all kept", 12, true}, {"oldest dropped", 2, false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Backoff{Initial: time.Hour})
			e.cfg.LogMaxMB, e.cfg.LogBackups = 1, tc.backups
			e.script("sha256:a", `i=1; while [ $i -le `+strconv.Itoa(n)+` ]; do echo $i; i=$((i+1)); done; echo "to stderr" >&2`, bundle.Manifest{})
			r := e.open()
			if err := r.Apply(ctx(t), events.PlanModule{Name: "count", Build: "sha256:a", RunsAs: self}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, r, "the module's exit", func() bool { return status(t, r, "count").State == events.Failed })
			// The shim notes the exit once the run's output is all in.
			waitLog(t, r, "count", "meshfold: exited: status 0; next start in 1h0m0s")
			files, _ := filepath.Glob(filepath.Join(e.cfg.StateDir, "process", "count", "module*.log"))
			if len(files) < 3 {
				t.Fatalf("%d log files: the test wants rotations", len(files))
			}
			began := time.Now()
			lines, stderr, pages := readAll(t, r, "count")
			if !slices.Equal(stderr, []string{"to stderr"}) {
				t.Errorf("stderr's lines %q, want the one, tagged err", stderr)
			}
			t.Logf("%d files, %d lines read in %d pages, %s", len(files), len(lines), pages, time.Since(began).Round(time.Millisecond))
			if len(lines) == 0 || lines[len(lines)-1] != strconv.Itoa(n) {
				t.Fatalf("the last line read is not %d (%d lines read)", n, len(lines))
			}
			first, err := strconv.Atoi(lines[0])
			if err != nil {
				t.Fatal(err)
			}
			for i, l := range lines {
				if l != strconv.Itoa(first+i) {
					t.Fatalf("line %d is %q, want %d: out of order, missing or twice", i, l, first+i)
				}
			}
			if tc.all && first != 1 {
				t.Errorf("first line %d, want 1: every file is kept", first)
			}
			if !tc.all && first == 1 {
				t.Errorf("the oldest lines are still read: the test wants a dropped file")
			}
			// The tail ends with the shim's note of the exit, after the
			// module's last lines.
			page, err := r.Logs(ctx(t), "count", node.LogQuery{Tail: 3})
			if err != nil || len(page.Lines) != 3 || page.Lines[2] != "meshfold: exited: status 0; next start in 1h0m0s" || page.Tags[2].Stream != streamShim {
				t.Fatalf("tail 3: %q %+v, %v", page.Lines, page.Tags, err)
			}
			// --since the last line's time starts at it.
			last := page.Tags[2].At
			page, err = r.Logs(ctx(t), "count", node.LogQuery{Since: last.Format(time.RFC3339Nano)})
			if err != nil || len(page.Lines) == 0 || page.Lines[len(page.Lines)-1] != "meshfold: exited: status 0; next start in 1h0m0s" || page.Tags[0].At.Before(last) {
				t.Errorf("since %s: %q, %v", last, page.Lines, err)
			}
		})
	}
}
