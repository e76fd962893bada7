package bundle

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/meshfold/meshfold/internal/atomicfile"
)

// Source is where a [Cache] fetches bundles from; [Store] is one.
type Source interface {
	// Open returns a reader of the bundle stored under build.
	Open(ctx context.Context, build string) (io.ReadCloser, Info, error)
}

var _ Source = (*Store)(nil)

// Cache keeps fetched bundles unpacked in a directory of the node agent's
// state directory, content-addressed: the bundle of build sha256:<hex> is
// unpacked in <dir>/<hex>, its meshfold.json at the top. Fetch downloads a
// bundle once, checks its SHA-256 against the build before unpacking it,
// unpacks it safely (see [Unpack]) in a temporary directory and renames
// that into place, so a bundle in the cache is always whole and checked.
// GC deletes the bundles no module uses. Safe for concurrent use; one
// fetch runs at a time.
//
// The directory is made mode 0755, and unpacked bundles are readable by
// everyone: modules run as their own accounts and must read and execute
// their bundle. Its parent directories must let those accounts through.
type Cache struct {
	dir string
	src Source
	mu  sync.Mutex
}

// Temporary names in the cache directory start with a dot; a bundle's
// directory never does.
const (
	tmpDownload = ".fetch-"
	tmpUnpack   = ".unpack-"
	tmpRemove   = ".remove-"
)

// NewCache returns a cache in dir (created, mode 0755) fetching from src.
// Leftovers of an interrupted fetch or removal are deleted.
//
// Errors: the file system's.
func NewCache(dir string, src Source) (*Cache, error) {
	if dir == "" {
		return nil, errors.New("bundle: cache directory is required")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("bundle cache: %w", err)
			}
		}
	}
	return &Cache{dir: dir, src: src}, nil
}

// Dir returns the cache's directory.
func (c *Cache) Dir() string { return c.dir }

// Path returns where the bundle of build is (or would be) unpacked.
//
// Errors: ErrNotBundle or ErrBadBuild.
func (c *Cache) Path(build string) (string, error) {
	hexd, err := ParseBuild(build)
	if err != nil {
		return "", err
	}
	return filepath.Join(c.dir, hexd), nil
}

// Fetch returns the directory of build's unpacked bundle and its manifest,
// fetching it first when it is not cached. A fetched bundle's bytes are
// hashed as they are downloaded to a temporary file; only when they match
// the build are they unpacked.
//
// Errors (each naming the build, fit for a settle's error): ErrNotBundle
// for another scheme ("img:…", "src2:…"), ErrBadBuild; ErrNoBucket or
// ErrNotFound from the source (a missing bundle); ErrMismatch (the
// content does not match its build: nothing is unpacked); ErrTooLarge;
// ErrUnsafe or a *ManifestError for a bundle that cannot be unpacked
// safely; ctx's, the source's or the file system's error.
func (c *Cache) Fetch(ctx context.Context, build string) (string, Manifest, error) {
	dir, err := c.Path(build)
	if err != nil {
		return "", Manifest{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, err := readManifest(dir); err == nil {
		return dir, m, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", Manifest{}, fmt.Errorf("cached bundle %s: %w", Short(build), err)
	}
	tmp, err := c.download(ctx, build)
	if err != nil {
		return "", Manifest{}, err
	}
	defer os.Remove(tmp)
	m, err := c.unpack(tmp, dir)
	if err != nil {
		return "", Manifest{}, fmt.Errorf("bundle %s: %w", Short(build), err)
	}
	return dir, m, nil
}

// download copies build's bundle to a temporary file of the cache and
// checks its hash; it returns the file's path.
func (c *Cache) download(ctx context.Context, build string) (string, error) {
	r, _, err := c.src.Open(ctx, build)
	if err != nil {
		return "", err
	}
	defer r.Close()
	f, err := os.CreateTemp(c.dir, tmpDownload)
	if err != nil {
		return "", fmt.Errorf("bundle cache: %w", err)
	}
	h := sha256.New()
	lr := &io.LimitedReader{R: r, N: MaxSize + 1}
	_, err = io.Copy(io.MultiWriter(f, h), lr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		err = fmt.Errorf("fetch %s: %w", Short(build), err)
	case lr.N <= 0:
		err = fmt.Errorf("%w: %s has more than %d bytes", ErrTooLarge, Short(build), MaxSize)
	default:
		if got := buildOfHash(h); got != build {
			err = fmt.Errorf("%w: the bundle stored as %s hashes to %s; refused, not unpacked", ErrMismatch, Short(build), Short(got))
		}
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// unpack unpacks the checked bundle file into a temporary directory and
// places it at dir durably (atomicfile.PlaceTree).
func (c *Cache) unpack(file, dir string) (Manifest, error) {
	tmp := filepath.Join(c.dir, tmpUnpack+randomHex())
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return Manifest{}, err
	}
	f, err := os.Open(file)
	if err != nil {
		os.RemoveAll(tmp)
		return Manifest{}, err
	}
	m, err := Unpack(f, tmp)
	f.Close()
	if err == nil {
		err = os.Chmod(tmp, 0o755)
	}
	if err == nil {
		// Every file synced before the name appears: after a power loss
		// a cached bundle, which is trusted without a second check, is
		// whole or absent.
		err = atomicfile.PlaceTree(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return Manifest{}, err
	}
	return m, nil
}

func readManifest(dir string) (Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return Manifest{}, err
	}
	return ParseManifest(data)
}

// Builds returns the builds cached, sorted.
//
// Errors: the file system's.
func (c *Cache) Builds() ([]string, error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	var out []string
	for _, e := range ents {
		b := BuildScheme + e.Name()
		if _, err := ParseBuild(b); err == nil && e.IsDir() {
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return out, nil
}

// GC deletes every cached bundle whose build is not in inUse (the builds
// of the modules the runtime holds) and returns the builds deleted. A
// bundle is first renamed aside, then removed, so a half-deleted bundle is
// never taken for a whole one.
//
// Errors: the file system's; the bundles deleted before it are returned.
func (c *Cache) GC(inUse []string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	all, err := c.Builds()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, b := range all {
		if slices.Contains(inUse, b) {
			continue
		}
		if err := c.remove(b); err != nil {
			return removed, err
		}
		removed = append(removed, b)
	}
	return removed, nil
}

// Release deletes build's bundle from the cache (not from the bucket).
// A build that is not cached is not an error.
//
// Errors: ErrNotBundle or ErrBadBuild; the file system's.
func (c *Cache) Release(build string) error {
	if _, err := ParseBuild(build); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remove(build)
}

func (c *Cache) remove(build string) error {
	dir, err := c.Path(build)
	if err != nil {
		return err
	}
	aside := filepath.Join(c.dir, tmpRemove+randomHex())
	if err := os.Rename(dir, aside); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("bundle cache: %w", err)
	}
	if err := os.RemoveAll(aside); err != nil {
		return fmt.Errorf("bundle cache: %w", err)
	}
	return nil
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Prune deletes every cached bundle whose build is not in keep: the
// process runtime's Pruner (node/process), called with the builds its
// modules still use.
//
// Errors: the file system's.
func (c *Cache) Prune(_ context.Context, keep []string) error {
	_, err := c.GC(keep)
	return err
}
