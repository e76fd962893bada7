package bundle

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// BucketSuffix names the builds bucket beside its stream: stream MESH
// keeps its bundles in the object store bucket MESH_BUILDS (DESIGN.md §8),
// as its snapshots are in MESH_SNAPSHOTS.
const BucketSuffix = "_BUILDS"

// DefaultStream is the stream the default bucket is named after.
const DefaultStream = "MESH"

// BucketName returns the builds bucket of stream ("" is MESH).
func BucketName(stream string) string {
	return cmp.Or(stream, DefaultStream) + BucketSuffix
}

// Errors of the store.
var (
	// ErrNoBucket: the builds bucket does not exist yet (nothing was ever
	// pushed).
	ErrNoBucket = errors.New("bundle: no builds bucket")
	// ErrNotFound: no bundle is stored under the build.
	ErrNotFound = errors.New("bundle: no such bundle")
	// ErrMismatch: a bundle's bytes do not hash to its build.
	ErrMismatch = errors.New("bundle: content does not match its build")
	// ErrTooLarge: a bundle has more than MaxSize bytes.
	ErrTooLarge = errors.New("bundle: too large")
)

// Info describes one stored bundle.
type Info struct {
	Build string `json:"build"`
	// Size is the bundle's tar.gz size in bytes.
	Size uint64 `json:"size"`
	// Pushed is when it was stored (the server's clock).
	Pushed time.Time `json:"pushed"`
	// From is what was packed: the base name of the pushed path.
	From string `json:"from,omitempty"`
}

// Store is the builds bucket: bundles stored under their build, in a
// JetStream object store as nats.go ships it (jetstream.ObjectStore). A
// Store opens the bucket on first use and keeps it once found, so a node
// agent may hold one before anything was pushed: every call returns
// ErrNoBucket until the bucket exists. Safe for concurrent use.
type Store struct {
	js     jetstream.JetStream
	stream string
	bucket string

	mu  sync.Mutex
	obs jetstream.ObjectStore
}

// NewStore returns the builds store of stream ("" is MESH) over js. It
// does no I/O.
func NewStore(js jetstream.JetStream, stream string) *Store {
	return &Store{js: js, stream: cmp.Or(stream, DefaultStream), bucket: BucketName(stream)}
}

// Bucket returns the bucket's name.
func (s *Store) Bucket() string { return s.bucket }

// open returns the bucket, opening it (create: creating it, file storage,
// as many replicas as its stream, when missing) on first use.
//
// Errors: ErrNoBucket (when not create), or the server's.
func (s *Store) open(ctx context.Context, create bool) (jetstream.ObjectStore, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs != nil {
		return s.obs, nil
	}
	obs, err := s.js.ObjectStore(ctx, s.bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && create {
		obs, err = s.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: s.bucket,
			Description: "meshfold module bundles, named by build (DESIGN.md §8)", Storage: jetstream.FileStorage,
			Replicas: s.streamReplicas(ctx)})
		if errors.Is(err, jetstream.ErrBucketExists) { // created meanwhile
			obs, err = s.js.ObjectStore(ctx, s.bucket)
		}
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: bucket %s does not exist: push a bundle first (meshfold build push)", ErrNoBucket, s.bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("builds bucket %s: %w", s.bucket, err)
	}
	s.obs = obs
	return obs, nil
}

// streamReplicas returns the replica count of the stream whose wants name
// the bucket's builds, 1 when it cannot be read: on a cluster a bucket of
// one replica would stop every want (its builds are checked) and every
// fetch of a build not cached while its one server is down, though the
// stream kept its quorum (a fresh user's finding G5).
func (s *Store) streamReplicas(ctx context.Context) int {
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		return 1
	}
	return max(1, st.CachedInfo().Config.Replicas)
}

// Ensure creates the bucket when it does not exist.
//
// Errors: the server's.
func (s *Store) Ensure(ctx context.Context) error {
	_, err := s.open(ctx, true)
	return err
}

// Push stores the bundle read from r under build, creating the bucket if
// needed. A bundle already stored under build is not sent again (existed
// is true). The bytes are hashed as they are sent; when they do not match
// build the object is deleted and ErrMismatch returned, so the bucket
// never keeps a bundle under another build. from is recorded as what was
// packed. A bucket that answers nothing (just created on a cluster, its
// leader lost) is asked again until ctx ends; the put too, when r is an
// io.Seeker.
//
// Errors: ErrNotBundle or ErrBadBuild for build; ErrMismatch; ErrTooLarge;
// r's or the server's.
func (s *Store) Push(ctx context.Context, build, from string, r io.Reader) (info Info, existed bool, err error) {
	if _, err := ParseBuild(build); err != nil {
		return Info{}, false, err
	}
	obs, err := s.open(ctx, true)
	if err != nil {
		return Info{}, false, err
	}
	// A bucket just created on a cluster, or one whose leader was just
	// lost, may answer nothing for a few seconds (no responders to its
	// direct gets until its replicas are up): ridden out within ctx.
	if oi, err := store.RideOut(ctx, "OBJ_"+s.bucket, func(ctx context.Context) (*jetstream.ObjectInfo, error) {
		return obs.GetInfo(ctx, build)
	}); err == nil {
		return infoOf(oi), true, nil
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return Info{}, false, fmt.Errorf("push %s: %w", Short(build), err)
	}
	// The put too, when r can be read again from its start (a file): a
	// put that got no answer is sent again whole, after a pause, until
	// ctx ends. A put stored whose answer was lost is stored again under
	// the same name: the same bytes.
	h := sha256.New()
	var lr *io.LimitedReader
	rs, seekable := r.(io.Seeker)
	tries := 0
	oi, err := backoff.RetryWithData(func() (*jetstream.ObjectInfo, error) {
		if tries++; tries > 1 {
			if _, err := rs.Seek(0, io.SeekStart); err != nil {
				return nil, backoff.Permanent(err)
			}
		}
		h.Reset()
		lr = &io.LimitedReader{R: r, N: MaxSize + 1}
		oi, err := obs.Put(ctx, jetstream.ObjectMeta{Name: build, Description: clip(from)}, io.TeeReader(lr, h))
		if err != nil && (!seekable || !store.Unanswered(err)) {
			return nil, backoff.Permanent(err)
		}
		return oi, err
	}, backoff.WithContext(store.Backoff(100*time.Millisecond, time.Second), ctx))
	if err != nil {
		return Info{}, false, fmt.Errorf("push %s: %w", Short(build), err)
	}
	if lr.N <= 0 {
		_ = obs.Delete(ctx, build)
		return Info{}, false, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, MaxSize)
	}
	if got := buildOfHash(h); got != build {
		_ = obs.Delete(ctx, build)
		return Info{}, false, fmt.Errorf("%w: the bytes pushed as %s hash to %s", ErrMismatch, Short(build), Short(got))
	}
	return infoOf(oi), false, nil
}

func infoOf(oi *jetstream.ObjectInfo) Info {
	return Info{Build: oi.Name, Size: oi.Size, Pushed: oi.ModTime.UTC(), From: oi.Description}
}

// List returns every stored bundle, newest first (then by build). No
// bucket yet is not an error: the list is empty.
//
// Errors: the server's.
func (s *Store) List(ctx context.Context) ([]Info, error) {
	obs, err := s.open(ctx, false)
	if errors.Is(err, ErrNoBucket) {
		return []Info{}, nil
	}
	if err != nil {
		return nil, err
	}
	ois, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return []Info{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.bucket, err)
	}
	out := make([]Info, 0, len(ois))
	for _, oi := range ois {
		out = append(out, infoOf(oi))
	}
	slices.SortFunc(out, func(a, b Info) int {
		return cmp.Or(b.Pushed.Compare(a.Pushed), cmp.Compare(a.Build, b.Build))
	})
	return out, nil
}

// Remove deletes the bundle stored under build. Nodes that have it cached
// keep running it; a node that has not fetched it yet fails its apply.
//
// Errors: ErrNotBundle or ErrBadBuild; ErrNoBucket; ErrNotFound; the
// server's.
func (s *Store) Remove(ctx context.Context, build string) error {
	if _, err := ParseBuild(build); err != nil {
		return err
	}
	obs, err := s.open(ctx, false)
	if err != nil {
		return err
	}
	// Delete of an object already deleted succeeds: look first.
	if _, err = obs.GetInfo(ctx, build); err == nil {
		err = obs.Delete(ctx, build)
	}
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("%w: %s is not in bucket %s", ErrNotFound, Short(build), s.bucket)
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", Short(build), err)
	}
	return nil
}

// Stat returns the info of the bundle stored under build, reading its
// metadata only.
//
// Errors: ErrNotBundle or ErrBadBuild; ErrNoBucket; ErrNotFound (its
// message says how to push it); the server's.
func (s *Store) Stat(ctx context.Context, build string) (Info, error) {
	if _, err := ParseBuild(build); err != nil {
		return Info{}, err
	}
	obs, err := s.open(ctx, false)
	if err != nil {
		return Info{}, err
	}
	oi, err := obs.GetInfo(ctx, build)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Info{}, fmt.Errorf("%w: %s is not in bucket %s: push it with meshfold build push PATH", ErrNotFound, Short(build), s.bucket)
	}
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", Short(build), err)
	}
	return infoOf(oi), nil
}

// Open returns a reader of the bundle stored under build, and its info.
// The reader's bytes are what the bucket holds: they are not checked
// against build here ([Cache.Fetch] does that). Close it.
//
// Errors: ErrNotBundle or ErrBadBuild; ErrNoBucket; ErrNotFound;
// ErrTooLarge; the server's.
func (s *Store) Open(ctx context.Context, build string) (io.ReadCloser, Info, error) {
	if _, err := ParseBuild(build); err != nil {
		return nil, Info{}, err
	}
	obs, err := s.open(ctx, false)
	if err != nil {
		return nil, Info{}, err
	}
	res, err := obs.Get(ctx, build)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, Info{}, fmt.Errorf("%w: %s is not in bucket %s: push it with meshfold build push", ErrNotFound, Short(build), s.bucket)
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("fetch %s: %w", Short(build), err)
	}
	oi, err := res.Info()
	if err != nil {
		res.Close()
		return nil, Info{}, fmt.Errorf("fetch %s: %w", Short(build), err)
	}
	if oi.Size > MaxSize {
		res.Close()
		return nil, Info{}, fmt.Errorf("%w: %s has %d bytes, more than %d", ErrTooLarge, Short(build), oi.Size, MaxSize)
	}
	return res, infoOf(oi), nil
}
