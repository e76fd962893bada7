package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tempInfix separates a target's name from the random suffix of its
// temporary files: .<base>.meshfold-<16 hex digits>.
const tempInfix = ".meshfold-"

// tempHex is the length of a temporary file's random suffix.
const tempHex = 16

// IsTemp reports whether name (a directory entry) is a temporary file of
// a write of base: what a writer killed before its rename leaves beside
// the target, holding all or part of the new content.
func IsTemp(name, base string) bool {
	rest, ok := strings.CutPrefix(name, "."+base+tempInfix)
	return ok && len(rest) == tempHex
}

// Write replaces the file at path with data, mode perm (set with fchmod,
// so the umask does not apply; set-id and sticky bits as os.Chmod takes
// them). A crash at any point leaves path with its old content (or
// missing, if it was) or with data; once Write returns nil, data is on
// disk and so is the name. A symlink at path is replaced, not followed.
// The parent directory must exist.
//
// Errors name the failing step; a failure after the rename (the
// directory's fsync) leaves data in place but perhaps not durable.
func Write(path string, data []byte, perm fs.FileMode) error {
	return inDir(path, func(dir Dir, base string) error {
		return write(dir, base, data, perm, nil, true)
	})
}

// Create is [Write] of a file written once: it fails, leaving the file
// alone, with an error matching fs.ErrExist when path exists. Two
// processes creating path at once: one wins, the other gets fs.ErrExist
// and may read the winner's complete content.
func Create(path string, data []byte, perm fs.FileMode) error {
	return inDir(path, func(dir Dir, base string) error {
		return write(dir, base, data, perm, nil, false)
	})
}

// Dir is a directory held open that [WriteIn] writes in: each method
// takes a single name in it (no "/") and never follows a symlink at that
// name (saferoot.Dir is one). OpenFile is called with O_CREATE|O_EXCL.
type Dir interface {
	OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error)
	Rename(oldname, newname string) error
	Link(oldname, newname string) error
	Remove(name string) error
	Sync() error
}

// WriteIn is [Write] of the file name, a single element, in dir: the
// temporary file is created, renamed over name and, on failure, removed
// through dir, and dir is synced. prepare, when not nil, runs on the
// temporary file after the data is written and before its mode is set
// (a chown, say: after it, fchmod restores set-id bits a chown clears);
// its error is returned as it is.
func WriteIn(dir Dir, name string, data []byte, perm fs.FileMode, prepare func(*os.File) error) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("write %q: not a single name", name)
	}
	return write(dir, name, data, perm, prepare, true)
}

// inDir opens path's directory as a root and calls f with its base name.
func inDir(p string, f func(dir Dir, base string) error) error {
	root, err := os.OpenRoot(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer root.Close()
	return f(rootDir{root}, filepath.Base(p))
}

// rootDir is an os.Root as a Dir: its methods, given a single name, do
// not follow a symlink at it.
type rootDir struct{ *os.Root }

func (d rootDir) Sync() error {
	f, err := d.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// hook, when set (by this package's tests), is called after each step
// of a write, named.
var hook func(step string)

func step(name string) {
	if hook != nil {
		hook(name)
	}
}

func write(dir Dir, base string, data []byte, perm fs.FileMode, prepare func(*os.File) error, replace bool) error {
	var rnd [tempHex / 2]byte
	_, _ = rand.Read(rnd[:])
	tmp := "." + base + tempInfix + hex.EncodeToString(rnd[:])
	// 0600 until the end: a secret is never readable by others on the way.
	f, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	placed := false
	defer func() {
		if !placed {
			_ = f.Close()
			_ = dir.Remove(tmp)
		}
	}()
	step("created")
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	step("written")
	if prepare != nil {
		if err := prepare(f); err != nil {
			return err
		}
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %v: %w", perm, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	step("synced")
	if replace {
		if err := dir.Rename(tmp, base); err != nil {
			return fmt.Errorf("rename into place: %w", err)
		}
	} else {
		err := dir.Link(tmp, base)
		_ = dir.Remove(tmp)
		if err != nil {
			return fmt.Errorf("link into place: %w", err)
		}
	}
	placed = true
	step("renamed")
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("fsync directory: %w", err)
	}
	return nil
}
