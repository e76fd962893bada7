package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
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
	return inDir(path, func(root *os.Root, base string) error {
		return WriteIn(root, base, data, perm, nil)
	})
}

// Create is [Write] of a file written once: it fails, leaving the file
// alone, with an error matching fs.ErrExist when path exists. Two
// processes creating path at once: one wins, the other gets fs.ErrExist
// and may read the winner's complete content.
func Create(path string, data []byte, perm fs.FileMode) error {
	return inDir(path, func(root *os.Root, base string) error {
		return write(root, base, data, perm, nil, false)
	})
}

// WriteIn is [Write] of name under root: every component of name is
// resolved through root, so a name that escapes it (by "..", or a
// symlink pointing outside) fails. prepare, when not nil, runs on the
// temporary file after the data is written and before its mode is set
// (a chown, say: after it, fchmod restores set-id bits a chown clears);
// its error is returned as it is.
func WriteIn(root *os.Root, name string, data []byte, perm fs.FileMode, prepare func(*os.File) error) error {
	return write(root, name, data, perm, prepare, true)
}

// inDir opens path's directory as a root and calls f with its base name.
func inDir(p string, f func(root *os.Root, base string) error) error {
	root, err := os.OpenRoot(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer root.Close()
	return f(root, filepath.Base(p))
}

// hook, when set (by this package's tests), is called after each step
// of a write, named.
var hook func(step string)

func step(name string) {
	if hook != nil {
		hook(name)
	}
}

func write(root *os.Root, name string, data []byte, perm fs.FileMode, prepare func(*os.File) error, replace bool) error {
	name = filepath.ToSlash(name)
	dir, base := path.Dir(name), path.Base(name)
	var rnd [tempHex / 2]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(dir, "."+base+tempInfix+hex.EncodeToString(rnd[:]))
	// 0600 until the end: a secret is never readable by others on the way.
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	placed := false
	defer func() {
		if !placed {
			_ = f.Close()
			_ = root.Remove(tmp)
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
		if err := root.Rename(tmp, name); err != nil {
			return fmt.Errorf("rename into place: %w", err)
		}
	} else {
		err := root.Link(tmp, name)
		_ = root.Remove(tmp)
		if err != nil {
			return fmt.Errorf("link into place: %w", err)
		}
	}
	placed = true
	step("renamed")
	d, err := root.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory for fsync: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory: %w", err)
	}
	return nil
}
