package saferoot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNotFollowed matches the error of a walk that met a symlink in a
// directory someone other than root (or the writer) could have written:
// a [*LinkError].
var ErrNotFollowed = errors.New("saferoot: symlink not followed")

// ErrEscapes matches the error of a walk whose ".." or absolute symlink
// target leads out of the root.
var ErrEscapes = errors.New("saferoot: path escapes the root")

// maxLinks bounds the symlinks one walk follows (Linux's MAXSYMLINKS);
// past it the walk fails with ELOOP.
const maxLinks = 40

// maxDepth bounds the directories one walk holds open at once; past it
// the walk fails with ENAMETOOLONG.
const maxDepth = 256

// A LinkError is a symlink a walk did not follow: Component, met in the
// directory Dir (a path under the root, "/" for the root itself), is a
// symlink, and Dir is owned by UID with permission bits Mode, so that
// someone other than root could have written it. It matches
// [ErrNotFollowed].
type LinkError struct {
	Component string
	Dir       string
	UID       uint32
	Mode      fs.FileMode
}

func (e *LinkError) Error() string {
	by := fmt.Sprintf("uid %d", e.UID)
	if e.UID == 0 || e.UID == uint32(os.Geteuid()) {
		by = fmt.Sprintf("group or others (mode %04o)", uint32(e.Mode.Perm())|sticky(e.Mode))
	}
	return fmt.Sprintf("component %q is a symlink in a directory writable by %s: not followed", e.Component, by)
}

// Is reports whether target is ErrNotFollowed.
func (e *LinkError) Is(target error) bool { return target == ErrNotFollowed }

func sticky(m fs.FileMode) uint32 {
	if m&fs.ModeSticky != 0 {
		return 0o1000
	}
	return 0
}

// A Root is a directory held open that paths are resolved under. It is
// safe for concurrent use; Close it when done.
type Root struct {
	fd   int
	host string // the root's path on the host, symlinks resolved: "/" for "--root /"
	uid  uint32 // the writer's effective uid, trusted as root is
}

// Open opens dir as a Root. dir itself is opened as given, symlinks
// followed: the operator names it.
//
// Errors: dir cannot be resolved or opened, or is not a directory.
func Open(dir string) (*Root, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &Root{fd: fd, host: abs, uid: uint32(os.Geteuid())}, nil
}

// Close closes the root. Dirs it returned stay usable until closed.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Parent resolves the directory holding name, a slash-separated path
// relative to the root (a leading "/" is ignored), and returns it held
// open with name's last element. With create, missing directories are
// made 0755 (less the umask). The last element itself is not looked at.
//
// Errors: a [*LinkError] (ErrNotFollowed) for a symlink in a directory
// others than root could write; ErrEscapes; a component that is not a
// directory (ENOTDIR), missing (fs.ErrNotExist, without create), or a
// loop (ELOOP); the system's error otherwise, as an *fs.PathError naming
// the directory under the root.
func (r *Root) Parent(name string, create bool) (*Dir, string, error) {
	name = strings.Trim(name, "/")
	dir, base := path.Split(name)
	if base == "" || base == "." || base == ".." {
		return nil, "", &fs.PathError{Op: "resolve", Path: "/" + name, Err: fs.ErrInvalid}
	}
	d, err := r.walk(dir, create)
	if err != nil {
		return nil, "", err
	}
	return d, base, nil
}

// held is a directory a walk holds open, with its path under the root.
type held struct {
	fd   int
	name string
}

// walk opens the directory dir under the root, component by component
// (see Parent).
func (r *Root) walk(dir string, create bool) (_ *Dir, err error) {
	start, err := unix.Dup(r.fd)
	if err != nil {
		return nil, &fs.PathError{Op: "dup", Path: "/", Err: err}
	}
	unix.CloseOnExec(start)
	stack := []held{{start, "/"}}
	defer func() {
		// Every directory but the one returned is closed.
		last := len(stack) - 1
		if err != nil {
			last = len(stack)
		}
		for _, h := range stack[:last] {
			_ = unix.Close(h.fd)
		}
	}()
	pending := split(dir)
	links := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		top := stack[len(stack)-1]
		switch c {
		case ".":
			continue
		case "..":
			if len(stack) == 1 {
				if r.host == "/" {
					continue // the kernel's "/.." is "/"
				}
				return nil, fmt.Errorf("%q under %s: %w", "..", top.name, ErrEscapes)
			}
			_ = unix.Close(top.fd)
			stack = stack[:len(stack)-1]
			continue
		}
		if len(stack) > maxDepth {
			return nil, &fs.PathError{Op: "openat", Path: top.name, Err: unix.ENAMETOOLONG}
		}
		sub := path.Join(top.name, c)
		fd, err := openDir(top.fd, c)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(top.fd, c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				fd, err = openDir(top.fd, c)
			}
		}
		if err == nil {
			stack = append(stack, held{fd, sub})
			continue
		}
		if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
			return nil, &fs.PathError{Op: "openat", Path: sub, Err: err}
		}
		// O_NOFOLLOW refuses a symlink (ELOOP; some systems say ENOTDIR
		// with O_DIRECTORY): is it one, and may it be followed?
		var st unix.Stat_t
		if serr := unix.Fstatat(top.fd, c, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil {
			return nil, &fs.PathError{Op: "fstatat", Path: sub, Err: serr}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return nil, &fs.PathError{Op: "openat", Path: sub, Err: unix.ENOTDIR}
		}
		if links++; links > maxLinks {
			return nil, &fs.PathError{Op: "openat", Path: sub, Err: unix.ELOOP}
		}
		if err := r.mayFollow(top, c); err != nil {
			return nil, err
		}
		// Only root (or the writer) can change the link now: the
		// directory holding it is theirs alone.
		target, err := readlinkat(top.fd, c)
		if err != nil {
			return nil, &fs.PathError{Op: "readlinkat", Path: sub, Err: err}
		}
		if strings.HasPrefix(target, "/") {
			rest, ok := r.under(target)
			if !ok {
				return nil, fmt.Errorf("symlink %s -> %s: %w", sub, target, ErrEscapes)
			}
			for _, h := range stack[1:] {
				_ = unix.Close(h.fd)
			}
			stack = stack[:1]
			target = rest
		}
		pending = append(split(target), pending...)
	}
	top := stack[len(stack)-1]
	return &Dir{fd: top.fd, name: top.name}, nil
}

// mayFollow returns nil when the directory h, holding the symlink c,
// could not have been written by anyone but root or the writer: owned by
// one of them, and not writable by group or others.
func (r *Root) mayFollow(h held, c string) error {
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: h.name, Err: err}
	}
	if (st.Uid == 0 || st.Uid == r.uid) && st.Mode&0o022 == 0 {
		return nil
	}
	return &LinkError{Component: c, Dir: h.name, UID: st.Uid, Mode: fileMode(uint32(st.Mode))}
}

// under returns the absolute host path p relative to the root, and
// whether it is inside it.
func (r *Root) under(p string) (string, bool) {
	p = path.Clean(p)
	if r.host == "/" {
		return strings.TrimPrefix(p, "/"), true
	}
	if p == r.host {
		return "", true
	}
	rest, ok := strings.CutPrefix(p, r.host+"/")
	return rest, ok
}

// split returns p's components, empty ones dropped.
func split(p string) []string {
	var out []string
	for c := range strings.SplitSeq(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// openDir opens the directory name in dirfd, never following a symlink.
func openDir(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// readlinkat returns the target of the symlink name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size >= 1<<16 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// A Dir is a directory a [Root] resolved, held open. Every method takes
// a single name in it (no "/") and never follows a symlink at that name.
// Close it when done.
type Dir struct {
	fd   int
	name string // its path under the root, "/"-rooted
}

// Name is the directory's path under the root ("/srv/nb"), for messages.
func (d *Dir) Name() string { return d.name }

// Close closes the directory.
func (d *Dir) Close() error { return unix.Close(d.fd) }

func (d *Dir) err(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: path.Join(d.name, name), Err: err}
}

// check refuses a name that is not a single element.
func (d *Dir) check(op, name string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return d.err(op, name, fs.ErrInvalid)
	}
	return nil
}

// OpenFile opens name in d with flag (os.O_* values) and, when it
// creates the file, perm; O_NOFOLLOW is added, so a symlink at name fails
// (ELOOP) rather than being followed. The *os.File is named by its path
// under the root.
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if err := d.check("openat", name); err != nil {
		return nil, err
	}
	for {
		fd, err := unix.Openat(d.fd, name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, d.err("openat", name, err)
		}
		return os.NewFile(uintptr(fd), path.Join(d.name, name)), nil
	}
}

// Lstat describes name in d itself, a symlink as a symlink. Its Sys is a
// *unix.Stat_t.
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	if err := d.check("fstatat", name); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, d.err("fstatat", name, err)
	}
	return &fileInfo{name: name, st: st}, nil
}

// Rename renames oldname to newname, both in d (renameat): whatever is
// at newname, a symlink included, is replaced, not followed.
func (d *Dir) Rename(oldname, newname string) error {
	if err := d.check("renameat", oldname); err != nil {
		return err
	}
	if err := d.check("renameat", newname); err != nil {
		return err
	}
	if err := unix.Renameat(d.fd, oldname, d.fd, newname); err != nil {
		return d.err("renameat", newname, err)
	}
	return nil
}

// Link makes newname a hard link to oldname, both in d (linkat, a symlink
// at oldname linked as itself); an existing newname fails (EEXIST).
func (d *Dir) Link(oldname, newname string) error {
	if err := d.check("linkat", oldname); err != nil {
		return err
	}
	if err := d.check("linkat", newname); err != nil {
		return err
	}
	if err := unix.Linkat(d.fd, oldname, d.fd, newname, 0); err != nil {
		return d.err("linkat", newname, err)
	}
	return nil
}

// Remove removes the name (unlinkat): a file or a symlink, never a
// directory (EISDIR, or EPERM on some systems), never what a symlink
// points to.
func (d *Dir) Remove(name string) error {
	if err := d.check("unlinkat", name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, 0); err != nil {
		return d.err("unlinkat", name, err)
	}
	return nil
}

// Sync flushes the directory's entries to disk (fsync).
func (d *Dir) Sync() error {
	if err := unix.Fsync(d.fd); err != nil {
		return &fs.PathError{Op: "fsync", Path: d.name, Err: err}
	}
	return nil
}

// Names returns the names of d's entries, in directory order.
func (d *Dir) Names() ([]string, error) {
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "openat", Path: d.name, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.name)
	defer f.Close()
	return f.Readdirnames(-1)
}

// fileInfo is an fs.FileInfo of a fstatat.
type fileInfo struct {
	name string
	st   unix.Stat_t
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.st.Size }
func (fi *fileInfo) Mode() fs.FileMode  { return fileMode(uint32(fi.st.Mode)) }
func (fi *fileInfo) ModTime() time.Time { return time.Unix(fi.st.Mtim.Unix()) }
func (fi *fileInfo) IsDir() bool        { return fi.Mode().IsDir() }
func (fi *fileInfo) Sys() any           { return &fi.st }

// fileMode converts a stat mode to an fs.FileMode, as package os does.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
