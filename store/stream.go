package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream defaults (DESIGN.md §3).
const (
	DefaultStreamName = "MESH"
	DefaultDuplicates = 2 * time.Minute
	DefaultReplicas   = 1
)

// ErrIncompatibleStream: a stream of that name exists and differs from the
// requested configuration in something that cannot be changed in place
// (partition count, prefix, subjects, storage, retention). The stream is
// left as it is; the error says what differs.
var ErrIncompatibleStream = errors.New("store: incompatible existing stream")

// IncompatibleError is [ErrIncompatibleStream] with what differs, for a
// caller that says what to do about it in its own terms (the CLI's
// flags): its Error is the full list of differences.
type IncompatibleError struct {
	Stream string
	// Prefix is the subject prefix the stream was created with, when it
	// is not the one asked for ("" when it is, or cannot be told); Asked
	// the one asked for.
	Prefix, Asked string
	// Partitions is the stream's partition count when a different one was
	// asked for (AskedPartitions), 0 when the count is no difference.
	Partitions, AskedPartitions int
	// Diffs lists each difference.
	Diffs []string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("%v %s: %s", ErrIncompatibleStream, e.Stream, strings.Join(e.Diffs, "; "))
}

func (e *IncompatibleError) Is(target error) bool { return target == ErrIncompatibleStream }

// streamPrefix is the prefix a stream's partition transform was made for
// ("<prefix>.*.*"), "" when t is no such transform.
func streamPrefix(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return ""
	}
	p, ok := strings.CutSuffix(t.Source, ".*.*")
	if !ok || p == "" || strings.ContainsAny(p, "*> ") {
		return ""
	}
	return p
}

// otherPrefix is the stream's prefix when it is not prefix, else "".
func otherPrefix(t *jetstream.SubjectTransformConfig, prefix string) string {
	if p := streamPrefix(t); p != cmp.Or(prefix, events.DefaultPrefix) {
		return p
	}
	return ""
}

// StreamConfig describes meshfold's event stream. The zero value of every
// field means "the default" when the stream is created and, for
// Partitions, Replicas, Duplicates, MaxAge and MaxBytes, "whatever the
// existing stream has" when it exists (see [EnsureStream]).
type StreamConfig struct {
	// Name is the stream name; default "MESH".
	Name string
	// Prefix is the first token of every plain subject; default "mesh".
	Prefix string
	// Partitions is N of the partition transform; default 16. Fixed for
	// the stream's life.
	Partitions int
	// Replicas is the stream's replica count (1, 3 or 5); default 1.
	Replicas int
	// Duplicates is the Nats-Msg-Id dedup window; default 2 minutes.
	Duplicates time.Duration
	// MaxAge drops messages older than this; 0 (or negative) means no age
	// limit.
	MaxAge time.Duration
	// MaxBytes caps the stream's size in bytes, dropping the oldest
	// messages; 0 (or negative) means no limit.
	MaxBytes int64
}

// Keeps says what the stream's retention keeps, as an operator reads it:
// "all events", "2160h0m0s of events (--max-age)", "1000000 bytes
// (--max-bytes)", or both joined by "and".
func (c StreamConfig) Keeps() string {
	var lim []string
	if c.MaxAge > 0 {
		lim = append(lim, c.MaxAge.String()+" of events (--max-age)")
	}
	if c.MaxBytes > 0 {
		lim = append(lim, fmt.Sprintf("%d bytes (--max-bytes)", c.MaxBytes))
	}
	if len(lim) == 0 {
		return "all events"
	}
	return strings.Join(lim, " and ")
}

// WithDefaults returns c with every zero field set to its default: Name
// "MESH", Prefix "mesh", Partitions 16, Replicas 1, Duplicates 2m. MaxAge
// and MaxBytes stay 0 (no limit).
func (c StreamConfig) WithDefaults() StreamConfig {
	if c.Name == "" {
		c.Name = DefaultStreamName
	}
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Partitions == 0 {
		c.Partitions = events.DefaultPartitions
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicates
	}
	return c
}

// Subjects returns the subject builder of the stream's prefix and
// partition count.
func (c StreamConfig) Subjects() events.Subjects {
	d := c.WithDefaults()
	return events.Subjects{Prefix: d.Prefix, Partitions: d.Partitions}
}

// maxPartitions bounds N; a partition token is a subject token and a
// reconciler reads whole partitions, so thousands make no sense.
const maxPartitions = 1024

func (c StreamConfig) validate() error {
	if strings.ContainsAny(c.Name, ".*> \t\r\n/\\") {
		return fmt.Errorf("stream name %q: must not contain . * > / \\ or whitespace", c.Name)
	}
	if !events.ValidPrefix(c.Prefix) {
		return fmt.Errorf("subject prefix %q: %w", c.Prefix, events.ErrBadName)
	}
	if c.Partitions < 0 || c.Partitions > maxPartitions {
		return fmt.Errorf("partitions %d: must be 1..%d (0: the existing stream's)", c.Partitions, maxPartitions)
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("replicas %d: must be 1..5", c.Replicas)
	}
	if c.Duplicates < 0 {
		return fmt.Errorf("duplicates window %s: must not be negative", c.Duplicates)
	}
	return nil
}

// jsConfig is the JetStream configuration of a new stream for c (c has
// its defaults applied).
func (c StreamConfig) jsConfig() jetstream.StreamConfig {
	subj := c.Subjects()
	src, dst := subj.Transform()
	return jetstream.StreamConfig{
		Name:              c.Name,
		Description:       "meshfold events: " + c.Prefix + ".<node>.<kind>, stored as <partition>." + c.Prefix + ".<node>.<kind>",
		Subjects:          subj.Captured(),
		SubjectTransform:  &jetstream.SubjectTransformConfig{Source: src, Destination: dst},
		Storage:           jetstream.FileStorage,
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		AllowDirect:       true,
		Replicas:          c.Replicas,
		Duplicates:        c.Duplicates,
		MaxAge:            max(c.MaxAge, 0),
		MaxBytes:          limitOrNone(c.MaxBytes),
		MaxMsgs:           -1,
		MaxMsgsPerSubject: -1,
		MaxMsgSize:        MaxMsgSize,
	}
}

// MaxMsgSize is the event stream's maximum message size: the event limit
// of DESIGN.md §10 (events.MaxEventBytes), so that an oversized event is
// refused to its publisher at once (the server's error 10054, see
// [Permanent]) and never stored, rather than stored and then journaled
// as unfoldable. The server counts a message's headers too: an effect's
// signature and message id are a few hundred bytes, and the largest
// effect (a plan of 51 KB) is far below.
const MaxMsgSize = events.MaxEventBytes

func limitOrNone(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// EnsureStream creates meshfold's event stream or adopts the existing one,
// and returns it with its effective configuration (every field set, the
// partition count read back from the stream's transform). It is safe at
// every start and never deletes, purges or recreates a stream.
//
// On an existing stream, a zero Partitions, Replicas, Duplicates, MaxAge or
// MaxBytes in cfg adopts the stream's value; a maximum message size other
// than [MaxMsgSize] is set to it; a non-zero Replicas,
// Duplicates, MaxAge or MaxBytes that differs is applied with UpdateStream
// (MaxAge and MaxBytes: negative means "remove the limit"). A different
// partition count, prefix, subject set, storage type, retention policy, or
// a missing partition transform is an error wrapping
// [ErrIncompatibleStream] that lists each difference.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, StreamConfig, error) {
	stream, eff, _, err := EnsureStreamSaying(ctx, js, cfg)
	return stream, eff, err
}

// EnsureStreamSaying is [EnsureStream], also returning the stream's
// retention as it was before this call changed it (was), when it did:
// the stream is shared by every reconciler of a group and every reader,
// and a limit one start set (a member's --max-age) drops events for all
// of them (a fresh user's finding m4: nothing said so). was is nil when
// the stream was created, or its retention left as it was.
func EnsureStreamSaying(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, StreamConfig, *StreamConfig, error) {
	stream, eff, was, err := ensureStream(ctx, js, cfg)
	if err != nil {
		return nil, StreamConfig{}, nil, err
	}
	if was != nil && was.MaxAge == eff.MaxAge && was.MaxBytes == eff.MaxBytes {
		was = nil
	}
	return stream, eff, was, nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, StreamConfig, *StreamConfig, error) {
	want := cfg.WithDefaults()
	if err := want.validate(); err != nil {
		return nil, StreamConfig{}, nil, fmt.Errorf("stream config: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRideOut)
		defer cancel()
	}
	inUse := 0
	// The lookup and creation are each bounded by an attempt of
	// [AskAgain]'s length (1 s doubling to 5 s), asked again while
	// unanswered, until ctx ends ([DefaultRideOut] without a deadline): a
	// creation asked while a cluster just started, or just lost a server,
	// has no meta leader is never answered, not even once one is elected
	// (TestEffectsRideOutTheirServersKill's three-server cluster waited its
	// whole 2 minutes on "create stream MESH" under a loaded CI, 4
	// December). A creation answered after its attempt ended is found by the
	// next attempt's lookup, or answered "already in use" and adopted. Its
	// loop is its own rather than [AskAgain]'s for its errors: a lookup
	// unanswered says what a fresh cluster likely lacks (lookupError), not
	// "no leader", and a concurrent creation is adopted at once.
	for d := askAttemptFirst; ; d = min(2*d, askAttemptMost) {
		actx, cancel := context.WithTimeout(ctx, d)
		stream, err := js.Stream(actx, want.Name)
		what := "look up"
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			what = "create"
			stream, err = js.CreateStream(actx, want.jsConfig())
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && inUse < 3 {
				inUse++
				cancel()
				continue // created concurrently by another process: adopt it
			}
		}
		if err != nil && (Unanswered(err) || NoPeersYet(err)) && ctx.Err() == nil {
			// No answer (no meta leader yet, a 503, an ask lost to a
			// leader change), or no placement yet (a cluster just
			// formed, its peers not yet current, or a server
			// restarting): asked again, after the rest of the
			// attempt's time when the refusal came at once.
			NoteWait(ctx, err)
			<-actx.Done()
			cancel()
			continue
		}
		cancel()
		switch {
		case err != nil && what == "create":
			return nil, StreamConfig{}, nil, fmt.Errorf("create stream %s: %w", want.Name, err)
		case err != nil:
			return nil, StreamConfig{}, nil, lookupError(want.Name, err)
		case what == "create":
			return stream, want, nil, nil
		}
		return adoptStream(ctx, js, stream, cfg, want)
	}
}

// lookupError is the error of a failed lookup of the stream name. One
// JetStream did not answer, or answered it is not available, says what
// that likely is: a cluster just started has no JetStream meta leader
// for its first seconds (a fresh user's finding V10: a reconcile started
// then exited with a bare "look up stream MESH: context deadline
// exceeded").
func lookupError(name string, err error) error {
	var apiErr *jetstream.APIError
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.As(err, &apiErr) && apiErr.Code == 503 {
		return fmt.Errorf("look up stream %s: JetStream did not answer (%w); a cluster just started has no JetStream leader for its first seconds "+
			"(each server's log says \"JetStream cluster new metadata leader\" once it has): start again then (a service manager's Restart= does)", name, err)
	}
	return fmt.Errorf("look up stream %s: %w", name, err)
}

// adoptStream checks an existing stream against cfg (raw) and want (cfg
// with defaults), applies the allowed updates and returns the effective
// configuration, and, when it updated the stream, the one before.
func adoptStream(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cfg, want StreamConfig) (jetstream.Stream, StreamConfig, *StreamConfig, error) {
	have := stream.CachedInfo().Config
	subj := events.Subjects{Prefix: want.Prefix}
	var diffs []string

	incompat := &IncompatibleError{Stream: have.Name, Asked: cmp.Or(want.Prefix, events.DefaultPrefix),
		Prefix: otherPrefix(have.SubjectTransform, want.Prefix)}
	n, err := partitionsOf(have.SubjectTransform, want.Prefix)
	if err != nil {
		diffs = append(diffs, err.Error())
	} else if cfg.Partitions != 0 && cfg.Partitions != n {
		diffs = append(diffs, fmt.Sprintf("partitions: stream has %d, asked for %d (fixed for the stream's life)", n, cfg.Partitions))
		incompat.Partitions, incompat.AskedPartitions = n, cfg.Partitions
	}
	got, exp := sortedCopy(have.Subjects), sortedCopy(subj.Captured())
	// A stream an older build made captures fewer kinds (the operator
	// kinds of DESIGN.md §9 came later, the rollout subjects of §11
	// later still): it gains the missing ones. A stream a newer build
	// made captures kinds this build does not know (a rollback, or one
	// reconciler of a group not yet upgraded): it keeps them, since
	// narrowing it would refuse the newer agents' events, and the fold
	// journals each such event as an unknown kind (DESIGN.md §3). The
	// named operators' patterns (events.Subjects.NamedInput) are such
	// extras too: kept when there, never added here, since a build
	// before them refuses a stream that has them; an operator adds them
	// ([CaptureNamed]).
	extra := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return slices.Contains(exp, s) })
	missing := slices.DeleteFunc(slices.Clone(exp), func(s string) bool { return slices.Contains(got, s) })
	prefix := cmp.Or(want.Prefix, events.DefaultPrefix)
	newerKinds := !slices.ContainsFunc(extra, func(s string) bool { return !kindShaped(prefix, s) })
	addKinds := len(missing) > 0 && len(got) > 0 && newerKinds
	if !slices.Equal(got, exp) && !(len(got) > 0 && newerKinds) {
		diffs = append(diffs, fmt.Sprintf("subjects: stream has %v, prefix %q needs %v", got, want.Prefix, exp))
	}
	if have.Storage != jetstream.FileStorage {
		diffs = append(diffs, fmt.Sprintf("storage: stream has %s, need file", have.Storage))
	}
	if have.Retention != jetstream.LimitsPolicy {
		diffs = append(diffs, fmt.Sprintf("retention: stream has %s, need limits", have.Retention))
	}
	if len(diffs) > 0 {
		incompat.Diffs = diffs
		return nil, StreamConfig{}, nil, incompat
	}

	eff := StreamConfig{
		Name:       have.Name,
		Prefix:     want.Prefix,
		Partitions: n,
		Replicas:   have.Replicas,
		Duplicates: have.Duplicates,
		MaxAge:     have.MaxAge,
		MaxBytes:   max(have.MaxBytes, 0),
	}
	was := eff // before this start's changes
	upd := have
	changed := false
	if addKinds {
		upd.Subjects, changed = append(slices.Clone(have.Subjects), missing...), true
	}
	if cfg.Replicas != 0 && cfg.Replicas != have.Replicas {
		upd.Replicas, eff.Replicas, changed = cfg.Replicas, cfg.Replicas, true
	}
	if cfg.Duplicates != 0 && cfg.Duplicates != have.Duplicates {
		upd.Duplicates, eff.Duplicates, changed = cfg.Duplicates, cfg.Duplicates, true
	}
	if cfg.MaxAge != 0 && max(cfg.MaxAge, 0) != have.MaxAge {
		upd.MaxAge, eff.MaxAge, changed = max(cfg.MaxAge, 0), max(cfg.MaxAge, 0), true
	}
	if cfg.MaxBytes != 0 && limitOrNone(cfg.MaxBytes) != limitOrNone(have.MaxBytes) {
		upd.MaxBytes, eff.MaxBytes, changed = limitOrNone(cfg.MaxBytes), max(cfg.MaxBytes, 0), true
	}
	if !have.AllowDirect {
		upd.AllowDirect, changed = true, true // LastMsg needs direct gets
	}
	if have.Discard != jetstream.DiscardOld {
		upd.Discard, changed = jetstream.DiscardOld, true
	}
	if have.MaxMsgSize != MaxMsgSize {
		// A stream made before the limit was the event limit: from now
		// on an oversized event is refused at the door (issue 25).
		upd.MaxMsgSize, changed = MaxMsgSize, true
	}
	if !changed {
		return stream, eff, nil, nil
	}
	stream, err = js.UpdateStream(ctx, upd)
	if err != nil {
		return nil, StreamConfig{}, nil, fmt.Errorf("update stream %s: %w", have.Name, err)
	}
	return stream, eff, &was, nil
}

var partitionRE = regexp.MustCompile(`^\{\{\s*partition\(\s*(\d+)\s*,\s*1\s*\)\s*\}\}\.`)

// partitionsOf reads N back from the stream's transform and checks that
// the transform is exactly the one meshfold makes for that N and prefix.
func partitionsOf(t *jetstream.SubjectTransformConfig, prefix string) (int, error) {
	if t == nil {
		return 0, errors.New("transform: stream has none, need the partition transform")
	}
	m := partitionRE.FindStringSubmatch(t.Destination)
	if m == nil {
		return 0, fmt.Errorf("transform: destination %q is not a partition transform", t.Destination)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 {
		return 0, fmt.Errorf("transform: bad partition count in %q", t.Destination)
	}
	src, dst := events.Subjects{Prefix: prefix, Partitions: n}.Transform()
	if t.Source != src || t.Destination != dst {
		return 0, fmt.Errorf("transform: stream has %q → %q, prefix %q needs %q → %q", t.Source, t.Destination, prefix, src, dst)
	}
	return n, nil
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// ErrNoStream: the event stream does not exist yet. Only the reconciler
// creates it ([EnsureStream]); the other roles open it ([OpenStream]).
var ErrNoStream = errors.New("store: the event stream does not exist: start `meshfold serve` or `meshfold reconcile` first")

// OpenStream opens the existing event stream without creating or changing
// it and returns its effective configuration (the partition count read
// from its transform). cfg's zero fields take their defaults.
//
// Errors: [ErrNoStream] when it does not exist; an error wrapping
// [ErrIncompatibleStream] when it lacks meshfold's partition transform for
// cfg's prefix.
func OpenStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, StreamConfig, error) {
	want := cfg.WithDefaults()
	stream, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, StreamConfig{}, fmt.Errorf("stream %s: %w", want.Name, ErrNoStream)
	}
	if err != nil {
		return nil, StreamConfig{}, fmt.Errorf("stream %s: %w", want.Name, err)
	}
	eff, err := OpenedStream(stream, cfg)
	if err != nil {
		return nil, StreamConfig{}, err
	}
	return stream, eff, nil
}

// OpenStreamRiding is [OpenStream] through [RideOut]: a stream whose
// cluster is electing a leader is asked again until ctx ends (30 s
// without a deadline), each ask bounded by [RideAttempt]. The CLI's verbs
// and readers open the stream with it.
//
// Errors: OpenStream's; a [*NoLeaderError] naming the stream when no
// leader answered before ctx ended.
func OpenStreamRiding(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, StreamConfig, error) {
	type opened struct {
		st  jetstream.Stream
		cfg StreamConfig
	}
	o, err := RideOut(ctx, cfg.WithDefaults().Name, func(ctx context.Context) (opened, error) {
		st, eff, err := OpenStream(ctx, js, cfg)
		return opened{st, eff}, err
	})
	return o.st, o.cfg, err
}

// OpenedStream is [OpenStream]'s effective configuration of a stream
// already looked up (its cached info, as [EnsureStream] returns it),
// without asking the server again.
func OpenedStream(stream jetstream.Stream, cfg StreamConfig) (StreamConfig, error) {
	want := cfg.WithDefaults()
	have := stream.CachedInfo().Config
	n, err := partitionsOf(have.SubjectTransform, want.Prefix)
	if err != nil {
		return StreamConfig{}, &IncompatibleError{Stream: want.Name, Asked: cmp.Or(want.Prefix, events.DefaultPrefix),
			Prefix: otherPrefix(have.SubjectTransform, want.Prefix), Diffs: []string{err.Error()}}
	}
	return StreamConfig{Name: have.Name, Prefix: want.Prefix, Partitions: n, Replicas: have.Replicas,
		Duplicates: have.Duplicates, MaxAge: have.MaxAge, MaxBytes: max(have.MaxBytes, 0)}, nil
}

// kindShaped reports whether subject is one a build of meshfold could
// capture for an event kind under prefix: "<prefix>.*.<kind>", the kind a
// single literal token, a partition's named operator events,
// "<p>.<prefix>.*.*.*", or the fleets' named rollout verbs,
// "<prefix>.rollout.*.*.*" ([CaptureNamed]).
func kindShaped(prefix, subject string) bool {
	if subject == (events.Subjects{Prefix: prefix}).NamedRolloutInput() {
		return true
	}
	kind, ok := strings.CutPrefix(subject, prefix+".*.")
	if !ok {
		// A partition's named operator events, <p>.<prefix>.*.*.*
		// (events.Subjects.NamedInput).
		p, found := strings.CutSuffix(subject, "."+prefix+".*.*.*")
		_, err := strconv.Atoi(p)
		return found && err == nil
	}
	return ok && kind != "" && !strings.ContainsAny(kind, ".*> ")
}

// CapturesNamed reports whether stream, as its cached info has it,
// captures the named operator events (events.Subjects.NamedInput) of
// every one of its partitions, for cfg's prefix (default "mesh"): whether
// a named operator's event can be stored in it. False for a stream that
// is not meshfold's (no partition transform for that prefix).
func CapturesNamed(stream jetstream.Stream, cfg StreamConfig) bool {
	missing := namedMissing(stream, cfg)
	return !slices.ContainsFunc(missing, func(s string) bool { return !isNamedRollouts(s, cfg) })
}

// CapturesNamedRollouts reports whether stream, as its cached info has
// it, captures the fleets' named rollout verbs
// (events.Subjects.NamedRolloutInput, <prefix>.rollout.*.*.*): whether a
// named operator's rollout verb can be stored in it. A stream whose step
// an older build took ([CaptureNamed] before named rollout verbs)
// captures the named operator events and not these. False for a stream
// that is not meshfold's.
func CapturesNamedRollouts(stream jetstream.Stream, cfg StreamConfig) bool {
	missing := namedMissing(stream, cfg)
	return !slices.ContainsFunc(missing, func(s string) bool { return s == "" || isNamedRollouts(s, cfg) })
}

// isNamedRollouts reports whether pattern is the named rollout verbs'
// pattern of cfg's prefix.
func isNamedRollouts(pattern string, cfg StreamConfig) bool {
	return pattern == (events.Subjects{Prefix: cfg.Prefix}).NamedRolloutInput()
}

// namedMissing returns the named patterns stream does not capture, the
// partitions' named operator events' and the named rollout verbs'; all
// of them (or one "" for a stream that is not meshfold's).
func namedMissing(stream jetstream.Stream, cfg StreamConfig) []string {
	eff, err := OpenedStream(stream, cfg)
	if err != nil {
		return []string{""}
	}
	have := stream.CachedInfo().Config.Subjects
	subj := eff.Subjects()
	return slices.DeleteFunc(append(subj.NamedInput(), subj.NamedRolloutInput()), func(s string) bool { return slices.Contains(have, s) })
}

// CaptureNamed makes the existing event stream capture the named
// operators' events: it adds, with one stream update, the patterns
// <p>.<prefix>.*.*.* of the partitions whose pattern it lacks
// (events.Subjects.NamedInput) and the named rollout verbs' pattern
// <prefix>.rollout.*.*.* when it lacks it
// (events.Subjects.NamedRolloutInput), and returns those added; none
// when it captured them all already. Nothing else of the stream changes, and the stream
// is never created here (only a reconciler creates it).
//
// It is an operator's step, never a start's ([EnsureStream] keeps the
// patterns and adds none): a build before named operators refuses to
// start its reconciler on a stream that has them, and folds none of the
// named events (docs/architecture.md, "Named operators are an
// operator's step"). Call it once every reconciler runs a build that
// folds them.
//
// Errors: [ErrNoStream] when the stream does not exist; an error
// wrapping [ErrIncompatibleStream] when it is not meshfold's stream for
// cfg's prefix; the lookup's or update's (a credential without
// $JS.API.STREAM.UPDATE: a permissions violation) otherwise.
func CaptureNamed(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) ([]string, error) {
	stream, _, err := OpenStreamRiding(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	missing := namedMissing(stream, cfg)
	if len(missing) == 0 {
		return nil, nil
	}
	upd := stream.CachedInfo().Config
	upd.Subjects = append(slices.Clone(upd.Subjects), missing...)
	if _, err := js.UpdateStream(ctx, upd); err != nil {
		return nil, fmt.Errorf("update stream %s: %w", upd.Name, err)
	}
	return missing, nil
}
