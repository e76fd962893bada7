package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/store"
)

// DefaultTimeout is the default time a fill request waits for its reply.
const DefaultTimeout = 5 * time.Second

// DefaultResync is the default interval of the full refill.
const DefaultResync = 10 * time.Minute

// DefaultRetryUnfilled is the default interval at which files no source
// gave are tried again.
const DefaultRetryUnfilled = 5 * time.Second

// ErrRunning: Run was called a second time on the same Client.
var ErrRunning = errors.New("provisioner: Run already called")

// Config configures a [Client].
type Config struct {
	// Node is the node whose files this client fills.
	Node string
	// From is a source directory: From/<module>/<path> holds the content
	// of module's file <path>. When set, it is tried first: [Dir](From)
	// before Sources.
	From string
	// Sources are where content is found, tried in order (DESIGN.md §12):
	// the first with content wins. At least one of From and Sources.
	Sources []Source
	// Status, when set, is the fill status bucket (store.OpenFillStatus):
	// the client keeps there why each file it could not fill is not
	// filled, and deletes it once the file is filled or undeclared.
	Status jetstream.KeyValue
	// Account is the account the client runs as, sent as the writer of
	// every fill; the node accepts it only when it is the settled plan's
	// provisioner account.
	Account string
	// Logger receives the client's log lines; nil uses slog.Default().
	// Content is never logged.
	Logger *slog.Logger
	// Stream is the stream's effective configuration, as store.OpenStream
	// returns it. Zero fields take their defaults.
	Stream store.StreamConfig
	// Timeout bounds each fill request's wait for a reply; 0 means
	// [DefaultTimeout]. A timed-out request is retried.
	Timeout time.Duration
	// Resync is the interval of a full refill, besides start, knocks and
	// settles: a source file that was missing, or a filled file deleted on
	// the node, is filled within it. 0 means [DefaultResync]; negative
	// turns it off.
	Resync time.Duration
	// RetryUnfilled is how often the files no source gave are tried
	// again (a helper failing for a while, a file restored in a
	// directory): a restored source is filled within it, not at the next
	// resync. 0 means [DefaultRetryUnfilled]; negative turns it off.
	RetryUnfilled time.Duration
	// Trust are the reconciler public keys whose knocks the client acts
	// on and whose plans it fills (store.Trust.Verify); nil trusts every
	// knock and plan unsigned (tests; the meshfold command always sets
	// it).
	Trust *store.Trust
	// OnFill, when set, is called after each fill pass with the stream
	// sequence of the knock that caused it (0 for the pass on start and
	// for a pass on a new plan's declarations) and its report. It runs on
	// the client's goroutines, one pass at a time.
	OnFill func(knock uint64, r Report)
	// Lease, when true, makes [Client.Run] hold the node's provisioner
	// lease (the key <node>.provisioner of the node lease bucket,
	// store.ProvisionerLeaseKey) while it runs: the reconciler records its
	// claim, its release and its expiry (a client killed with kill -9) as
	// prov events, so that `fleet`, `state` and the console say when no
	// provisioner answers the node's knocks. A second client of the node
	// is then refused while the first lives (store.ErrLeaseHeld). The
	// meshfold command sets it; false holds none (tests, `meshfold demo`).
	Lease bool
	// Tracing, when set, traces each fill pass (docs/operations.md,
	// "Traces"): a pass on a knock or a settle is a child of that event's
	// traceparent and links to the plan it fills, any other pass a child
	// of the plan's; each fill request carries the pass's traceparent.
	// Nil traces nothing.
	Tracing trace.TracerProvider
}

// FileRef names one declared file.
type FileRef struct {
	Module string `json:"module"`
	Path   string `json:"path"`
}

// Refused is a fill the node refused, with its reason and, for
// write-failed, the node's error.
type Refused struct {
	FileRef
	Reason events.Reason `json:"reason"`
	Error  string        `json:"error,omitempty"`
}

// Failed is a file that could not be sent or whose request the node
// rejected as malformed.
type Failed struct {
	FileRef
	Error string `json:"error"`
}

// Unfilled is a file no source gave content for: State says which kind
// of reason (store.FillMissing when every source had none), Why what each
// source said, in their order but for the failure that names State,
// which comes first.
type Unfilled struct {
	FileRef
	State store.FillState `json:"state"`
	Why   string          `json:"why"`
	// again: the last try of the file said the same (logged at debug).
	again bool
}

// Report says what one fill pass did. It never holds content.
type Report struct {
	// Plan is the stream sequence of the plan whose files were filled; 0
	// when the node has no plan yet (nothing is declared).
	Plan uint64 `json:"plan"`
	// Filled are the files the node wrote for this pass, also those whose
	// reply was lost (a timeout) after the write: the retry, which names
	// the same request (events.HeaderRequest), is answered as filled.
	Filled []FileRef `json:"filled,omitempty"`
	// Unchanged are the files that already held the content before this
	// pass's request: the node rewrote nothing and appended no filled.
	Unchanged []FileRef `json:"unchanged,omitempty"`
	// Refused are the files the node refused.
	Refused []Refused `json:"refused,omitempty"`
	// Missing are, for each file no source had, where the sources looked
	// (a directory source's path; several joined by ", ") (skipped).
	Missing []string `json:"missing,omitempty"`
	// Unfilled are the files no source gave content for, with why.
	Unfilled []Unfilled `json:"unfilled,omitempty"`
	// Failed are the files that could not be read or sent.
	Failed []Failed `json:"failed,omitempty"`
	// Shadowed are the files filled (or unchanged) from a source tried
	// before the sealed one while a sealed secret put for them holds
	// other content (store.FillShadowed).
	Shadowed []FileRef `json:"shadowed,omitempty"`
}

// Client is a provisioner client for one node. Create it with [New].
type Client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	cfg     Config
	subj    events.Subjects
	log     *slog.Logger
	tr      trace.Tracer // nil: tracing off
	started atomic.Bool
	// ready is closed once Run has started (Ready).
	ready chan struct{}
	// startedAt is when Run started (set before its goroutines start);
	// answerWarn: a failed knock answer was logged (answer).
	startedAt  time.Time
	answerWarn atomic.Bool

	// passMu serialises fill passes (FillOnce, fillDeclared); it guards
	// settledSeen and accountWarned.
	passMu sync.Mutex
	// fillMu serialises the recording and sending of each file (not its
	// sources' lookups: fillFiles); it guards declared, refused, ticket
	// and sent, and the fill state below.
	fillMu sync.Mutex
	// ticket numbers the lookups of files in the order they start; sent
	// is, per file, the ticket of the lookup last recorded and sent.
	ticket uint64
	sent   map[FileRef]uint64
	// onFillMu makes Config.OnFill run one report at a time.
	onFillMu sync.Mutex
	// declared are the files of the newest plan a pass has filled, and
	// its provisioner account.
	declared declaredSet
	// refused are the declared files whose last write this client sent
	// was refused: the next settle of a plan that declares them sends them
	// again (see settledEvent).
	refused map[FileRef]bool
	// settledSeen is the newest plan whose settle was handled.
	settledSeen uint64
	// lastPlan is the newest plan this client read and trusted (guarded
	// by passMu; zero: none): a pass fills by it when the stream no
	// longer holds the node's plan (serve --max-age removed it), as the
	// node still judges by it.
	lastPlan store.Msg
	// accountWarned is the newest plan whose provisioner account, not
	// this client's, was warned about (checkAccount).
	accountWarned uint64

	sources []Source
	// status is what the status bucket holds for this node, as last
	// written or read (guarded by fillMu).
	status     map[FileRef]store.FillStatus
	statusWarn bool
	// filled is each file's last fill as the status bucket holds it
	// (store.FillRecord, as last written or read; guarded by fillMu).
	filled map[FileRef]store.FillRecord
	// unfilled are the declared files no source gave at their last try
	// (guarded by fillMu); retryUnfilled tries them again.
	unfilled map[FileRef]bool
	lastWhy  map[FileRef]string

	// trustMu guards trustBad, trustRec and trustWarn, and orders the
	// writes of the trust record (checkTrust).
	trustMu sync.Mutex
	// trustBad is, by kind (plan, knock), the newest effect refused for
	// its signer, as its record (the first of its cause), until one of
	// that kind is accepted.
	trustBad map[events.Kind]store.FillStatus
	// trustRec is the node's trust refusal as the status bucket holds it
	// (store.FillUntrusted, as last written or read; nil: none).
	trustRec  *store.FillStatus
	trustWarn bool
}

// New checks cfg and returns a client that is not running yet.
//
// Errors: an invalid Node (matching events.ErrInvalid); an empty Account;
// From set but missing or not a directory; no source at all.
func New(nc *nats.Conn, js jetstream.JetStream, cfg Config) (*Client, error) {
	if !events.ValidName(cfg.Node) {
		return nil, &events.FieldError{Field: "node", Value: cfg.Node, Err: events.ErrBadName}
	}
	if nc == nil || js == nil {
		return nil, errors.New("provisioner: a NATS connection and a JetStream context are required")
	}
	if cfg.Account == "" {
		return nil, &events.FieldError{Field: "account", Err: events.ErrMissing}
	}
	var sources []Source
	if cfg.From != "" {
		if fi, err := os.Stat(cfg.From); err != nil {
			return nil, fmt.Errorf("provisioner: source: %w", err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("provisioner: source %s: not a directory", cfg.From)
		}
		sources = append(sources, Dir(cfg.From))
	}
	sources = append(sources, cfg.Sources...)
	if len(sources) == 0 {
		return nil, errors.New("provisioner: a source (From or Sources) is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.RetryUnfilled == 0 {
		cfg.RetryUnfilled = DefaultRetryUnfilled
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.Stream = cfg.Stream.WithDefaults()
	return &Client{nc: nc, js: js, cfg: cfg, subj: cfg.Stream.Subjects(), refused: map[FileRef]bool{}, sent: map[FileRef]uint64{},
		sources: sources, status: map[FileRef]store.FillStatus{}, filled: map[FileRef]store.FillRecord{}, unfilled: map[FileRef]bool{}, lastWhy: map[FileRef]string{},
		trustBad: map[events.Kind]store.FillStatus{}, ready: make(chan struct{}),
		tr: tracing.Tracer(cfg.Tracing), log: log.With("node", cfg.Node, "account", cfg.Account)}, nil
}

// Ready is closed once Run has started: its lease claimed (with
// [Config.Lease]), the node's newest knock and settle read, the curve
// keys of its sealed sources registered and their watches started, just
// before the fill on start. What fails before it is a start's failure (a
// permission the creds lack, say: the creds of another node's
// provisioner), not a running client's.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Run fills every declared file on start and again on every knock, until
// ctx is done; then it returns nil. It can be called once per Client.
// With [Config.Lease] it first claims the node's provisioner lease,
// renews it while it runs and releases it when it stops (a client killed
// without releasing it is taken over at once on the same host, else
// after the bucket's TTL), and stops when another client took it over.
//
// Errors: [ErrRunning]; the stream cannot be found; the lease is held by
// another live client of the node (a [*store.HeldError], matching
// store.ErrLeaseHeld), also when one took it over while this one could
// not renew it. A lease the server's permissions deny this client
// (credentials issued before provisioners held one) is no error: Run
// logs it at error level and fills without one.
func (c *Client) Run(ctx context.Context) (rerr error) {
	if !c.started.CompareAndSwap(false, true) {
		return ErrRunning
	}
	var lease *store.Lease
	// A clean stop (SIGINT, SIGTERM: the caller's ctx done) is said, so
	// that the log tells it from a kill -9 (a fresh user's finding U24).
	stopped, said := ctx, "provisioner stopping"
	defer func() {
		if stopped.Err() != nil && rerr == nil {
			c.log.Info(said + "; the filled files stay as they are")
		}
	}()
	if c.cfg.Lease {
		var err error
		lease, err = c.claim(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case errors.Is(err, nats.ErrPermissionViolation):
			// Credentials issued before provisioners held a lease (an
			// upgrade that kept the creds file): the lease only says
			// whether this client is alive, and waiting for it forever
			// filled nothing, the very failure it is to make visible.
			c.log.Error("running without the provisioner lease: this client's credentials do not reach it (issued before provisioners held one); "+
				"its liveness is not recorded and a second client of the node is not refused: issue its credentials again with this version's 'meshfold auth'",
				"key", store.ProvisionerLeaseKey(c.cfg.Node), "err", err)
		case err != nil:
			return err
		}
	}
	if lease != nil {
		c.log.Info("provisioner lease held", "key", store.ProvisionerLeaseKey(c.cfg.Node), "ttl", lease.TTL())
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		watched := make(chan struct{})
		defer func() {
			cancel()
			<-watched
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer rcancel()
			if err := lease.Release(rctx); err != nil {
				c.log.Warn("provisioner lease not released; it expires after its TTL", "ttl", lease.TTL(), "err", err)
				said += ": lease left to expire"
			} else {
				said += ": lease released"
			}
			if err := lease.Err(); err != nil && rerr == nil {
				rerr = fmt.Errorf("provisioner: lease lost: %w", err)
			}
		}()
		go func() {
			defer close(watched)
			select {
			case <-lease.Lost():
				if err := lease.Err(); errors.Is(err, store.ErrPermissionDenied) {
					c.log.Error("provisioner lease not renewed: the server denies these credentials its key; stopping", "err", err)
				} else {
					c.log.Error("provisioner lease taken by another client: stopping", "err", err)
				}
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	stream, err := c.js.Stream(ctx, c.cfg.Stream.Name)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("provisioner: stream %s: %w", c.cfg.Stream.Name, err)
	}
	// The knock and settle positions first: those published during the
	// fill on start are followed afterwards.
	last := func(kind events.Kind) (uint64, error) {
		return store.Retry(ctx, c.log, "read the newest "+string(kind), newBackoff(), func() (uint64, error) {
			m, err := store.LastMsg(ctx, stream, c.subj, c.cfg.Node, kind)
			if errors.Is(err, store.ErrNoMessage) {
				return 0, nil
			}
			return m.Event.Seq, err
		})
	}
	knock, err := store.Retry(ctx, c.log, "read the newest knock", newBackoff(), func() (store.Msg, error) {
		m, err := store.LastMsg(ctx, stream, c.subj, c.cfg.Node, events.KindKnock)
		if errors.Is(err, store.ErrNoMessage) {
			return store.Msg{}, nil
		}
		return m, err
	})
	if err != nil {
		return nil // only ctx ends the retry
	}
	from := knock.Event.Seq
	settles, err := last(events.KindSettle)
	if err != nil {
		return nil
	}
	names := make([]string, len(c.sources))
	for i, src := range c.sources {
		names[i] = src.String()
	}
	c.loadStatus(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	// Sealed sources: the key registered, and the watch started before
	// the fill on start, so that a put after that fill's read is seen.
	for _, src := range c.sources {
		sealed, ok := src.(*Sealed)
		if !ok {
			continue
		}
		reg, err := store.Retry(ctx, c.log, "register the curve key", newBackoff(), func() (Registration, error) {
			return sealed.Register(ctx, c.cfg.Node)
		})
		if err != nil {
			return nil // only ctx ends the retry
		}
		if reg.Replaced != "" && !sealed.Rotation {
			// Another key was registered for this node: a rotation's old
			// one, or one registered with this node's provisioner
			// credential elsewhere (a tester's finding G3: at info, a
			// thief's key was put over in silence).
			c.log.Warn("sealed secrets: registered this provisioner's curve key over another one: if this node's key file was not replaced on purpose, "+
				"check for a stolen provisioner credential; secrets put since that key was registered are sealed to it (put them again once the credential is revoked)",
				"public_key", sealed.PublicKey(), "replaced_key", KeyFingerprint(reg.Replaced),
				"replaced_key_registered_at", reg.ReplacedAt.UTC().Format(time.RFC3339))
		} else {
			c.log.Info("sealed secrets: curve key registered", "public_key", sealed.PublicKey(), "changed", reg.Changed,
				"replaced_key", KeyFingerprint(reg.Replaced))
		}
		ready := make(chan struct{})
		wg.Go(func() { c.watchSealed(ctx, sealed, ready) })
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
	}
	c.log.Info("provisioner running", "sources", strings.Join(names, ", "), "knocks_after", from)
	close(c.ready)
	// The fill on start covers every knock up to from: answered.
	c.startedAt = time.Now().UTC()
	c.answer(ctx, knock.Event)
	if !c.pass(ctx, 0) {
		return nil
	}
	wg.Go(func() {
		c.follow(ctx, events.KindSettle, settles, nil, func(ctx context.Context, m store.Msg) { c.settledEvent(c.extract(ctx, m), m.Event) })
	})
	wg.Go(func() { c.resync(ctx) })
	wg.Go(func() { c.retryUnfilled(ctx) })
	c.follow(ctx, events.KindKnock, from, func(m store.Msg) error { return c.checkTrust(ctx, m) },
		func(ctx context.Context, m store.Msg) { c.knocked(c.extract(ctx, m), m.Event) })
	return nil
}

// claim claims the node's provisioner lease, retrying transient failures
// (the bucket not created yet, the server unreachable) until ctx is done.
// A lease held by another live client, and a bucket or key the server's
// permissions deny this client (an error matching
// nats.ErrPermissionViolation, at once rather than at a timeout), are
// not retried.
func (c *Client) claim(ctx context.Context) (*store.Lease, error) {
	bucket := c.cfg.Stream.WithDefaults().Name + store.NodeLeaseBucketSuffix
	key := store.ProvisionerLeaseKey(c.cfg.Node)
	l, err := store.Retry(ctx, c.log, "claim the provisioner's lease", newBackoff(), func() (*store.Lease, error) {
		// A request the server's permissions deny gets no answer: the
		// guards end it with the denial (the bucket's lookup, the key's
		// writes and reads).
		gctx, release := store.GuardDenied(ctx, c.nc, "$JS.API.STREAM.INFO.KV_"+bucket)
		defer release()
		gctx, release2 := store.GuardDenied(gctx, c.nc, "$KV."+bucket+"."+key)
		defer release2()
		gctx, release3 := store.GuardDenied(gctx, c.nc, "$JS.API.DIRECT.GET.KV_"+bucket+".$KV."+bucket+"."+key)
		defer release3()
		denied := func(err error) error {
			if cause := context.Cause(gctx); err != nil && ctx.Err() == nil && errors.Is(cause, nats.ErrPermissionViolation) {
				return backoff.Permanent(fmt.Errorf("lease %s: %w", key, cause))
			}
			return err
		}
		kv, err := store.OpenNodeLeases(gctx, c.js, c.cfg.Stream)
		if err != nil {
			return nil, denied(err)
		}
		l, err := store.AcquireLease(gctx, kv, key, store.NewHolder("provisioner", c.cfg.Node), c.log)
		if errors.Is(err, store.ErrLeaseHeld) {
			return nil, backoff.Permanent(err)
		}
		return l, denied(err)
	})
	if err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	l.SetOutageNote("the filled files stay as they are")
	l.SetOutageCause(func() error { return store.ReconnectError(c.nc) })
	return l, nil
}

// resync refills everything every Resync, until ctx is done.
func (c *Client) resync(ctx context.Context) {
	if c.cfg.Resync < 0 {
		return
	}
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.log.Debug("resync: filling everything again")
			if !c.pass(ctx, 0) {
				return
			}
		}
	}
}

// pass runs one FillOnce and reports it; false when ctx ended it.
func (c *Client) pass(ctx context.Context, knock uint64) bool {
	r, err := c.FillOnce(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		c.log.Error("fill pass failed", "knock", knock, "err", err)
	}
	c.log.Info("fill pass done", "knock", knock, "plan", r.Plan, "filled", len(r.Filled), "unchanged", len(r.Unchanged),
		"refused", len(r.Refused), "missing", len(r.Missing), "failed", len(r.Failed))
	c.onFill(knock, r)
	return true
}

// follow handles the node's events of kind after sequence from until ctx
// is done (store.FollowNode): each is checked by verify (nil: none) as it
// arrives, a refused one is logged and ignored, and a backlog is
// coalesced into its newest accepted event.
func (c *Client) follow(ctx context.Context, kind events.Kind, from uint64, verify func(store.Msg) error, handle func(context.Context, store.Msg)) {
	store.FollowNode(ctx, c.js, store.NodeFollow{
		Stream: c.cfg.Stream, Node: c.cfg.Node, Kind: kind, After: from,
		Verify: verify,
		Refused: func(_ context.Context, m store.Msg, err error) {
			c.log.Error(string(kind)+" ignored: not from a trusted reconciler", string(kind), m.Event.Seq, "err", err)
		},
		Handle: handle,
		// Backoff: store.FeedBackoff's, jittered, so that a fleet's
		// provisioners that lost their feeds together do not ask
		// together (a fresh user's finding M8).
		Log: c.log,
	})
}

// verify checks an effect's signature against the trusted reconciler
// keys (DESIGN.md §3, signatures); nil when Config.Trust is nil.
func (c *Client) verify(m store.Msg) error {
	if c.cfg.Trust == nil {
		return nil
	}
	return c.cfg.Trust.VerifyMsg(m)
}

// newestPlan reads the node's newest plan, not verified yet.
//
// Errors: [store.ErrNoMessage] when the node has none; the read's; a plan
// that cannot be decoded (or validated).
func (c *Client) newestPlan(ctx context.Context) (store.Msg, error) {
	stream, err := c.js.Stream(ctx, c.cfg.Stream.Name)
	if err != nil {
		return store.Msg{}, fmt.Errorf("stream %s: %w", c.cfg.Stream.Name, err)
	}
	m, err := store.LastMsg(ctx, stream, c.subj, c.cfg.Node, events.KindPlan)
	if err != nil {
		return m, fmt.Errorf("newest plan: %w", err)
	}
	if m.Event.Err != nil {
		return m, fmt.Errorf("newest plan %d: %w", m.Event.Seq, m.Event.Err)
	}
	return m, nil
}

// knocked fills everything again for a knock.
func (c *Client) knocked(ctx context.Context, ev events.Event) {
	log := c.log.With("knock", ev.Seq)
	if k, ok := ev.Payload.(*events.Knock); ok {
		log = log.With("cause", k.Cause, "reasons", k.Reasons, "owed", len(k.Owed))
	}
	log.Info("knocked: filling again")
	c.answer(ctx, ev)
	c.pass(ctx, ev.Seq)
}

// answer records in the fill status bucket that this client took knock
// (store.KnockAnswer; a zero event: none yet), so that a knock nobody
// answers shows (`meshfold poke`, `state`, `fleet`). A failed write is
// logged once until one succeeds.
func (c *Client) answer(ctx context.Context, knock events.Event) {
	if c.cfg.Status == nil {
		return
	}
	a := store.KnockAnswer{Node: c.cfg.Node, Account: c.cfg.Account, Knock: knock.Seq, At: time.Now().UTC(), Started: c.startedAt}
	if k, ok := knock.Payload.(*events.Knock); ok {
		a.Cause = k.Cause
	}
	if err := store.PutKnockAnswer(ctx, c.cfg.Status, a); err != nil {
		if ctx.Err() == nil && !c.answerWarn.Swap(true) {
			c.log.Warn("knock answer not recorded ('meshfold poke', state and fleet will say no provisioner answered)", "knock", knock.Seq, "err", err)
		}
		return
	}
	c.answerWarn.Store(false)
}

// Answer records that this client took knock (a knock event of its
// node), as [Client.Run] does on each knock before its fill pass: for a
// caller that drives the fills itself ([Client.FillOnce]), such as
// `meshfold demo`, so that `state` and `fleet` do not say no provisioner
// answered it. It needs Config.Status; a failed write is logged.
func (c *Client) Answer(ctx context.Context, knock events.Event) { c.answer(ctx, knock) }

// FillOnce fills every file of every row of the node's newest plan, in
// the plan's order, and reports what happened. Transport failures are
// retried until ctx is done; refusals are not retried.
//
// Errors: ctx's error (the report holds what was done before it); the
// newest plan cannot be read or decoded.
func (c *Client) FillOnce(ctx context.Context) (Report, error) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	start := time.Now()
	var r Report
	m, err := c.newestPlan(ctx)
	switch {
	case errors.Is(err, store.ErrNoMessage) && c.lastPlan.Event.Seq != 0:
		// The node's plan aged out of the stream (serve --max-age) while
		// the node still judges by it: filled by the plan last read, or
		// a knock asking for a file deleted on a quiet node filled
		// nothing (provfix).
		m = c.lastPlan
		c.log.Info("the node's plan is no longer in the stream (--max-age?): filling by the plan last read", "plan", m.Event.Seq)
	case errors.Is(err, store.ErrNoMessage):
		c.log.Info("no plan yet: nothing declared to fill")
		return r, nil
	case err != nil:
		return r, fmt.Errorf("provisioner: %w", err)
	default:
		if err := c.checkTrust(ctx, m); err != nil {
			return r, fmt.Errorf("provisioner: newest plan %d: %w (the reconciler publishes its own again)", m.Event.Seq, err)
		}
	}
	seq, plan := m.Event.Seq, m.Event.Payload.(*events.Plan)
	if seq > c.lastPlan.Event.Seq {
		c.lastPlan = m
	}
	r.Plan = seq
	ctx, span := c.startSpan(ctx, start, "fill pass", m)
	defer func() { endPass(span, r) }()
	c.fillMu.Lock()
	c.declared = declaredOf(seq, plan)
	c.checkAccount()
	c.forgetUndeclared()
	c.clearUndeclared(ctx)
	c.fillMu.Unlock()
	var refs []FileRef
	for _, row := range plan.Modules {
		for _, f := range row.Files {
			refs = append(refs, FileRef{Module: row.Name, Path: f.Path})
		}
	}
	err = c.fillFiles(ctx, &r, refs, c.isDeclared)
	return r, err
}

// lookupConc bounds the files whose sources one fill runs at once.
const lookupConc = 4

// fillFiles fills refs: each file's sources are asked without fillMu, at
// most lookupConc files at a time, and the file is recorded and sent
// under fillMu as soon as its own sources answered, so that a helper that
// hangs for one file (until its --exec-timeout) holds no other file of
// this fill, nor any other fill: a sealed put, a knock's pass (a fresh
// user's finding U16). A file still to be filled when its sources
// answered (keep, under fillMu; nil: every one) is sent unless a lookup
// of it that started later was sent first: an older answer never
// overwrites a newer one. The caller must not hold fillMu. It returns an
// error only when ctx ended it; r holds what was done.
func (c *Client) fillFiles(ctx context.Context, r *Report, refs []FileRef, keep func(FileRef) bool) error {
	sem := make(chan struct{}, lookupConc)
	var wg sync.WaitGroup
	var ended atomic.Bool
	for _, ref := range refs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			ended.Store(true)
			break
		}
		c.fillMu.Lock()
		c.ticket++
		ticket := c.ticket
		c.fillMu.Unlock()
		wg.Go(func() {
			defer func() { <-sem }()
			l := c.lookup(ctx, ref)
			l.ticket = ticket
			c.fillMu.Lock()
			defer c.fillMu.Unlock()
			if l.err != nil {
				ended.Store(true)
				return
			}
			if (keep != nil && !keep(ref)) || c.sent[ref] > ticket {
				return
			}
			c.sent[ref] = ticket
			if err := c.fillFile(ctx, r, l); err != nil {
				ended.Store(true)
			}
		})
	}
	wg.Wait()
	if ended.Load() {
		return ctx.Err()
	}
	return nil
}

// isDeclared reports whether the newest plan a fill read declares ref
// (under fillMu).
func (c *Client) isDeclared(ref FileRef) bool { return c.declared.files[ref] }

// fillFile records what the sources said for one file and sends it,
// recording the outcome in r; under fillMu. It returns an error only when
// ctx ended it.
func (c *Client) fillFile(ctx context.Context, r *Report, l lookup) error {
	ref, module, path := l.ref, l.ref.Module, l.ref.Path
	log := c.log.With("module", module, "path", path)
	un := c.record(ctx, r, l)
	content := l.content
	switch {
	case un != nil && un.again:
		log.Debug("still no source for the file; skipped", "state", un.State, "why", un.Why)
		if un.State != store.FillMissing {
			r.Failed = append(r.Failed, Failed{FileRef: ref, Error: un.Why})
		}
		return nil
	case un != nil && un.State == store.FillMissing:
		log.Warn("no source for the file; skipped", "source", r.Missing[len(r.Missing)-1], "why", un.Why)
		return nil
	case un != nil:
		log.Error("no source could give the file; skipped", "state", un.State, "why", un.Why)
		r.Failed = append(r.Failed, Failed{FileRef: ref, Error: un.Why})
		return nil
	}
	reply, err := c.request(ctx, log, module, path, content)
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		log.Error("fill not sent", "err", err)
		r.Failed = append(r.Failed, Failed{FileRef: ref, Error: err.Error()})
		c.setStatus(ctx, ref, store.FillNotSent, err.Error(), "", l.sealed.rev)
	case reply.OK && reply.Unchanged:
		log.Debug("unchanged: not rewritten")
		r.Unchanged = append(r.Unchanged, ref)
		c.filledStatus(ctx, log, r, l, true)
	case reply.OK:
		c.filledStatus(ctx, log, r, l, false)
		if reply.Error != "" {
			log.Warn("filled, but the node could not record it", "err", reply.Error)
		} else {
			log.Info("filled")
		}
		r.Filled = append(r.Filled, ref)
		delete(c.refused, ref)
	default:
		log.Warn("fill refused", "reason", reply.Reason, "err", reply.Error)
		r.Refused = append(r.Refused, Refused{FileRef: ref, Reason: reply.Reason, Error: reply.Error})
		c.refused[ref] = true
		if reply.Reason == events.ReasonWrongAccount {
			// The fold owes a refusal only until a fill at its plan pays
			// it, and an earlier fill (the right account's) may have; a
			// wrong --account would then show nowhere (a fresh user's
			// finding F8). This client knows its account is not the
			// plan's: the status says so until a write is accepted.
			c.setStatus(ctx, ref, store.FillRefused, c.wrongAccountWhy(), "", l.sealed.rev)
		} else {
			c.clearStatus(ctx, ref) // a refusal is owed and shown by the fold, not here
		}
	}
	return nil
}

// wrongAccountWhy says why the node refuses this client's writes when
// its account is not the newest plan's provisioner account.
func (c *Client) wrongAccountWhy() string {
	if c.declared.account == "" {
		return fmt.Sprintf("wrong-account: the node refuses writes from %s; plan #%d names no provisioner account (its want declares no provisioner module)",
			events.Text(c.cfg.Account), c.declared.plan)
	}
	return fmt.Sprintf("wrong-account: the node refuses writes from %s; plan #%d names provisioner account %s: start the provisioner with --account %s",
		events.Text(c.cfg.Account), c.declared.plan, events.Text(c.declared.account), events.Text(c.declared.account))
}

// checkAccount warns, once a plan, when the declared plan's provisioner
// account is not this client's: the node refuses every write then.
func (c *Client) checkAccount() {
	d := c.declared
	if d.account == c.cfg.Account || len(d.files) == 0 || c.accountWarned >= d.plan {
		return
	}
	c.accountWarned = d.plan
	c.log.Warn("this provisioner's --account is not the one the node's newest plan names: the node will refuse every write",
		"plan", d.plan, "plan_account", d.account)
}

// forgetUndeclared drops the refused files the declared plan no longer
// declares: a later plan that declares one again fills it as new.
func (c *Client) forgetUndeclared() {
	for ref := range c.refused {
		if !c.declared.files[ref] {
			delete(c.refused, ref)
		}
	}
}

// errBadRequest: the node rejected the request as malformed.
var errBadRequest = errors.New("the node rejected the request")

// Request sends content as one fill request for module's file at path,
// as the client's account, and returns the node's reply: what a
// provisioner that runs ahead of the node does. It records nothing (a
// refusal is not remembered for the next settle). Transport failures (no
// node agent answering yet, a timeout) are retried until ctx is done.
//
// Errors: ctx's error; content above the server's max payload; a request
// that fails events.FillRequest.Validate (matching events.ErrInvalid; not
// sent); a reply that cannot be read or says the request was malformed.
func (c *Client) Request(ctx context.Context, module, path string, content []byte) (events.FillReply, error) {
	return c.request(ctx, c.log.With("module", module, "path", path), module, path, content)
}

// request sends one fill request, retrying transport failures.
func (c *Client) request(ctx context.Context, log *slog.Logger, module, path string, content []byte) (events.FillReply, error) {
	if max := c.nc.MaxPayload(); max > 0 && int64(len(content)+events.FillRequestRoom(module, path)) > max {
		// The headers count too (the client refuses the message
		// otherwise, and a retry would not help): the ceiling
		// 'secret put' checks a put against.
		return events.FillReply{}, fmt.Errorf("content of %d bytes and the request's headers (up to %d) exceed the server's max payload of %d",
			len(content), events.FillRequestRoom(module, path), max)
	}
	// One id for every attempt: a retry of an attempt that wrote the file
	// but whose reply was lost (a timeout) is then answered as filled, not
	// as unchanged, since the write it finds in place is its own.
	request := nuid.Next()
	fr := events.FillRequest{Module: module, Path: path, Writer: c.cfg.Account, Request: request}
	if err := fr.Validate(); err != nil {
		return events.FillReply{}, fmt.Errorf("bad fill request, not sent: %w", err) // the node would refuse it too
	}
	return store.Retry(ctx, log, "fill request", newBackoff(), func() (events.FillReply, error) {
		msg := &nats.Msg{Subject: c.subj.Fill(c.cfg.Node), Header: fr.Header(), Data: content}
		if c.tr != nil {
			tracing.Inject(ctx, msg.Header)
		}
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		resp, err := c.nc.RequestMsgWithContext(rctx, msg)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return events.FillReply{}, backoff.Permanent(ctx.Err())
			}
			if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubject) {
				return events.FillReply{}, backoff.Permanent(err)
			}
			return events.FillReply{}, err // no responders, timeout, reconnecting: retry
		}
		reply, err := events.DecodeFillReply(resp.Data)
		if err != nil {
			return reply, backoff.Permanent(fmt.Errorf("unreadable reply: %w", err))
		}
		if code := resp.Header.Get(micro.ErrorCodeHeader); code != "" {
			return reply, backoff.Permanent(fmt.Errorf("%w: %s %s", errBadRequest, code, resp.Header.Get(micro.ErrorHeader)))
		}
		if !reply.OK && reply.Reason == "" {
			return reply, fmt.Errorf("node did not judge the write: %s", reply.Error) // e.g. stopping: retry
		}
		return reply, nil
	})
}

// onFill calls Config.OnFill, when set, one report at a time.
func (c *Client) onFill(knock uint64, r Report) {
	if c.cfg.OnFill == nil {
		return
	}
	c.onFillMu.Lock()
	defer c.onFillMu.Unlock()
	c.cfg.OnFill(knock, r)
}

// extract returns ctx under m's traceparent when the client traces.
func (c *Client) extract(ctx context.Context, m store.Msg) context.Context {
	if c.tr == nil {
		return ctx
	}
	return tracing.Extract(ctx, m.Header)
}

// startSpan starts a fill's span at start: a child of ctx's span (a
// knock's, a settle's) linked to the plan m, or of the plan's when ctx
// has none. A nil tracer starts none.
func (c *Client) startSpan(ctx context.Context, start time.Time, name string, m store.Msg) (context.Context, trace.Span) {
	if c.tr == nil {
		return tracing.Start(ctx, nil, name)
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(start), trace.WithAttributes(tracing.Node.String(c.cfg.Node),
		tracing.SeqAttr(tracing.Plan, m.Event.Seq), tracing.Writer.String(c.cfg.Account))}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = tracing.Extract(ctx, m.Header)
	} else if plan := tracing.Remote(m.Header); plan.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: plan, Attributes: []attribute.KeyValue{tracing.SeqAttr(tracing.Seq, m.Event.Seq)}}))
	}
	return c.tr.Start(ctx, name, opts...)
}

// endPass notes what a fill's report says on its span and ends it.
func endPass(span trace.Span, r Report) {
	span.SetAttributes(attribute.Int("meshfold.filled", len(r.Filled)), attribute.Int("meshfold.unchanged", len(r.Unchanged)),
		attribute.Int("meshfold.refused", len(r.Refused)), attribute.Int("meshfold.failed", len(r.Failed)))
	span.End()
}

// newBackoff is the client's retry pacing: 200 ms doubling to 10 s, ±50 %
// jitter, bounded only by the caller's context.
func newBackoff() *backoff.ExponentialBackOff {
	return store.Backoff(200*time.Millisecond, 10*time.Second)
}
