package bundle

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// ErrUnsafe matches every entry [Unpack] refuses: a path out of the
// bundle, a link out of it, an entry under a link, a device, a hard link,
// a duplicate, or more than the limits allow.
var ErrUnsafe = errors.New("bundle: unsafe bundle")

// Unpack reads a tar.gz bundle from r into dir, which must exist and be
// empty, and returns its validated manifest. Every entry is created
// through an os.Root on dir, so nothing is written outside it whatever the
// names say; entries are refused (ErrUnsafe) unless they are directories,
// regular files or relative links that stay inside (see [Pack]); modes are
// normalised (0755 directories and executables, 0644 other files: no
// setuid, setgid or sticky bit) and owners are the unpacking process's.
// dir is left partly filled on error: the caller removes it.
//
// Errors: ErrUnsafe (wrapped, naming the entry); a *ManifestError
// (ErrInvalidManifest) for a missing or bad manifest or a command not in
// the bundle; r's or the file system's error.
func Unpack(r io.Reader, dir string) (Manifest, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: not a gzip stream: %v", ErrUnsafe, err)
	}
	defer gz.Close()
	// An os.Root, not internal/saferoot's walk of filled files: dir is a
	// fresh directory the agent made in its own cache (under its state
	// directory), which no module account can write, and every link in
	// it is one this unpack made and checked (the rules above); so a link
	// os.Root follows is the bundle's own, and stays inside it.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Manifest{}, err
	}
	defer root.Close()
	tr := tar.NewReader(gz)
	seen := map[string]fs.FileMode{} // entry → its type and mode, as created
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Manifest{}, fmt.Errorf("%w: %v", ErrUnsafe, err)
		}
		if n >= MaxEntries {
			return Manifest{}, fmt.Errorf("%w: more than %d entries", ErrUnsafe, MaxEntries)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := entryName(h.Name)
		if err != nil {
			return Manifest{}, err
		}
		if name == "." && h.Typeflag == tar.TypeDir {
			continue // "./", as tar -C dir . writes it
		}
		if name == "." {
			return Manifest{}, fmt.Errorf("%w: entry name %q", ErrUnsafe, clip(h.Name))
		}
		if _, dup := seen[name]; dup {
			return Manifest{}, fmt.Errorf("%w: %q appears twice", ErrUnsafe, clip(name))
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if seen[d].Type() == fs.ModeSymlink {
				return Manifest{}, fmt.Errorf("%w: %q is under the link %q", ErrUnsafe, clip(name), clip(d))
			}
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return Manifest{}, err
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return Manifest{}, err
			}
			seen[name] = fs.ModeDir | 0o755
		case tar.TypeReg:
			if h.Size < 0 || total+h.Size > MaxUnpacked {
				return Manifest{}, fmt.Errorf("%w: more than %d bytes unpacked", ErrUnsafe, int64(MaxUnpacked))
			}
			total += h.Size
			mode := fs.FileMode(fileMode(fs.FileMode(h.Mode)))
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return Manifest{}, err
			}
			_, err = io.CopyN(f, tr, h.Size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return Manifest{}, fmt.Errorf("unpack %s: %w", clip(name), err)
			}
			// The umask may have cleared bits of mode; set it exactly.
			if err := root.Chmod(name, mode); err != nil {
				return Manifest{}, err
			}
			seen[name] = mode
		case tar.TypeSymlink:
			if !linkInside(name, h.Linkname) {
				return Manifest{}, fmt.Errorf("%w: %q links to %q, out of the bundle", ErrUnsafe, clip(name), clip(h.Linkname))
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return Manifest{}, err
			}
			seen[name] = fs.ModeSymlink | 0o777
		default:
			return Manifest{}, fmt.Errorf("%w: %q is a %s entry (type %q): a bundle holds only directories, regular files and links",
				ErrUnsafe, clip(name), typeName(h.Typeflag), h.Typeflag)
		}
	}
	// Directories made under a strict umask would keep modules out.
	if err := fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return root.Chmod(name, 0o755)
	}); err != nil {
		return Manifest{}, err
	}
	if seen[ManifestName].Type() != 0 || seen[ManifestName] == 0 {
		return Manifest{}, &ManifestError{Field: ManifestName, Reason: "missing: a bundle has its manifest, a regular file, at its top"}
	}
	data, err := root.ReadFile(ManifestName)
	if err != nil {
		return Manifest{}, err
	}
	m, err := ParseManifest(data)
	if err != nil {
		return Manifest{}, err
	}
	if err := checkCommand(m, func(name string) (fs.FileMode, bool) { mode, ok := seen[name]; return mode, ok }); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// entryName cleans a tar entry's name and refuses one that is absolute,
// empty, climbs out with "..", or holds NUL or a backslash.
func entryName(raw string) (string, error) {
	if raw == "" || strings.HasPrefix(raw, "/") || strings.ContainsAny(raw, "\x00\\") {
		return "", fmt.Errorf("%w: entry name %q", ErrUnsafe, clip(raw))
	}
	for _, part := range strings.Split(strings.TrimSuffix(raw, "/"), "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: entry %q climbs out of the bundle", ErrUnsafe, clip(raw))
		}
	}
	return path.Clean(raw), nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "named pipe"
	}
	return "special"
}
