package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// PlaceTree moves the directory tree tmp, written whole, to target on
// the same file system: it fsyncs every regular file and directory under
// tmp (symlinks are not followed), renames tmp to target, and fsyncs
// target's parent. A crash leaves target as it was (absent, say) or the
// whole tree, never a name for a tree whose files are still empty.
//
// Errors name the failing step: a file that cannot be opened or synced,
// the rename's (an existing non-empty target), the parent's fsync.
func PlaceTree(tmp, target string) error {
	err := filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() || d.IsDir() {
			return syncPath(p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("fsync the tree: %w", err)
	}
	if err := os.Rename(tmp, target); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	if err := syncPath(filepath.Dir(target)); err != nil {
		return fmt.Errorf("fsync directory: %w", err)
	}
	return nil
}

// syncPath fsyncs the file or directory at p.
func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	serr := f.Sync()
	cerr := f.Close()
	if serr != nil {
		return serr
	}
	return cerr
}
