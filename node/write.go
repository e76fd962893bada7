package node

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
	"github.com/meshfold/meshfold/internal/saferoot"
)

// ReservedDir is the directory under the node's root that belongs to the
// agent (the command line keeps [DirRuntime]'s records there). Fill
// requests for a path inside it are refused as write-failed, and a want
// may not declare one (events.ReservedDir, where the value lives).
const ReservedDir = events.ReservedDir

// errReserved: a fill named a path inside [ReservedDir].
var errReserved = errors.New("path is inside the agent's reserved directory " + ReservedDir)

// writeFile writes data to file.Path under root atomically, through
// atomicfile.WriteIn: a temporary file in the target's directory (created
// 0600), the content, chown to account when the agent runs as root and
// the account exists as a user, chmod to the declared mode, fsync, rename
// over the target, fsync of the directory. The directory is resolved
// once, through root's safe walk (saferoot: a symlink in a directory
// anyone but root could write is not followed, nor one that leads out
// of the root), and every step after it goes through that held
// directory, never by path: a component swapped meanwhile redirects
// nothing, and a symlink at the target is replaced, not followed.
// Missing parent directories are created 0755.
//
// Errors name the declared path and the failing step (a link not
// followed: `component "sub" is a symlink in a directory writable by uid
// 65534: not followed`), never the content.
func writeFile(root *saferoot.Root, file events.File, account string, data []byte) error {
	if !events.ValidPath(file.Path) || !events.ValidMode(file.Mode) {
		return fmt.Errorf("%s: invalid path or mode %q", file.Path, file.Mode)
	}
	if events.InReserved(file.Path) {
		return fmt.Errorf("%s: %w", file.Path, errReserved)
	}
	dir, base, err := root.Parent(file.Path, true)
	if err != nil {
		return fmt.Errorf("%s: %w", file.Path, err)
	}
	defer dir.Close()
	// The rename replaces whatever entry is there, a symlink as itself;
	// a directory cannot be replaced.
	switch fi, err := dir.Lstat(base); {
	case err == nil && fi.IsDir():
		return fmt.Errorf("%s: is a directory", file.Path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w", file.Path, err)
	}

	// After chown, which may clear set-id bits, the mode is set with
	// fchmod (the umask does not apply).
	err = atomicfile.WriteIn(dir, base, data, fileMode(file.Mode), func(f *os.File) error {
		if uid, gid, ok := ownerOf(account); ok {
			if err := f.Chown(uid, gid); err != nil {
				return fmt.Errorf("chown to %s: %w", account, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", file.Path, err)
	}
	return nil
}

// openFilled opens the regular file p (a declared path) under root for
// reading, through root's safe walk and with O_NOFOLLOW|O_NONBLOCK, and
// returns it with its fstat. Anything but a regular file (a symlink, a
// pipe, a device, a directory) is not opened, or is closed again:
// errNotRegular. What is then done to the file is done through the
// descriptor (fchown, fchmod, read), so a name swapped after the check
// redirects nothing.
func openFilled(root *saferoot.Root, p string) (*os.File, fs.FileInfo, error) {
	dir, base, err := root.Parent(p, false)
	if err != nil {
		return nil, nil, err
	}
	defer dir.Close()
	// Looked at first so that no device or pipe is opened at all.
	if fi, err := dir.Lstat(base); err != nil {
		return nil, nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, nil, errNotRegular
	}
	if openFilledHook != nil {
		openFilledHook(dir.Name() + "/" + base)
	}
	f, err := dir.OpenFile(base, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err // a symlink swapped in meanwhile: ELOOP
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = errNotRegular
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// openFilledHook, when set (by this package's tests), is called by
// openFilled between its look at the file and its open, with the path
// under the root: where a swap would land.
var openFilledHook func(path string)

// errNotRegular: a declared path holds something other than a regular
// file.
var errNotRegular = errors.New("not a regular file")

// refitFile gives the file file.Path under root, when it exists as a
// regular file, the owner and mode writeFile would give it now: chown to
// account (when the agent runs as root and the account exists), then
// chmod to the declared mode (chown may clear set-id bits), both through
// a descriptor openFilled opened. Its content is not read. It returns
// whether it changed anything; a missing file, a symlink or anything else
// is left alone. A path the safe walk refuses (a symlink planted on the
// way) and a file with more than one hard link (a change would reach its
// other names: a module account's link to a file of root's) are left
// alone too, and said as an error.
func refitFile(root *saferoot.Root, file events.File, account string) (changed bool, err error) {
	if !events.ValidPath(file.Path) || !events.ValidMode(file.Mode) || events.InReserved(file.Path) {
		return false, nil
	}
	f, fi, err := openFilled(root, file.Path)
	if errors.Is(err, saferoot.ErrNotFollowed) || errors.Is(err, saferoot.ErrEscapes) {
		return false, fmt.Errorf("%s: %w", file.Path, err)
	}
	if err != nil {
		return false, nil
	}
	defer f.Close()
	st, isUnix := fi.Sys().(*syscall.Stat_t)
	if isUnix && st.Nlink > 1 {
		return false, fmt.Errorf("%s: %d hard links: owner and mode not changed, as the change would reach every name", file.Path, st.Nlink)
	}
	if uid, gid, ok := ownerOf(account); ok && isUnix && (int(st.Uid) != uid || int(st.Gid) != gid) {
		if err := f.Chown(uid, gid); err != nil {
			return false, fmt.Errorf("%s: chown to %s: %w", file.Path, account, err)
		}
		changed = true
		if fi, err = f.Stat(); err != nil {
			return changed, nil
		}
	}
	want := fileMode(file.Mode)
	if fi.Mode()&(fs.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != want {
		if err := f.Chmod(want); err != nil {
			return changed, fmt.Errorf("%s: chmod %s: %w", file.Path, file.Mode, err)
		}
		changed = true
	}
	return changed, nil
}

// fileRef names one filled file of a module.
type fileRef struct{ module, path string }

// sameFile reports whether file.Path under root already is what writing
// data (whose keyed digest is sum) would make it: a regular file, not a
// symlink, with the declared mode, owned as writeFile would own it, and
// content of the same HMAC under key, all read through one descriptor
// (openFilled). Any error reading it says no.
func sameFile(root *saferoot.Root, file events.File, account string, key []byte, sum string) bool {
	if !events.ValidPath(file.Path) || !events.ValidMode(file.Mode) || events.InReserved(file.Path) {
		return false
	}
	f, fi, err := openFilled(root, file.Path)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi.Mode()&(fs.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != fileMode(file.Mode) {
		return false
	}
	if uid, gid, ok := ownerOf(account); ok {
		st, isUnix := fi.Sys().(*syscall.Stat_t)
		if !isUnix || int(st.Uid) != uid || int(st.Gid) != gid {
			return false
		}
	}
	m := hmac.New(sha256.New, key)
	if _, err := io.Copy(m, f); err != nil {
		return false
	}
	return hmac.Equal([]byte(hex.EncodeToString(m.Sum(nil))), []byte(sum))
}

// lookFile looks at the declared file p under root (fstatat through the
// safe walk, a symlink at p as itself) and returns nil when something is
// there. A path the walk refuses (a symlink planted in a directory a
// module account can write, or one out of the root) is not the declared
// file: it is gone, an error matching fs.ErrNotExist as well as the
// walk's, so a have reports it missing and the refill that follows is
// refused naming the link.
func lookFile(root *saferoot.Root, p string) error {
	dir, base, err := root.Parent(p, false)
	if errors.Is(err, saferoot.ErrNotFollowed) || errors.Is(err, saferoot.ErrEscapes) {
		return fmt.Errorf("%w: %w", fs.ErrNotExist, err)
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	_, err = dir.Lstat(base)
	return err
}

// removeFile deletes the declared file p under root: unlinkat in its
// directory, resolved through the safe walk, so a symlink at p is
// deleted, not followed, and a directory is not deleted. A missing file
// or directory is an error matching fs.ErrNotExist; a path the walk
// refuses is the walk's error (saferoot.ErrNotFollowed,
// saferoot.ErrEscapes), and nothing is deleted.
func removeFile(root *saferoot.Root, p string) error {
	dir, base, err := root.Parent(p, false)
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Remove(base)
}

// sweepFile deletes the temporary files interrupted writes of the
// declared file p left beside it, in its directory resolved through the
// safe walk, and returns how many. A walk refused deletes nothing.
func sweepFile(root *saferoot.Root, p string) int {
	dir, base, err := root.Parent(p, false)
	if err != nil {
		return 0
	}
	defer dir.Close()
	return removeTemps(dir, base)
}

// removeTemps deletes base's temporary files in dir
// (.<base>.meshfold-<16 hex>, atomicfile.IsTemp) and returns how many.
func removeTemps(dir *saferoot.Dir, base string) int {
	names, _ := dir.Names()
	n := 0
	for _, name := range names {
		if atomicfile.IsTemp(name, base) && dir.Remove(name) == nil {
			n++
		}
	}
	return n
}

// fileMode converts a declared mode ("0640", "4755") to an os.FileMode,
// set-id and sticky bits included.
func fileMode(m events.Mode) os.FileMode {
	p := m.Perm()
	fm := os.FileMode(p & 0o777)
	if p&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if p&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if p&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// ownerOf returns the uid and gid to chown a written file to: only when
// the agent runs as root and account names an existing user.
func ownerOf(account string) (uid, gid int, ok bool) {
	if account == "" || os.Geteuid() != 0 {
		return 0, 0, false
	}
	u, err := user.Lookup(account)
	if err != nil {
		return 0, 0, false
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uid, gid, true
}

// keyFile is the name of the HMAC key in the state directory.
const keyFile = "fill-hmac.key"

// keySize is the HMAC key's length in bytes.
const keySize = 32

// loadKey returns the node's HMAC key from dir/fill-hmac.key, creating dir
// (0700) and the key (32 random bytes, 0600, exclusively and atomically:
// once) when missing.
//
// Errors: the directory or file cannot be created or read; an existing key
// of the wrong size, or readable or writable by group or others.
func loadKey(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	name := dir + string(os.PathSeparator) + keyFile
	// Created whole or not at all (atomicfile.Create): an agent killed
	// while creating it leaves no empty key that would stop every later
	// start.
	if _, err := os.Lstat(name); errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, keySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("hmac key: %w", err)
		}
		err := atomicfile.Create(name, key, 0o600)
		if err == nil {
			return key, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("hmac key %s: %w", name, err)
		}
	}
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("hmac key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("hmac key %s: mode %s: must not be accessible to group or others (chmod 0600)", name, fi.Mode().Perm())
	}
	key, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("hmac key: %w", err)
	}
	if len(key) != keySize {
		return nil, fmt.Errorf("hmac key %s: %d bytes, want %d", name, len(key), keySize)
	}
	return key, nil
}

// digest is the hex HMAC-SHA256 of data under key: what a filled event
// carries instead of the content or a plain hash of it.
func digest(key, data []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(data)
	return hex.EncodeToString(m.Sum(nil))
}

// RefusalID is the deterministic Nats-Msg-Id of a refusal:
// <node>.refusal.<plan>.<first 16 hex digits of HMAC-SHA256(key, module NUL
// path NUL writer)>, key being the node's own HMAC key. A repeat of the
// same refusal (same node, plan, module, path and writer) gets the same
// id, and JetStream drops it within its duplicate window. The HMAC keeps
// the id unguessable: JetStream's dedup is stream-wide, so another node
// that could predict it could publish first and have this refusal dropped.
// A write-failed refusal adds a unique suffix: each failed write is a new
// failure.
func RefusalID(key []byte, node string, plan uint64, module, path, writer string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("refusal\x00"))
	h.Write([]byte(module))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write([]byte(writer))
	return node + ".refusal." + strconv.FormatUint(plan, 10) + "." + hex.EncodeToString(h.Sum(nil))[:16]
}
