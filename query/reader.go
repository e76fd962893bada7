package query

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// ErrNoSnapshots: the snapshot bucket does not exist: no reconciler has
// checkpointed yet. It is store's sentinel, so either name matches.
var ErrNoSnapshots = store.ErrNoSnapshots

// Config configures a [Reader]. Every field is optional.
type Config struct {
	// Stream names the event stream and its subject prefix (zero fields
	// take store's defaults). The rest of its configuration, the
	// partition count above all, is read from the stream itself
	// (store.OpenStream) the first time a read needs it: a reader never
	// creates or changes the stream.
	Stream store.StreamConfig
	// Timeout bounds each request to the state service before a read
	// falls back to what is stored (0: [DefaultTimeout]).
	Timeout time.Duration
	// Progress, when not nil, is told how a long history read goes: the
	// events read so far and the node's total (its count in the stream's
	// subject index), every 1,000 events; done = -1 once the read ends.
	// It is only called for a node of more than [ProgressThreshold]
	// events.
	Progress func(node string, done, total int)
}

// ProgressThreshold: a history of more events than this is reported to
// [Config.Progress].
const ProgressThreshold = 10000

// Reader answers every read of a meshfold deployment over one NATS
// connection: the reconciler's state service, the stream and its
// snapshot bucket. It is safe for concurrent use; it does not own the
// connection.
type Reader struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	c   Config
	pre string // the subject prefix, defaults applied

	mu     sync.Mutex
	stream jetstream.Stream   // nil until opened
	cfg    store.StreamConfig // its effective configuration
}

// New returns a reader on nc. It makes no request: the stream is looked
// up when a read first needs it.
//
// Errors: a prefix that is not a valid name (matching events.ErrInvalid);
// the JetStream context failing.
func New(nc *nats.Conn, c Config) (*Reader, error) {
	pre := c.Stream.WithDefaults().Prefix
	if !events.ValidPrefix(pre) {
		return nil, &events.FieldError{Field: "prefix", Value: pre, Err: events.ErrBadName}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	return &Reader{nc: nc, js: js, c: c, pre: pre}, nil
}

// Stream returns the stream's effective configuration (store.OpenStream),
// looking it up the first time.
//
// Errors: an error wrapping store.ErrNoStream when the stream does not
// exist; store.ErrIncompatibleStream; the lookup's errors.
func (r *Reader) Stream(ctx context.Context) (store.StreamConfig, error) {
	_, cfg, err := r.open(ctx)
	return cfg, err
}

// open looks the stream up once; a failed lookup is tried again next time.
func (r *Reader) open(ctx context.Context) (jetstream.Stream, store.StreamConfig, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stream != nil {
		return r.stream, r.cfg, nil
	}
	s, cfg, err := store.OpenStreamRiding(ctx, r.js, r.c.Stream)
	if err != nil {
		return nil, cfg, err
	}
	r.stream, r.cfg = s, cfg
	return s, cfg, nil
}

// snapshots opens the snapshot bucket without creating it.
//
// Errors: an error wrapping [ErrNoSnapshots] that names the bucket; the
// stream's and the bucket's lookup errors.
func (r *Reader) snapshots(ctx context.Context) (*store.Snapshots, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	snaps, err := store.FindSnapshots(ctx, r.js, cfg)
	if errors.Is(err, store.ErrNoSnapshots) {
		return nil, wrap(ErrNoSnapshots, "no snapshots yet (bucket %s does not exist): no reconciler has checkpointed", cfg.Name+store.SnapshotBucketSuffix)
	}
	return snaps, err
}

// quiet is an error whose text is its own message, matching a sentinel
// it does not repeat.
type quiet struct {
	msg string
	err error
}

func (e *quiet) Error() string { return e.msg }
func (e *quiet) Unwrap() error { return e.err }

// wrap returns an error reading format, args that matches sentinel.
func wrap(sentinel error, format string, args ...any) error {
	return &quiet{msg: fmt.Sprintf(format, args...), err: sentinel}
}
