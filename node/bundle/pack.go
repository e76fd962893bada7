package bundle

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Limits of a bundle, checked when packing and again when unpacking a
// fetched one (a bundle in the bucket may not come from Pack).
const (
	// MaxSize bounds a bundle's tar.gz bytes: what a node downloads.
	MaxSize = 1 << 30
	// MaxUnpacked bounds the bytes of a bundle's files once unpacked, so a
	// small gzip bomb cannot fill the node's disk.
	MaxUnpacked = 4 << 30
	// MaxEntries bounds the entries of a bundle.
	MaxEntries = 100_000
)

// ErrPack matches every error of [Pack] about its input (not a regular
// file or directory, not executable, no manifest, a device file, a link
// out of the bundle).
var ErrPack = errors.New("bundle: cannot pack")

// epoch is every entry's modification time: the same content packs to the
// same bytes whenever and wherever it is packed.
var epoch = time.Unix(0, 0).UTC()

// Packed is what [Pack] made.
type Packed struct {
	// Build is "sha256:<hex>" of the tar.gz bytes written.
	Build string
	// Size is the count of tar.gz bytes written.
	Size int64
	// Manifest is the bundle's manifest, validated.
	Manifest Manifest
	// Generated is true when Pack made the manifest (an executable alone).
	Generated bool
}

// Pack writes the bundle of src to w as a deterministic tar.gz and
// returns its build. src is either
//
//   - an executable file: the bundle holds it under its base name and a
//     generated manifest whose command runs it with no arguments; or
//   - a directory with a meshfold.json at its top: the bundle holds the
//     directory's tree, after the manifest is validated (a relative
//     command[0] must name an executable regular file of the tree).
//
// Entries are in the tree's lexical walk order with fixed times (the Unix
// epoch), owners (0, no names) and modes (directories 0755, files 0755 when
// any execute bit is set, else 0644), and the gzip header carries no name
// or time: the same content always gives the same build. A directory may
// hold symbolic links only when they are relative and stay inside it;
// devices, sockets and pipes are refused.
//
// Errors: ErrPack (wrapped, naming the path) for an unfit src; a
// *ManifestError (ErrInvalidManifest) for a bad manifest; w's error.
// Nothing is written to w before the manifest is valid.
func Pack(src string, w io.Writer) (Packed, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return Packed{}, fmt.Errorf("%w: %v", ErrPack, err)
	}
	switch {
	case fi.Mode().IsRegular():
		return packExecutable(src, fi, w)
	case fi.IsDir():
		return packDir(src, w)
	}
	return Packed{}, fmt.Errorf("%w: %s is neither a regular file nor a directory", ErrPack, src)
}

// packer writes tar entries through gzip, hashing and counting the bytes.
type packer struct {
	out   *countWriter
	gz    *gzip.Writer
	tw    *tar.Writer
	sum   hash.Hash
	count int
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func newPacker(w io.Writer) *packer {
	h := sha256.New()
	out := &countWriter{w: io.MultiWriter(w, h)}
	gz, _ := gzip.NewWriterLevel(out, gzip.BestCompression) // a valid level: no error
	return &packer{out: out, gz: gz, tw: tar.NewWriter(gz), sum: h}
}

func (p *packer) header(name string, typ byte, mode int64, size int64, link string) error {
	p.count++
	if p.count > MaxEntries {
		return fmt.Errorf("%w: more than %d entries", ErrPack, MaxEntries)
	}
	return p.tw.WriteHeader(&tar.Header{Typeflag: typ, Name: name, Linkname: link, Mode: mode, Size: size,
		ModTime: epoch, Format: tar.FormatPAX})
}

func (p *packer) file(name string, mode int64, data io.Reader, size int64) error {
	if err := p.header(name, tar.TypeReg, mode, size, ""); err != nil {
		return err
	}
	n, err := io.Copy(p.tw, data)
	if err == nil && n != size {
		err = fmt.Errorf("%w: %s changed size while packing", ErrPack, name)
	}
	return err
}

func (p *packer) close(m Manifest, generated bool) (Packed, error) {
	if err := p.tw.Close(); err != nil {
		return Packed{}, err
	}
	if err := p.gz.Close(); err != nil {
		return Packed{}, err
	}
	if p.out.n > MaxSize {
		return Packed{}, fmt.Errorf("%w: %d bytes, more than the %d a bundle may have", ErrPack, p.out.n, MaxSize)
	}
	return Packed{Build: buildOfHash(p.sum), Size: p.out.n, Manifest: m, Generated: generated}, nil
}

func fileMode(m fs.FileMode) int64 {
	if m&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

func packExecutable(src string, fi fs.FileInfo, w io.Writer) (Packed, error) {
	if fi.Mode()&0o111 == 0 {
		return Packed{}, fmt.Errorf("%w: %s is not executable: chmod +x it, or pack a directory with a %s", ErrPack, src, ManifestName)
	}
	name := fi.Name()
	if name == ManifestName {
		return Packed{}, fmt.Errorf("%w: an executable may not be named %s", ErrPack, ManifestName)
	}
	m := Manifest{Command: []string{name}}
	if err := m.Validate(); err != nil {
		return Packed{}, err
	}
	mdata, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Packed{}, err
	}
	mdata = append(mdata, '\n')
	f, err := os.Open(src)
	if err != nil {
		return Packed{}, fmt.Errorf("%w: %v", ErrPack, err)
	}
	defer f.Close()
	p := newPacker(w)
	entries := []struct {
		name string
		mode int64
		r    io.Reader
		size int64
	}{{ManifestName, 0o644, strings.NewReader(string(mdata)), int64(len(mdata))}, {name, 0o755, f, fi.Size()}}
	if name < ManifestName {
		entries[0], entries[1] = entries[1], entries[0]
	}
	for _, e := range entries {
		if err := p.file(e.name, e.mode, e.r, e.size); err != nil {
			return Packed{}, err
		}
	}
	return p.close(m, true)
}

func packDir(src string, w io.Writer) (Packed, error) {
	root, err := os.OpenRoot(src)
	if err != nil {
		return Packed{}, fmt.Errorf("%w: %v", ErrPack, err)
	}
	defer root.Close()
	mi, err := root.Lstat(ManifestName)
	if err != nil || !mi.Mode().IsRegular() {
		return Packed{}, fmt.Errorf("%w: %s has no %s at its top (a regular file): write one, or push an executable", ErrPack, src, ManifestName)
	}
	mdata, err := root.ReadFile(ManifestName)
	if err != nil {
		return Packed{}, fmt.Errorf("%w: %v", ErrPack, err)
	}
	m, err := ParseManifest(mdata)
	if err != nil {
		return Packed{}, err
	}
	// Walk once to check every entry and the command before writing.
	type entry struct {
		name string
		info fs.FileInfo
		link string
	}
	var all []entry
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPack, err)
		}
		if name == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPack, err)
		}
		e := entry{name: name, info: info}
		switch t := info.Mode().Type(); {
		case t == 0, t == fs.ModeDir:
		case t == fs.ModeSymlink:
			if e.link, err = root.Readlink(filepath.FromSlash(name)); err != nil {
				return fmt.Errorf("%w: %v", ErrPack, err)
			}
			if !linkInside(name, e.link) {
				return fmt.Errorf("%w: %s/%s links to %q, out of the bundle: only relative links that stay inside are packed", ErrPack, src, name, e.link)
			}
		default:
			return fmt.Errorf("%w: %s/%s is a %s: a bundle holds only directories, regular files and links", ErrPack, src, name, kindOf(t))
		}
		all = append(all, e)
		if len(all) > MaxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrPack, MaxEntries)
		}
		return nil
	})
	if err != nil {
		return Packed{}, err
	}
	if err := checkCommand(m, func(name string) (fs.FileMode, bool) {
		for _, e := range all {
			if e.name == name {
				return e.info.Mode(), true
			}
		}
		return 0, false
	}); err != nil {
		return Packed{}, err
	}
	p := newPacker(w)
	for _, e := range all {
		var err error
		switch t := e.info.Mode().Type(); t {
		case fs.ModeDir:
			err = p.header(e.name+"/", tar.TypeDir, 0o755, 0, "")
		case fs.ModeSymlink:
			err = p.header(e.name, tar.TypeSymlink, 0o777, 0, e.link)
		default:
			var f *os.File
			if f, err = root.Open(filepath.FromSlash(e.name)); err != nil {
				return Packed{}, fmt.Errorf("%w: %v", ErrPack, err)
			}
			err = p.file(e.name, fileMode(e.info.Mode()), f, e.info.Size())
			f.Close()
		}
		if err != nil {
			return Packed{}, err
		}
	}
	return p.close(m, false)
}

// checkCommand checks that a relative command[0] names an executable
// regular file (or a link) of the bundle; lookup gives an entry's mode.
func checkCommand(m Manifest, lookup func(name string) (fs.FileMode, bool)) error {
	c := m.Command[0]
	if strings.HasPrefix(c, "/") {
		return nil
	}
	name := path.Clean(c)
	mode, ok := lookup(name)
	switch {
	case !ok:
		return &ManifestError{Field: "command[0]", Reason: fmt.Sprintf("%q is not in the bundle", clip(c))}
	case mode.Type() == fs.ModeSymlink:
	case !mode.IsRegular():
		return &ManifestError{Field: "command[0]", Reason: fmt.Sprintf("%q is not a regular file", clip(c))}
	case mode&0o111 == 0:
		return &ManifestError{Field: "command[0]", Reason: fmt.Sprintf("%q is not executable", clip(c))}
	}
	return nil
}

// linkInside reports whether a link at name (slash-separated, relative to
// the bundle's top) with target stays inside the bundle: the target is
// relative, its ".." components all come first (so a ".." never climbs
// out of another link's target, as "l/../.." would when l is itself a
// link to ".."), and it does not climb above the top. With no entry under
// a link (Unpack refuses those), every link then resolves inside.
func linkInside(name, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.ContainsRune(target, 0) {
		return false
	}
	leading := true
	for _, part := range strings.Split(target, "/") {
		if part == ".." {
			if !leading {
				return false
			}
			continue
		}
		leading = false
	}
	j := path.Join(path.Dir(name), target)
	return j != ".." && !strings.HasPrefix(j, "../")
}

func kindOf(t fs.FileMode) string {
	switch {
	case t&fs.ModeDevice != 0:
		return "device"
	case t&fs.ModeNamedPipe != 0:
		return "named pipe"
	case t&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}
