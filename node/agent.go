package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/saferoot"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/store"
)

// DefaultResync is the default interval of the resync have (and the
// longest wait before a failed plan is tried again).
const DefaultResync = 10 * time.Minute

// DefaultCheckFiles is the default interval of the look at the filled
// files in place on the node (Config.CheckFiles): one fstatat per declared
// file, through the safe walk of its directory, some microseconds each, against a credential gone unnoticed
// under a module that never exits.
const DefaultCheckFiles = 5 * time.Second

// ErrRunning: Run was called a second time on the same Agent.
var ErrRunning = errors.New("node agent: Run already called")

// Config configures an [Agent].
type Config struct {
	// Name is the node's name ([a-z0-9][a-z0-9_-]{0,62}).
	Name string
	// Root is the directory filled files are written under: a plan's path
	// /run/x/key is written to Root/run/x/key. It must exist.
	Root string
	// StateDir holds the agent's HMAC key (fill-hmac.key). It is created
	// with mode 0700 when missing, and must not be inside Root. It belongs
	// to one node: its [OwnerFile] names it ([ClaimStateDir]), and New
	// refuses one of another node.
	StateDir string
	// Runtime applies and removes modules and reports what runs.
	Runtime Runtime
	// Resync is the interval of the resync have; 0 means [DefaultResync].
	Resync time.Duration
	// CheckFiles is the interval of the look at the declared files this
	// agent saw in place on the node (filled, or there at its start): one
	// gone (an operator's rm, a cleanup cron) is reported missing in a
	// have at once (events.Have.Missing), so the reconciler knocks and the
	// provisioner fills it again while its module runs. 0 means
	// [DefaultCheckFiles]; negative never looks (a module's exit still
	// shows its files gone, see missingFiles).
	CheckFiles time.Duration
	// HaveEvery is the least interval between two haves a Supervisor
	// runtime's changes bring; 0 means [DefaultHaveEvery].
	HaveEvery time.Duration
	// HealthHold is how long a module's health check, reported unhealthy,
	// must pass without a break before a have reports it healthy again in
	// the same run; it doubles for a check that keeps flapping, up to
	// [MaxHealthHold] (docs/architecture.md, "A flapping check's
	// recoveries are held"). 0 means [DefaultHealthHold].
	HealthHold time.Duration
	// Logger receives the agent's log lines; nil uses slog.Default().
	// Content is never logged.
	Logger *slog.Logger
	// Stream is the stream's effective configuration, as store.OpenStream
	// or store.EnsureStream return it (its partition count must be the
	// stream's). Zero fields take their defaults.
	Stream store.StreamConfig
	// Trust are the reconciler public keys whose plans the agent applies
	// (store.Trust.VerifyMsg); a plan signed by no trusted key is refused,
	// as is one whose cause is not below its own sequence or not newer
	// than the settled plan's (verifyPlan). Nil trusts every plan
	// unsigned: only for tests and embedders that verify elsewhere (the
	// meshfold command always sets it).
	Trust *store.Trust
	// TrustFrom is the file Trust was read from, once, when the agent
	// started (meshfold node's --trust or --trust-from): a refusal for a
	// plan's signer names it, so the node's journal says where the keys
	// came from and that a restart reads them again. Empty: not said.
	TrustFrom string
	// Faults are test hooks; nil hooks do nothing.
	Faults Faults
	// Tracing, when set, traces the apply of each plan (with each
	// module's start or removal), each fill request served and each
	// event the agent publishes but haves (docs/operations.md, "Traces"):
	// an apply is a child of the plan's traceparent, a fill of the
	// request's, and every settle, refusal and filled carries the
	// traceparent of its publish. Nil traces nothing.
	Tracing trace.TracerProvider
}

// Faults are hooks for tests that need to shape the timing of what the
// agent publishes (the end-to-end race of incident 2 delays refusals as a
// slow network would).
type Faults struct {
	// BeforePublish runs before each attempt to append an event the agent
	// publishes (have, settle, refusal, filled), on the publishing
	// goroutine.
	BeforePublish func(events.Payload)
}

// faultyPublisher runs the BeforePublish hook before each append.
type faultyPublisher struct {
	next   publisher
	before func(events.Payload)
}

func (f faultyPublisher) Append(ctx context.Context, node string, p events.Payload, opts ...store.AppendOpt) (store.Ack, error) {
	f.before(p)
	return f.next.Append(ctx, node, p, opts...)
}

// publisher is what the agent appends events through: a *store.Publisher
// (tests wrap it to observe the order of publishes).
type publisher interface {
	Append(ctx context.Context, node string, payload events.Payload, opts ...store.AppendOpt) (store.Ack, error)
}

// Agent is one node's agent. Create it with [New] and start it with
// [Agent.Run].
type Agent struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  Config
	subj events.Subjects
	log  *slog.Logger
	rt   Runtime
	key  []byte
	pub  publisher
	tr   trace.Tracer // nil: tracing off

	started    atomic.Bool
	haveKick   chan struct{}
	changeKick chan struct{}
	health     *healthHold  // what the haves say of the modules' checks
	lastHave   *events.Have // the last have stored (haveLoop's)
	// ready is closed once the first plan has been applied (or there was
	// none): fill requests that arrive earlier wait for it instead of
	// being judged against plan 0 or finding no responder.
	ready chan struct{}

	// mu is the judging lock: the fill handler judges and writes under it,
	// and the plan loop switches the settled plan under it.
	mu         sync.Mutex
	settled    *events.Plan
	settledSeq uint64
	// settledRetired: the settled plan was signed by a retired key (a
	// rotation's overlap): a plan of a current key is newer than it
	// whatever their causes, and none of a retired key is newer than a
	// current key's (docs/architecture.md, "Trust per deployment").
	settledRetired bool
	// noPlan: the start found no plan in the stream; haves say so
	// (events.Have.NoPlan) until the agent takes one to apply (handlePlan):
	// it holds that one, applied or not yet settled.
	noPlan bool
	// lookedBefore: the stream's sequences before it were looked at when
	// the start found no plan (events.Have.LookedBefore).
	lookedBefore uint64
	root         *saferoot.Root // nil until Run opens it and after Run closes it
	// refused holds the files this agent refused a write of since it last
	// wrote them: an item may be owed for them, which only a filled pays,
	// so their next accepted fill is written and reported even when the
	// content is unchanged.
	refused map[fileRef]bool
	// wrote holds, for each file this agent wrote, the request
	// (events.HeaderRequest) whose write it was: a retry of it that finds
	// the content in place was written by it, not before it.
	wrote map[fileRef]string
	// held holds the files in place on the node in this agent's life (a
	// fill wrote or found them, or they were there at its start): one of
	// them missing now was deleted on the node (missingFiles).
	held map[fileRef]bool
	// gone holds the declared files the last have reported missing on
	// the node (missingFiles), looked at again by every have until they
	// are back; saidGone is the set as last logged. lookAll: the first
	// look with a settled plan (startLook) is still to come: it notes
	// every declared file in place, and those gone then (startGone).
	// look holds the files checkFiles found gone, for the next have to
	// look at. startGone holds the declared files gone at that first
	// look that no fill of this agent wrote before it (a reboot or a
	// re-image emptied /run): every have reports them, marked so
	// (events.MissingFile.AtStart), until they are back. Touched under mu.
	gone      map[fileRef]bool
	look      map[fileRef]bool
	startGone map[fileRef]bool
	// startReport holds what that first look found gone: the first have
	// stored after it reports them all, marked so, even those back since
	// (a fill can land before it), so the stream says what the start
	// took (startReported clears it).
	startReport map[fileRef]bool
	saidGone    string
	lookAll     bool
	// claimed is the claim (token) of the node's lease this agent holds,
	// set before any have or fill: a filled names it
	// (events.Filled.Claim), as does a have reporting files gone at the
	// agent's start (events.Have.Started).
	claimed string

	// failed is the newest plan whose apply failed, retried when retry
	// fires (paced by retryPace, reset by a new plan); failedSaid is the
	// module and error of the failed settle last published for it.
	// Touched by the plan loop only.
	failed     *store.Msg
	failedSaid string
	retry      *time.Timer
	retryPace  *backoff.ExponentialBackOff
}

// Bounds of the retry of a failed apply: 1 s doubling to 1 min (±50 %
// jitter), never slower than Resync (docs/architecture.md, "A failed
// apply is retried").
const (
	retryFirst = time.Second
	retryMax   = time.Minute
)

// New checks cfg, loads or creates the node's HMAC key and returns an
// agent that is not running yet.
//
// Errors: an invalid Name (matching events.ErrInvalid); Root missing or not
// a directory; StateDir empty, inside Root, unusable, or another node's
// (matching [ErrStateDirOwned]); a nil Runtime; an unreadable or badly
// protected key file.
func New(nc *nats.Conn, js jetstream.JetStream, cfg Config) (*Agent, error) {
	if !events.ValidName(cfg.Name) {
		return nil, &events.FieldError{Field: "node", Value: cfg.Name, Err: events.ErrBadName}
	}
	if nc == nil || js == nil {
		return nil, errors.New("node agent: a NATS connection and a JetStream context are required")
	}
	if cfg.Runtime == nil {
		return nil, errors.New("node agent: a Runtime is required")
	}
	if cfg.Root == "" {
		return nil, errors.New("node agent: Root is required")
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("node agent: root: %w", err)
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("node agent: root: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("node agent: root %s: not a directory", root)
	}
	if cfg.StateDir == "" {
		return nil, errors.New("node agent: StateDir is required")
	}
	state, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("node agent: state dir: %w", err)
	}
	if err := CheckStateDir(root, state); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	adopted, err := ClaimStateDir(state, cfg.Name)
	if err != nil {
		return nil, err
	}
	if adopted {
		LogAdopted(log, state, cfg.Name)
	}
	key, err := loadKey(state)
	if err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.HaveEvery <= 0 {
		cfg.HaveEvery = DefaultHaveEvery
	}
	if cfg.CheckFiles == 0 {
		cfg.CheckFiles = DefaultCheckFiles
	}
	cfg.Root, cfg.StateDir, cfg.Stream = root, state, cfg.Stream.WithDefaults()
	var pub publisher = store.NewPublisher(js, cfg.Stream.Subjects())
	if cfg.Faults.BeforePublish != nil {
		pub = faultyPublisher{next: pub, before: cfg.Faults.BeforePublish}
	}
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	return &Agent{
		retry:      retry,
		retryPace:  store.Backoff(min(retryFirst, cfg.Resync), min(retryMax, cfg.Resync)),
		nc:         nc,
		js:         js,
		cfg:        cfg,
		subj:       cfg.Stream.Subjects(),
		log:        log.With("node", cfg.Name),
		rt:         cfg.Runtime,
		key:        key,
		pub:        pub,
		tr:         tracing.Tracer(cfg.Tracing),
		haveKick:   make(chan struct{}, 1),
		ready:      make(chan struct{}),
		changeKick: make(chan struct{}, 1),
		health:     newHealthHold(cfg.HealthHold),
		lookAll:    true,
	}, nil
}

// inside reports whether dir is root or below it, after resolving
// symlinks in both.
// CheckStateDir refuses a state directory (the agent's key, its bundles
// and supervisors) inside the root, where a fill could overwrite the
// agent's key: an error naming both, absolute. It only reads paths
// (symlinks resolved where they exist) and creates nothing, so a caller
// checks before it makes either directory (a fresh user's finding L7:
// the refusal left --root/st created behind).
//
// Errors: the paths' filepath.Abs errors; the refusal.
func CheckStateDir(root, stateDir string) error {
	r, err := filepath.Abs(root)
	if err != nil {
		return fmt.Errorf("node agent: root: %w", err)
	}
	s, err := filepath.Abs(stateDir)
	if err != nil {
		return fmt.Errorf("node agent: state dir: %w", err)
	}
	if inside(r, s) {
		return fmt.Errorf("node agent: state dir %s is inside the root %s: a fill could overwrite the agent's key", s, r)
	}
	return nil
}

func inside(root, dir string) bool {
	r, err1 := filepath.EvalSymlinks(root)
	d, err2 := filepath.EvalSymlinks(dir)
	if err1 != nil || err2 != nil {
		r, d = root, dir
	}
	return d == r || strings.HasPrefix(d, r+string(os.PathSeparator))
}

// Ready is closed once the agent has started: its lease claimed, its
// first plan applied (or there was none). What fails before it is a
// start's failure (a permission the creds lack, say), not a running
// agent's.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Settled returns the stream sequence of the plan the agent judges writes
// by, 0 when it has settled none.
func (a *Agent) Settled() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.settledSeq
}

// Run runs the agent until ctx is done, then returns nil. It applies the
// node's newest plan, starts the fill service, follows newer plans and
// publishes haves (see the package documentation for the order of
// things). It can be called once per Agent.
//
// One agent speaks for a node: Run first claims the node's lease (the
// key <node> of the bucket <stream>_NODES, see [store.AcquireLease]),
// renews it while it runs and releases it when it stops. A second agent
// of the node is refused while the first is alive; after the first died
// without releasing it, the next one takes it at once on the same host
// (store.AcquireLease proves the pid dead), and waits for it to expire
// elsewhere (at most the bucket's TTL, 5 s by default).
//
// Errors: [ErrRunning]; the lease is held by another live agent (a
// [*store.HeldError] naming its host, pid and since, matching
// store.ErrLeaseHeld), also when another agent took it over while this
// one could not renew it; a renewal the server's permissions denied (an
// error matching store.ErrPermissionDenied, at once); the stream cannot
// be found; the root cannot be opened; the fill service cannot be
// registered.
func (a *Agent) Run(ctx context.Context) (rerr error) {
	if !a.started.CompareAndSwap(false, true) {
		return ErrRunning
	}
	root, err := saferoot.Open(a.cfg.Root)
	if err != nil {
		return fmt.Errorf("node agent: open root: %w", err)
	}
	defer root.Close()
	lease, err := a.claim(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	a.log.Info("node lease held", "ttl", lease.TTL())
	// An outage of NATS is said once by the lease, with what matters to
	// whoever reads the node's log: its modules do not stop.
	lease.SetOutageNote("the modules keep running")
	// ... and why the connection does not come back, when a server
	// answered (a TLS handshake failing on its expired certificate).
	lease.SetOutageCause(func() error { return store.ReconnectError(a.nc) })
	a.mu.Lock()
	a.root = root
	a.mu.Unlock()

	stopped := ctx // the caller's: done on a clean stop (SIGINT, SIGTERM)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		a.mu.Lock()
		a.root = nil
		a.mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		released := lease.Release(rctx)
		if released != nil {
			a.log.Warn("node lease not released; it expires after its TTL", "ttl", lease.TTL(), "err", released)
		}
		if stopped.Err() != nil && lease.Err() == nil {
			a.logStop(rctx, released == nil)
		}
	}()
	wg.Go(func() {
		select {
		case <-lease.Lost():
			if err := lease.Err(); errors.Is(err, store.ErrPermissionDenied) {
				// A denial is an answer, not an outage to ride out: the
				// key expires whatever is asked again. The modules keep
				// running, adopted by the next agent.
				a.log.Error("node lease not renewed: the server denies these credentials its key; stopping (the modules keep running)", "err", err)
			} else {
				a.log.Error("node lease taken by another agent: stopping", "err", err)
			}
			cancel()
		case <-ctx.Done():
		}
	})
	defer func() {
		if err := lease.Err(); err != nil && rerr == nil {
			rerr = fmt.Errorf("node agent: lease lost: %w", err)
		}
	}()

	// Asked until it answers (each ask bounded by the client's timeout):
	// an agent started while the cluster has no quorum (an upgrade in
	// place during an outage) ended 28 s after taking its lease on the
	// first unanswered ask, with "stream MESH: context deadline exceeded",
	// and its node stayed down (a fresh user's finding M6). Its modules
	// run on either way.
	stream, err := store.Retry(ctx, a.log, "look up stream "+a.cfg.Stream.Name, newBackoff(), func() (jetstream.Stream, error) {
		s, err := a.js.Stream(ctx, a.cfg.Stream.Name)
		if errors.Is(err, store.ErrPermissionDenied) || errors.Is(err, nats.ErrPermissionViolation) {
			return nil, backoff.Permanent(err)
		}
		return s, err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("node agent: stream %s: %w", a.cfg.Stream.Name, err)
	}
	a.sweepTemps()
	wg.Go(func() { a.haveLoop(ctx) })
	wg.Go(func() { a.checkLoop(ctx) })
	wg.Go(func() { a.answerReclaims(ctx, stream, lease) })
	if sup, ok := a.rt.(Supervisor); ok {
		wg.Go(func() { a.watchRuntime(ctx, sup) })
	}

	// The fill endpoint is registered before the first plan's settles
	// are published, so a provisioner reacting to them finds a responder;
	// its requests wait for ready (see serveFill).
	svc, err := a.serve(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = svc.Stop() }()
	from, err := a.startPlan(ctx, stream)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	close(a.ready)
	a.log.Info("node agent running", "fill_subject", a.subj.Fill(a.cfg.Name), "root", a.cfg.Root, "settled", a.Settled())
	a.follow(ctx, from, lease)
	return nil
}

// logStop says that the agent stops cleanly, and what it leaves: a
// stop by SIGINT or SIGTERM logged nothing, so a node's log could not tell
// it from a kill -9 (a fresh user's finding U24).
func (a *Agent) logStop(ctx context.Context, released bool) {
	lease := "lease released"
	if !released {
		lease = "lease left to expire"
	}
	left := "its modules keep running"
	if mods, err := a.rt.Running(ctx); err == nil {
		n := 0
		for _, m := range mods {
			if m.State == events.Running {
				n++
			}
		}
		left = fmt.Sprintf("%d of its %d modules keep running", n, len(mods))
		if n == len(mods) {
			left = fmt.Sprintf("%d modules keep running", n)
			if n == 1 {
				left = "1 module keeps running"
			}
		}
	}
	a.log.Info(fmt.Sprintf("node agent stopping: %s; %s (adopted at next start)", lease, left))
}

// claim claims the node's lease, retrying transient failures (the
// bucket not created yet, the server unreachable) until ctx is done.
func (a *Agent) claim(ctx context.Context) (*store.Lease, error) {
	l, err := store.Retry(ctx, a.log, "claim the node's lease", newBackoff(), func() (*store.Lease, error) {
		kv, err := store.OpenNodeLeases(ctx, a.js, a.cfg.Stream)
		if errors.Is(err, store.ErrPermissionDenied) {
			return nil, backoff.Permanent(err)
		}
		if err != nil {
			return nil, err
		}
		h := store.NewHolder("node", a.cfg.Name)
		h.Trusts = a.cfg.Trust.Keys() // its up event says them (events.Agent.Trusts)
		l, err := store.AcquireLease(ctx, kv, a.cfg.Name, h, a.log)
		if errors.Is(err, store.ErrLeaseHeld) || errors.Is(err, store.ErrPermissionDenied) {
			// A denial is the credentials' (another role's, a
			// revoked permission): asking again gets the same.
			return nil, backoff.Permanent(err)
		}
		if err == nil {
			a.mu.Lock()
			a.claimed = h.Token
			a.mu.Unlock()
		}
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("node agent: %w", err)
	}
	return l, nil
}

// startPlan applies the node's newest plan, read with a direct get, and
// returns its sequence (0 when the node has none). A transient read error
// is retried until ctx is done.
func (a *Agent) startPlan(ctx context.Context, stream jetstream.Stream) (uint64, error) {
	var looked uint64 // the stream's last sequence before the read
	m, err := store.Retry(ctx, a.log, "read the newest plan", newBackoff(), func() (store.Msg, error) {
		// The stream's last sequence first: a plan past it, which the
		// read may miss, is one the follow delivers; the have says so
		// (events.Have.LookedBefore), so that the reconciler does not
		// publish it again for a plan lost.
		last, err := store.StreamLastSeq(ctx, stream)
		if err != nil {
			return store.Msg{}, err
		}
		looked = last
		m, err := store.LastMsg(ctx, stream, a.subj, a.cfg.Name, events.KindPlan)
		if errors.Is(err, store.ErrNoMessage) {
			return m, backoff.Permanent(err)
		}
		return m, err
	})
	if errors.Is(err, store.ErrNoMessage) {
		a.log.Info("no plan yet: writes are judged with no provisioner account (plan 0)")
		a.mu.Lock()
		a.noPlan, a.lookedBefore = true, looked+1
		a.mu.Unlock()
		// Say so in a have: the reconciler publishes the node's plan
		// again if it has one (the stream's max-age removed it). A change's
		// have, at most one every HaveEvery: the start's first have may
		// have gone out before this read.
		select {
		case a.changeKick <- struct{}{}:
		default:
		}
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("node agent: newest plan: %w", err)
	}
	if err := a.verifyPlan(m); err != nil {
		a.refusePlan(ctx, m, err)
	} else {
		a.handlePlan(ctx, m)
	}
	return m.Event.Seq, nil
}

// verifyPlan is the agent's trust rule for a plan message m (DESIGN.md
// §3, signatures; docs/architecture.md, "Trust per deployment"): nil when
// it is to be applied. Its signature must verify against the trusted
// reconciler keys ([Config.Trust]; a retired key only until its overlap
// ends); its cause must be below its own stream sequence (an effect
// follows its cause: a plan claiming a later cause is no reconciler's);
// and it must be newer than the settled plan: a plan of a retired key is
// never newer than one of a current key, a current key's is always newer
// than a retired key's, and between plans of the same kind of key the
// cause decides (an older plan of the node, replayed, is not newer). Nil
// Trust accepts every plan.
func (a *Agent) verifyPlan(m store.Msg) error {
	if a.cfg.Trust == nil {
		return nil
	}
	if err := a.cfg.Trust.VerifyMsg(m); err != nil {
		return err
	}
	p, ok := m.Event.Payload.(*events.Plan)
	if !ok {
		return nil // not understood: handlePlan says so
	}
	if p.Cause >= m.Event.Seq {
		return fmt.Errorf("cause ahead: its cause %d is not below its own sequence %d", p.Cause, m.Event.Seq)
	}
	retired := a.cfg.Trust.Retired(m.Signer)
	a.mu.Lock()
	settled, settledSeq, settledRetired := a.settled, a.settledSeq, a.settledRetired
	a.mu.Unlock()
	switch {
	case settled == nil:
	case retired && !settledRetired:
		return fmt.Errorf("retired key: signed by %s, retired, after the settled plan %d of a current key: a retired key's plan is never newer", m.Signer, settledSeq)
	case !retired && settledRetired:
	case p.Cause <= settled.Cause:
		return fmt.Errorf("replayed: its cause %d is not newer than the settled plan's (%d)", p.Cause, settled.Cause)
	}
	return nil
}

// refusePlan logs a plan verifyPlan refused, with why, and reports it with
// a failed settle naming it, which the reconciler journals. It is never
// applied. A refusal for the plan's signer (a key not trusted, or retired
// past its overlap) is marked Untrusted: the reconciler publishes its plan
// again under its current key (after a key rotation, an agent that
// restarts re-verifies its newest plan, of the old key).
func (a *Agent) refusePlan(ctx context.Context, m store.Msg, err error) {
	a.log.Error("plan refused: not from a trusted reconciler; not applied", "plan", m.Event.Seq, "settled", a.Settled(), "err", err)
	untrusted := errors.Is(err, store.ErrUntrusted) || errors.Is(err, store.ErrRetired)
	why := "plan refused: not from a trusted reconciler: " + err.Error()
	if untrusted && a.cfg.TrustFrom != "" {
		// The agent reads its keys once (a fresh user's finding U12: after
		// serve's key changed, its journal did not say a restart reads
		// --trust-from's file again).
		why += " (this agent read its keys from " + a.cfg.TrustFrom + " when it started, and only then: restart it to read them again)"
	}
	a.publish(ctx, events.Stamp(&events.Settle{Module: "", Op: events.OpFailed, Plan: m.Event.Seq,
		Error: why, Untrusted: untrusted}, time.Now()), store.WithMsgID(nuid.Next()))
}

// follow applies the node's plans after sequence from until ctx is done
// (store.FollowNode): each is verified as it arrives, and of plans
// stored while the agent was busy (or away) only the newest accepted one
// is applied. A skipped plan never settles, which the reconciler expects
// of superseded plans. A plan whose apply failed is tried again, 1 s
// after the failure doubling to 1 min (at most Resync), until it
// settles or a newer plan replaces it. While its feed is lost, its lease
// says since when (store.Holder.FeedLost), for `fleet` and `state`.
func (a *Agent) follow(ctx context.Context, from uint64, lease *store.Lease) {
	defer a.retry.Stop()
	store.FollowNode(ctx, a.js, store.NodeFollow{
		Stream: a.cfg.Stream, Node: a.cfg.Name, Kind: events.KindPlan, After: from,
		Verify:  a.verifyPlan,
		Refused: a.refusePlan,
		Handle:  a.handlePlan,
		Latest:  true,
		Tick:    a.retry.C,
		OnTick: func(ctx context.Context) {
			if a.failed != nil {
				a.log.Info("retrying the failed plan", "plan", a.failed.Event.Seq)
				a.handlePlan(ctx, *a.failed)
			}
		},
		// Backoff: store.FeedBackoff's, jittered, so that a fleet's
		// agents that lost their feeds together (a meta leader lost)
		// do not ask for new consumers together (a fresh user's
		// finding M8).
		Lost: lease.SetFeedLost,
		Log:  a.log,
	})
}

// change is one module the apply of a plan changed.
type change struct {
	module string
	op     events.SettleOp
}

// handlePlan applies one plan message and publishes its settles (see the
// package documentation).
func (a *Agent) handlePlan(ctx context.Context, m store.Msg) {
	ev := m.Event
	log := a.log.With("plan", ev.Seq)
	if ev.Err != nil {
		log.Error("plan not understood; writes are still judged by the settled plan", "settled", a.Settled(), "err", ev.Err)
		return
	}
	p, ok := ev.Payload.(*events.Plan)
	if !ok {
		log.Error("not a plan; skipped", "kind", ev.Kind)
		return
	}
	if ev.Seq <= a.Settled() {
		return
	}
	// From here the agent holds a plan of the stream: its haves sent while
	// it applies it no longer say it holds none (a fresh user's finding:
	// `audit` said "holds no plan" of the have of the modules the plan
	// had just started, before its settle).
	a.mu.Lock()
	a.noPlan = false
	a.mu.Unlock()
	ctx, span := a.startSpan(ctx, m.Header, "apply plan", trace.SpanKindConsumer,
		tracing.SeqAttr(tracing.Seq, ev.Seq), tracing.SeqAttr(tracing.Cause, p.Cause))
	defer span.End()
	changes, failedModule, err := a.apply(ctx, p)
	if err != nil {
		span.SetStatus(codes.Error, "apply failed")
		if ctx.Err() != nil {
			return // stopping: the next start applies the plan again
		}
		if a.failed == nil || a.failed.Event.Seq != ev.Seq {
			a.retryPace.Reset() // a new plan: its retries start at the first interval
			a.failedSaid = ""
		}
		a.failed = &m
		wait := a.retryPace.NextBackOff()
		a.retry.Reset(wait)
		msg := events.Cut(err.Error(), events.MaxText)
		log.Error("apply failed; writes are still judged by the settled plan", "module", failedModule, "settled", a.Settled(), "retry_in", wait.Round(time.Millisecond), "err", err)
		// One failed settle per plan and failure: a retry failing the
		// same way says nothing new, and would journal it every minute.
		if said := failedModule + "\x00" + msg; said != a.failedSaid {
			a.failedSaid = said
			a.publish(ctx, events.Stamp(&events.Settle{Module: failedModule, Op: events.OpFailed, Plan: ev.Seq, Error: msg}, time.Now()),
				store.WithMsgID(nuid.Next()))
		}
		if len(changes) > 0 {
			a.kickHave()
		}
		return
	}
	a.failed, a.failedSaid = nil, ""
	a.retry.Stop()

	// The switch, under the judging lock; only then the settles.
	a.mu.Lock()
	a.settled, a.settledSeq = p, ev.Seq
	a.settledRetired = a.cfg.Trust.Retired(m.Signer)
	a.noteFiles(p)
	for i := range p.Modules {
		// A fill judged by the plan before it may have written the old
		// owner or mode since the apply refitted them.
		a.refitFiles(&p.Modules[i])
	}
	// The agent's first settled plan: its look at the files, before any
	// fill it serves at its start (they wait for ready), reports what a
	// reboot took at once, not at the next have.
	gone := a.lookAll && a.root != nil && a.startLook()
	a.mu.Unlock()

	changed := len(changes) // the log says what the settles say: 0 for "no module changed"
	if changed == 0 {
		changes = []change{{module: "", op: events.OpApply}}
	}
	for _, c := range changes {
		s := events.Stamp(&events.Settle{Module: c.module, Op: c.op, Plan: ev.Seq}, time.Now())
		if _, err := a.publish(ctx, s, store.WithMsgID(nuid.Next())); err != nil {
			return // stopping
		}
	}
	log.Info("plan settled", "changed", changed, "account", p.ProvisionerAccount)
	if changes[0].module != "" || gone {
		a.kickHave()
	}
}

// apply makes the runtime run p: composed rows that differ from what runs
// are applied in the plan's order, then modules the plan has no row for
// are removed in name order. Held rows are left as they run. It returns
// what it changed, and on failure the module that failed and why.
func (a *Agent) apply(ctx context.Context, p *events.Plan) (changes []change, failedModule string, err error) {
	running, err := a.rt.Running(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("read what runs: %w", err)
	}
	runs := make(map[string]events.HaveModule, len(running))
	for _, m := range running {
		runs[m.Name] = m
	}
	for _, row := range p.Modules {
		if row.Held {
			continue // keep it as it runs (empty build: nothing runs; neither start nor remove)
		}
		// Before the module (re)starts as its account: its files are
		// already that account's, in their declared mode.
		a.mu.Lock()
		a.refitFiles(&row)
		a.mu.Unlock()
		account := row.RunsAs
		if am, ok := a.rt.(AccountMapper); ok {
			account = am.RunningAs(row.RunsAs)
		}
		if cur, ok := runs[row.Name]; ok && cur.State == events.Running && cur.Build == row.Build && cur.Account == account {
			continue
		}
		mctx, span := tracing.Start(ctx, a.tr, "start module", trace.WithAttributes(tracing.Module.String(row.Name), tracing.Build.String(row.Build)))
		err := a.rt.Apply(mctx, row)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		if err != nil {
			return changes, row.Name, err
		}
		a.log.Info("module applied", "module", row.Name, "build", row.Build, "account", row.RunsAs)
		changes = append(changes, change{module: row.Name, op: events.OpApply})
	}
	var gone []string
	for name := range runs {
		if p.Module(name) == nil {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone)
	for _, name := range gone {
		mctx, span := tracing.Start(ctx, a.tr, "remove module", trace.WithAttributes(tracing.Module.String(name)))
		err := a.rt.Remove(mctx, name)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		if err != nil {
			return changes, name, err
		}
		a.forgetFiles(name)
		a.log.Info("module removed", "module", name)
		changes = append(changes, change{module: name, op: events.OpRemove})
	}
	return changes, "", nil
}

// answerReclaims answers each re-claim of the node's lease
// (store.Lease.Reclaimed) with answerReclaim, until ctx is done.
func (a *Agent) answerReclaims(ctx context.Context, stream jetstream.Stream, lease *store.Lease) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-lease.Reclaimed():
		}
		a.answerReclaim(ctx, stream, lease.TTL())
	}
}

// answerReclaim publishes a have after a re-claim of the node's lease, so
// that one follows the down a reconciler may have recorded for its expiry
// (a fresh user's finding, G1: the bucket's leader crashed, no renewal
// was stored for the TTL, every agent was recorded down while it lived).
// A have stored before that down is stale to a rollout ("its agent has
// reported no have since it was down"), and nothing else makes the agent
// publish one while nothing changes on the node: a target's healthy
// window never began again, it failed at its healthy_deadline and
// auto_revert reverted a healthy build. The node's newest agent event is
// read first and the have kicked after (a down stored before that read
// precedes the have); then, for 2×TTL + store.MaxReconnectDelay (the
// longest a reconciler that judged the expiry before the re-claim takes
// to store its down), the newest agent event is read every TTL/4, and a
// newer one is answered with one more have. A down is recorded by the
// reconciler, not known here: without one the haves are only a resync's.
func (a *Agent) answerReclaim(ctx context.Context, stream jetstream.Stream, ttl time.Duration) {
	end := time.Now().Add(2*ttl + store.MaxReconnectDelay)
	pace := max(ttl/4, 100*time.Millisecond)
	newest := func() (uint64, bool) {
		gctx, cancel := context.WithTimeout(ctx, pace)
		defer cancel()
		m, err := store.LastMsg(gctx, stream, a.subj, a.cfg.Name, events.KindAgent)
		switch {
		case errors.Is(err, store.ErrNoMessage):
			return 0, true
		case err != nil:
			return 0, false
		}
		return m.Event.Seq, true
	}
	first, read := newest()
	if read {
		a.log.Info("node lease claimed again after it expired: publishing a have, after the down a reconciler may have recorded")
		a.kickHave()
	}
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pace): // the reads' pace, not a wait for an event
		}
		seq, ok := newest()
		switch {
		case !ok:
		case !read:
			first, read = seq, true
			a.log.Info("node lease claimed again after it expired: publishing a have, after the down a reconciler may have recorded")
			a.kickHave()
		case seq > first:
			a.log.Info("node agent event recorded after the lease's re-claim: publishing a have after it", "seq", seq)
			a.kickHave()
			return
		}
	}
	if !read {
		a.kickHave() // the newest agent event never read: a have anyway
	}
}

func (a *Agent) kickHave() {
	select {
	case a.haveKick <- struct{}{}:
	default:
	}
}

// haveLoop publishes a full have on start, after every applied plan
// (kickHave: at once, the reconciler waits on it), every Resync, on
// every change a Supervisor runtime reports (kickChange: at most one every
// HaveEvery, so a crash loop is bounded), and when a module's held
// recovery ends (healthHold: paced as a change), until ctx is done.
// Changes that arrive while it waits are folded into the next have.
func (a *Agent) haveLoop(ctx context.Context) {
	tick := time.NewTicker(a.cfg.Resync)
	defer tick.Stop()
	hold := time.NewTimer(time.Hour)
	defer hold.Stop()
	var last time.Time // when the last have was stored
	onChange := false  // the next have is for a change: skipped when it says nothing new
have:
	for {
		for _, c := range []chan struct{}{a.haveKick, a.changeKick} {
			select {
			case <-c: // this have reads what runs now
			default:
			}
		}
		if a.publishHave(ctx, onChange) {
			last = time.Now()
		}
		onChange = false
	wait:
		for {
			hold.Stop()
			if due := a.health.due(); !due.IsZero() {
				hold.Reset(time.Until(due))
			}
			select {
			case <-ctx.Done():
				return
			case <-a.haveKick:
				continue have
			case <-tick.C:
				continue have
			case <-a.changeKick:
				break wait
			case now := <-hold.C:
				// A check that failed within its hold moved its end
				// (or ended it): nothing to report yet.
				if due := a.health.due(); !due.IsZero() && !now.Before(due) {
					break wait
				}
			}
		}
		onChange = true
		if wait := a.cfg.HaveEvery - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-a.haveKick:
				t.Stop()
				onChange = false
			}
		}
	}
}

// publishHave reads what runs and publishes it, retrying (and reading
// again) until the stream acknowledges or ctx is done; it reports whether
// a have was stored. A have for a change (onChange) that says what the
// last have stored said is not published: a change the have does not
// show (a process's pid, a check's recovery still held) adds nothing to
// the stream.
func (a *Agent) publishHave(ctx context.Context, onChange bool) bool {
	id := nuid.Next()
	skipped := false
	atStart := false      // the have stored carries what the first look found gone
	var said *events.Have // the have stored
	_, err := store.Retry(ctx, a.log, "publish have", newBackoff(), func() (store.Ack, error) {
		mods, err := a.rt.Running(ctx)
		if err != nil {
			return store.Ack{}, fmt.Errorf("read what runs: %w", err)
		}
		mods = a.health.report(mods, time.Now())
		missing := a.missingFiles(mods)
		a.mu.Lock()
		noPlan := a.noPlan
		h := &events.Have{Modules: mods, NoPlan: noPlan, Missing: missing}
		atStart = slices.ContainsFunc(missing, func(m events.MissingFile) bool { return m.AtStart })
		if atStart {
			h.Started = a.claimed
		}
		if noPlan {
			h.LookedBefore = a.lookedBefore
		}
		a.mu.Unlock()
		if onChange && sameHave(h, a.lastHave) {
			skipped = true
			return store.Ack{}, nil
		}
		h = events.Stamp(h, time.Now())
		ack, err := a.pub.Append(ctx, a.cfg.Name, h, store.WithMsgID(id))
		if errors.Is(err, events.ErrInvalid) {
			return ack, backoff.Permanent(err)
		}
		said = h
		return ack, err
	})
	if err != nil && ctx.Err() == nil {
		a.log.Error("have not published", "err", err)
	}
	if err != nil || skipped {
		return false
	}
	a.lastHave = said
	a.health.stored(said.Modules, time.Now())
	if atStart {
		a.startReported()
	}
	return true
}

// sameHave reports whether have h says what have last says (its modules,
// their runtime, the files missing, the plan it holds); nil last: no.
func sameHave(h, last *events.Have) bool {
	if last == nil || h.NoPlan != last.NoPlan || h.LookedBefore != last.LookedBefore || h.Started != last.Started ||
		!slices.Equal(h.Missing, last.Missing) {
		return false
	}
	return slices.EqualFunc(h.Modules, last.Modules, func(a, b events.HaveModule) bool {
		as, bs := a.Since, b.Since
		a.Since, b.Since = nil, nil
		return a == b && (as == nil) == (bs == nil) && (as == nil || as.Equal(*bs))
	})
}

// publish appends p, retrying with backoff until the stream acknowledges
// it or ctx is done. A validation error is not retried. Traced, the
// append is a span ("publish <kind>", a child of ctx's) whose
// traceparent the event carries.
func (a *Agent) publish(ctx context.Context, p events.Payload, opts ...store.AppendOpt) (store.Ack, error) {
	var span trace.Span
	if a.tr != nil {
		ctx, span = a.tr.Start(ctx, "publish "+string(p.Kind()), trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(tracing.Node.String(a.cfg.Name), tracing.Kind.String(string(p.Kind())), tracing.SeqAttr(tracing.Plan, planOf(p))))
		defer span.End()
		opts = append(opts, store.WithTraceparent(tracing.Traceparent(ctx)))
	}
	ack, err := store.Retry(ctx, a.log, "publish "+string(p.Kind()), newBackoff(), func() (store.Ack, error) {
		ack, err := a.pub.Append(ctx, a.cfg.Name, p, opts...)
		if errors.Is(err, events.ErrInvalid) {
			return ack, backoff.Permanent(err)
		}
		return ack, err
	})
	if err != nil && ctx.Err() == nil {
		a.log.Error("event not published", "kind", p.Kind(), "err", err)
	}
	if span != nil {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(tracing.SeqAttr(tracing.Seq, ack.Seq))
		}
	}
	return ack, err
}

// planOf is the plan an event the agent publishes is judged by (0 for
// other kinds).
func planOf(p events.Payload) uint64 {
	switch p := p.(type) {
	case *events.Settle:
		return p.Plan
	case *events.Refusal:
		return p.Plan
	case *events.Filled:
		return p.Plan
	}
	return 0
}

// startSpan starts a span named name under h's traceparent (a plan's, a
// fill request's), with the node's name among attrs; a nil tracer
// starts none.
func (a *Agent) startSpan(ctx context.Context, h nats.Header, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if a.tr == nil {
		return tracing.Start(ctx, nil, name)
	}
	return a.tr.Start(tracing.Extract(ctx, h), name, trace.WithSpanKind(kind),
		trace.WithAttributes(append(attrs, tracing.Node.String(a.cfg.Name))...))
}

// newBackoff is the agent's retry pacing: 100 ms doubling to 5 s, ±50 %
// jitter, no time limit (the caller's context bounds it).
func newBackoff() *backoff.ExponentialBackOff {
	return store.Backoff(100*time.Millisecond, 5*time.Second)
}
