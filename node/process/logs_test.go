package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/node"
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
