package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/engine/rollouts"
	"github.com/meshfold/meshfold/store"
)

// Why [Serve] stopped, beside store.ErrConnClosed and the errors of
// HoldStream and JoinGroup.
var (
	// ErrStreamLeaseLost: another process took the stream lease of this
	// ungrouped reconciler (it was not renewed within its TTL, as after a
	// long pause), or the server's permissions denied its renewal (the
	// error then wraps a *store.DeniedError naming the subject, and
	// matches store.ErrPermissionDenied); the reconciler stopped at once.
	ErrStreamLeaseLost = errors.New("stream lease lost")
	// ErrMetricsListen: the metrics address could not be listened on.
	ErrMetricsListen = errors.New("metrics listener")
)

// Config configures [Serve]. Stream is the stream wanted; every other
// field is optional.
type Config struct {
	// Stream is the stream wanted: created, or adopted with the changes
	// that may be made, by store.EnsureStream. Zero fields take the
	// defaults, or an existing stream's values.
	Stream store.StreamConfig
	// Logger receives the lifecycle's lines ("reconciler running",
	// "reconciler stopped; ...") and the loop's; nil discards them.
	Logger *slog.Logger
	// Signer and Own: as [ReconcilerConfig].
	Signer *store.Signer
	Own    *store.Trust
	// Tracing: as [ReconcilerConfig]; nil traces nothing.
	Tracing trace.TracerProvider
	// SnapshotEvery and SnapshotInterval: as [ReconcilerConfig] (0: the
	// defaults).
	SnapshotEvery    int
	SnapshotInterval time.Duration

	// Group, when set, makes this instance a member of the reconciler
	// group of that name ([JoinGroup]): it folds the partitions the
	// group grants it, and answers state requests for their nodes only.
	// Empty: the reconciler folds every partition alone, holding the
	// stream lease ([HoldStream]) while it runs.
	Group string
	// Instance names this member in Group (default "<hostname>-<pid>").
	Instance string
	// LeaseTTL is the lease bucket's TTL when this instance creates it:
	// the longest a hung instance, or one that died on another host,
	// keeps its partitions or the stream lease (0: [DefaultLeaseTTL]; an
	// existing bucket's TTL wins). One that died on this host is
	// replaced at once (store.AcquireLease).
	LeaseTTL time.Duration

	// MetricsAddr, when set, serves the Prometheus metrics (the loop's,
	// its state gauges, Go's and the process's) on HOST:PORT at
	// /metrics. Empty: not served (still counted).
	MetricsAddr string
	// Pprof also serves Go's profiles at /debug/pprof/ on MetricsAddr's
	// listener; they expose the reconciler's internals. Needs
	// MetricsAddr.
	Pprof bool

	// Ready, when set, is called once everything is up (the stream, the
	// lease or the membership, the reconciler, the state service, whose
	// subscriptions the server has confirmed), just
	// before the reconciler starts folding, with the context Serve runs
	// under (it ends when Serve is stopping) and the reconciler
	// (Reconciler.Stream is the stream's effective configuration). It
	// runs on Serve's goroutine: start anything long from it in a
	// goroutine of its own.
	Ready func(ctx context.Context, r *Reconciler)

	// NoRollouts: do not run the rollout controller (package
	// engine/rollouts) beside the reconciler. By default it runs: one
	// controller per fleet across every serve and reconcile process of
	// the stream, each fleet's held by a lease in the lease bucket
	// (DESIGN.md §11).
	NoRollouts bool
	// StoreStatus, when set, is what the state service answers on
	// events.StateSubject(prefix, events.EndpointState,
	// store.StoreStatusName): the embedded server's watch of its data
	// directory (meshfold serve). Nil: it answers {"watched": false}.
	StoreStatus func() store.StoreStatus
	// WritesConn, when set, is the connection the reconciler writes its
	// effects and snapshots on (ReconcilerConfig.Writes); Serve neither
	// drains nor closes it, and it may be nc itself (one connection for
	// everything, as before 5 December: its partitions' reads then now
	// and then wait out two missed heartbeats). Nil: Serve opens one with
	// nc's options (store.Companion), named after nc (its name and
	// " writes": "meshfold reconcile writes"), and closes it when it
	// returns. See docs/architecture.md, "The reconciler writes on a
	// connection of its own".
	WritesConn *nats.Conn

	// RolloutConn, when set, is the connection the rollout controller
	// reads the stream, holds its leases and publishes wants on: under
	// decentralized auth, one of the controller user (store/auth's
	// controller role), since the reconciler's user may not publish
	// wants. Serve neither drains nor closes it. Nil: the controller
	// runs on the reconciler's connection (a server without auth).
	RolloutConn *nats.Conn
}

// Serve runs the reconciler on nc until ctx ends or a fatal error, as a
// `meshfold serve` or `meshfold reconcile` process does (DESIGN.md §7),
// writing its effects and snapshots on a second connection
// (cfg.WritesConn, else one it opens with nc's options). In
// order, it: ensures the stream (cfg.Stream); serves the metrics when
// cfg.MetricsAddr is set; then at once opens the node agents' lease
// bucket and the secrets' and fill statuses' buckets, joins cfg.Group or
// else claims the stream lease (waiting out a dead holder's, at most its
// TTL), and, ungrouped, opens the reconciler and the snapshot bucket (a
// member's once its group is joined); starts the state service (partial
// in a group) and the rollout controller; calls cfg.Ready; and folds,
// only once all of that is done. When ctx
// ends it stops gracefully: the last snapshots are written, then the
// group's leases or the stream lease are released, and Serve returns nil.
// It logs how it stopped ("snapshots written" only when every partition's
// final snapshot was).
//
// Errors: store.ErrConnClosed (wrapping the connection's last error)
// when nc or the writes' connection closes for good, whatever else
// failed; the writes' connection's first connect failing;
// [ErrStreamLeaseLost]
// (wrapping the lease's error) when another process took the stream
// lease or the server denied its renewal (then also matching
// store.ErrPermissionDenied); in a group, an error matching
// store.ErrPermissionDenied when the server denied the member key's
// renewal (see [Group.Run]); [ErrBesideGroup] or [ErrBesideUngrouped] when another reconciler
// folds the stream; [ErrMetricsListen] wrapping the listen error; the
// stream's (store.ErrIncompatibleStream), the buckets' and the group's
// errors; the state service's. A ctx that ends while the stream lease
// is awaited returns nil.
func Serve(ctx context.Context, nc *nats.Conn, cfg Config) error {
	if cfg.Pprof && cfg.MetricsAddr == "" {
		return errors.New("engine: Pprof needs MetricsAddr: the profiles are served on its listener")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	wc := cfg.WritesConn
	if wc == nil {
		// Opened before anything chains handlers of its own onto nc's
		// (WhileConnected's, the publisher's denials): the companion
		// takes nc's handlers as they are, the ones its caller set.
		var err error
		if wc, err = store.Companion(nc, writesConnName(nc)); err != nil {
			return err
		}
		defer wc.Close()
	}
	return store.WhileConnected(ctx, nc, func(ctx context.Context) error {
		if wc == nc {
			return serve(ctx, nc, nc, cfg)
		}
		return store.WhileConnected(ctx, wc, func(ctx context.Context) error { return serve(ctx, nc, wc, cfg) })
	})
}

// writesConnName names the connection Serve opens to write on: nc's name
// and " writes" ("meshfold reconcile writes" beside "meshfold
// reconcile"), so that the server's connection list tells them apart.
func writesConnName(nc *nats.Conn) string {
	name := nc.Opts.Name
	if name == "" {
		name = "meshfold"
	}
	return name + " writes"
}

// publishAsyncTimeout bounds how long the JetStream context Serve makes
// (newJetStream) keeps an asynchronous publish waiting for its answer
// (jetstream.WithPublishAsyncTimeout): past it the publish's future
// fails with jetstream.ErrAsyncPublishTimeout (store.Unanswered,
// resendable) and leaves the client's pending publishes. Without it,
// nats.go keeps a publish whose answer was lost (the leader that had it
// killed while the client stayed connected to another server) pending for
// good: its future never resolves, and it holds one of the connection's
// pending slots (4,000) for the connection's life; a session's wait is
// bounded by ackTimeout and sends it again, each resend adding one
// (docs/architecture.md, "Every wait of a partition session is
// bounded"). Twice ackTimeout, so that a session's own wait, and its
// ride-out's rules, decide first.
const publishAsyncTimeout = 2 * ackTimeout

// newJetStream returns the JetStream context Serve's roles share, with
// the publish-async timeout (publishAsyncTimeout).
func newJetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	return newJetStreamWithin(nc, publishAsyncTimeout)
}

// newJetStreamWithin is newJetStream with the publish-async timeout
// given (a test's shorter one, its own: a package variable was every
// test's).
func newJetStreamWithin(nc *nats.Conn, publishAsync time.Duration) (jetstream.JetStream, error) {
	return jetstream.New(nc, jetstream.WithPublishAsyncTimeout(publishAsync))
}

func serve(ctx context.Context, nc, wc *nats.Conn, c Config) error {
	log := c.Logger
	js, err := newJetStream(nc)
	if err != nil {
		return err
	}
	writes := js
	if wc != nc {
		if writes, err = newJetStream(wc); err != nil {
			return err
		}
	}
	// The start waits, within its bounds, for a cluster just started or
	// electing a leader, and says so once: "waiting for …" rather than
	// nothing until a bound's end.
	var waitSaid sync.Once
	startCtx := store.WithWaitNote(ctx, func(err error) {
		waitSaid.Do(func() { log.Info("waiting for "+store.WaitingFor(err), "err", err) })
	})
	sctx, cancel := context.WithTimeout(startCtx, 30*time.Second)
	stream, scfg, was, err := store.EnsureStreamSaying(sctx, js, c.Stream)
	cancel()
	if err != nil {
		return err
	}
	if was != nil {
		// The stream is every reconciler's and reader's: one start's
		// --max-age or --max-bytes changes what all of them keep, and a
		// shorter one drops events at once (a fresh user's finding m4:
		// a group member's --max-age changed it without a word).
		log.Warn(fmt.Sprintf("stream %s's retention changed by this start's --max-age/--max-bytes: it kept %s, it keeps %s from now on, for every reconciler and reader of the stream; an instance started without them keeps the stream's",
			scfg.Name, was.Keeps(), scfg.Keeps()), "stream", scfg.Name, "was_max_age", was.MaxAge, "max_age", scfg.MaxAge,
			"was_max_bytes", was.MaxBytes, "max_bytes", scfg.MaxBytes)
	}
	reg := prometheus.NewRegistry()
	// go_gc_heap_live_bytes (the heap the last collection marked live)
	// beside the classic memstats: the memory per node of issue 17 is read
	// from it.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := NewMetrics(reg)
	if c.MetricsAddr != "" {
		stop, err := serveMetrics(c.MetricsAddr, c.Pprof, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	rcfg := ReconcilerConfig{Stream: scfg, Logger: log, Signer: c.Signer, Own: c.Own, Tracing: c.Tracing,
		Metrics: metrics, SnapshotEvery: c.SnapshotEvery, SnapshotInterval: c.SnapshotInterval, Writes: writes}
	st, err := startUp(startCtx, js, stream, scfg, rcfg, c)
	if st.lease != nil {
		lease := st.lease
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if !nc.IsConnected() && scfg.Replicas <= 1 {
				// Its server is gone and no other holds the bucket:
				// a delete would wait out rctx unanswered. A successor
				// on this host takes a dead holder's lease at once.
				lease.Abandon()
				log.Warn("stream lease not released: its server is gone; it expires after its TTL", "ttl", lease.TTL())
				return
			}
			if err := lease.Release(rctx); err != nil {
				log.Warn("stream lease not released; it expires after its TTL", "ttl", lease.TTL(), "err", err)
			}
		}()
	}
	if err != nil {
		if st.leaseErr && ctx.Err() != nil {
			return nil // stopped while the stream lease was awaited
		}
		return err
	}
	nodeLeases, group, lease := st.nodeLeases, st.group, st.lease
	r := st.r
	if group != nil {
		// A member's reconciler takes its grants: made once the group is
		// joined.
		rcfg.Grants = group.Grants()
		if r, err = newReconciler(ctx, js, rcfg, stream); err != nil {
			return err
		}
	}
	reg.MustRegister(r.StateCollector())
	// In a group each instance knows only its partitions' nodes: every
	// instance hears every request and the owner answers, "unknown"
	// too for a node it has no state of.
	svc, err := AddStateService(nc, r.Node, StateServiceConfig{Prefix: scfg.Prefix, Partial: group != nil, Unknown: r.Unknown, StoreStatus: c.StoreStatus})
	if err != nil {
		return err
	}
	defer svc.Stop()
	// Ready means answering: the service's subscriptions are on the
	// server. The rollout controller's start (a lookup of the lease
	// bucket) goes meanwhile: one round trip after the other, they were
	// two of a restart's start-up (issue 27).
	flushed := make(chan error, 1)
	go func() { flushed <- nc.FlushTimeout(5 * time.Second) }()
	if !c.NoRollouts {
		stop, err := startRollouts(ctx, js, scfg, c)
		if err != nil {
			<-flushed
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		defer stop()
	}
	if err := <-flushed; err != nil {
		log.Warn("state service not confirmed by the server yet", "err", err)
	}
	if c.Ready != nil {
		c.Ready(ctx, r)
	}
	// Agent liveness: every instance watches every node's lease and
	// records its transitions (each once, whoever records it first).
	actx, stopAgents := context.WithCancel(ctx)
	agentsDone := make(chan struct{})
	go func() {
		defer close(agentsDone)
		_ = r.watchAgents(actx, nodeLeases)
	}()
	defer func() { stopAgents(); <-agentsDone }()
	if group != nil {
		log.Info("reconciler running in a group", "stream", scfg.Name, "partitions", scfg.Partitions,
			"group", c.Group, "instance", group.Instance(), "lease_ttl", group.TTL())
		if err := runGrouped(ctx, group, r); err != nil || nc.IsClosed() || wc.IsClosed() {
			return err // a closed connection released nothing: Serve says so
		}
		if group.Released() {
			logStopped(log, r, ", leases released")
		} else {
			logStopped(log, r, ", leases left to expire after their TTL")
		}
		return nil
	}
	log.Info("reconciler running", "stream", scfg.Name, "partitions", scfg.Partitions, "lease_ttl", lease.TTL())
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-lease.Lost():
			if err := lease.Err(); errors.Is(err, store.ErrPermissionDenied) {
				// Its key expires after the TTL whatever it does: it
				// stops while the key still holds, rather than fold on
				// unfenced (docs/architecture.md, "A denied renewal
				// ends the lease").
				log.Error("stream lease not renewed: the server denies these credentials its key; stopping", "err", err)
			} else {
				log.Error("stream lease taken by another reconciler: stopping", "err", err)
			}
			stop()
		case <-rctx.Done():
		}
	}()
	if err := r.Run(rctx); err != nil || nc.IsClosed() || wc.IsClosed() {
		return err
	}
	if err := lease.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrStreamLeaseLost, err)
	}
	logStopped(log, r, "")
	return nil
}

// started is what startUp opened: the node agents' lease bucket, the
// stream lease (ungrouped) or the group joined, and the reconciler
// (ungrouped: a member's is made once its group is joined). leaseErr
// says the error startUp returned is the stream lease's.
type started struct {
	nodeLeases jetstream.KeyValue
	lease      *store.Lease
	group      *Group
	r          *Reconciler
	leaseErr   bool
}

// errStartFailed ends the steps of startUp still under way once one
// has failed.
var errStartFailed = errors.New("another step of the start failed")

// startUp opens, at once, what the reconciler needs once its stream is
// ensured (issue 27: one after the other they were a round trip each of
// every start, a cold refold's fixed costs): the node agents' lease
// bucket and the sealed secrets' and fill statuses' buckets (created
// here, where the credentials may create them: a node's and a
// provisioner's may not, DESIGN.md §12), the stream lease (HoldStream,
// ungrouped; waiting out a dead holder's) or the group's membership
// (JoinGroup), and, ungrouped, the reconciler (its snapshot bucket and
// effect key; the stream as EnsureStream returned it). Folding begins
// only after all of them, the lease held, as when they ran in turn.
// The first step that fails ends the others; the error returned is the
// first of the failed steps in the order above (one ended only because
// another failed is not counted), as when they ran in turn. A lease
// taken is returned with an error too, for the caller to release.
func startUp(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, scfg store.StreamConfig, rcfg ReconcilerConfig, c Config) (started, error) {
	var st started
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	const (
		stepNodes = iota
		stepSecrets
		stepFills
		stepLease
		stepReconciler
		steps
	)
	var errs [steps]error
	var wg sync.WaitGroup
	step := func(i int, f func(ctx context.Context) error) {
		wg.Go(func() {
			if err := f(sctx); err != nil {
				errs[i] = err
				cancel(errStartFailed)
			}
		})
	}
	// Each bucket's open asks its lookup and creation again while
	// unanswered (store.AskAgain: a meta leader's or the bucket leader's
	// election after a kill -9), within the 30 s.
	bucket := func(i int, open func(ctx context.Context) error) {
		step(i, func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return open(ctx)
		})
	}
	bucket(stepNodes, func(ctx context.Context) (err error) {
		st.nodeLeases, err = store.OpenNodeLeases(ctx, js, scfg)
		return err
	})
	bucket(stepSecrets, func(ctx context.Context) error {
		_, err := store.OpenSecrets(ctx, js, scfg, true)
		return err
	})
	bucket(stepFills, func(ctx context.Context) error {
		_, err := store.OpenFillStatus(ctx, js, scfg, true)
		return err
	})
	if c.Group != "" {
		bucket(stepLease, func(ctx context.Context) (err error) {
			st.group, err = JoinGroup(ctx, js, GroupConfig{Stream: scfg, Name: c.Group,
				Instance: c.Instance, TTL: c.LeaseTTL, Logger: c.Logger})
			return err
		})
	} else {
		// One ungrouped reconciler per stream, and none beside a group.
		step(stepLease, func(ctx context.Context) (err error) {
			st.lease, err = HoldStream(ctx, js, scfg, c.LeaseTTL, c.Logger)
			return err
		})
		step(stepReconciler, func(ctx context.Context) (err error) {
			st.r, err = newReconciler(ctx, js, rcfg, stream)
			return err
		})
	}
	wg.Wait()
	ours := context.Cause(sctx) == errStartFailed && ctx.Err() == nil
	var first error
	for i, err := range errs {
		if err == nil || ours && errors.Is(err, context.Canceled) {
			continue
		}
		st.leaseErr = i == stepLease
		first = err
		break
	}
	if first == nil {
		for i, err := range errs { // every error was one of the cancelled
			if err != nil {
				st.leaseErr, first = i == stepLease, err
				break
			}
		}
	}
	return st, first
}

// RunRollouts runs the rollout controller on nc, a connection of its own,
// until ctx ends, as Serve does on Config.RolloutConn: for a caller that
// replaces the connection while the reconciler runs (serve --auth, whose
// controller user can be revoked and issued again), with Serve's
// NoRollouts. scfg is the stream's effective configuration
// (Reconciler.Stream); of c, Logger and Signer or Own are used.
//
// Errors: the controller's lease bucket not found.
func RunRollouts(ctx context.Context, nc *nats.Conn, scfg store.StreamConfig, c Config) error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.RolloutConn = nc
	stop, err := startRollouts(ctx, nil, scfg, c)
	if err != nil {
		return err
	}
	<-ctx.Done()
	stop()
	return nil
}

// startRollouts runs the rollout controller until the returned stop,
// which waits for it.
func startRollouts(ctx context.Context, js jetstream.JetStream, scfg store.StreamConfig, c Config) (stop func(), err error) {
	if c.RolloutConn != nil {
		if js, err = newJetStream(c.RolloutConn); err != nil {
			return nil, fmt.Errorf("rollout controller: %w", err)
		}
	}
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	kv, err := js.KeyValue(kctx, scfg.Name+LeaseBucketSuffix)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("rollout controller: lease bucket: %w", err)
	}
	// Under the connection's denial watch: a fleet's claim or renewal the
	// server denies ends at once with the denial (store.LeaseBucket).
	kv = store.LeaseBucket(kv, js.Conn())
	own := c.Own
	if own == nil && c.Signer != nil {
		if own, err = store.NewTrust(c.Signer.PublicKey()); err != nil {
			return nil, err
		}
	}
	rctx, cancelRun := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rollouts.Run(rctx, js, rollouts.Config{Stream: scfg, Leases: kv, Own: own, Logger: c.Logger}); err != nil {
			c.Logger.Error("rollout controller stopped", "err", err)
		}
	}()
	return func() { cancelRun(); <-done }, nil
}

// serveMetrics serves reg at /metrics on addr, and Go's profiles at
// /debug/pprof/ when withPprof, until the returned stop.
func serveMetrics(addr string, withPprof bool, reg *prometheus.Registry, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMetricsListen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() { _ = hs.Close() }, nil
}

// runGrouped runs r on the grants of g until ctx is done or either
// fails: the group keeps the leases, the reconciler folds what they
// grant. Each stops the other; the group releases its leases only after
// the reconciler's partitions have written their final snapshots.
func runGrouped(ctx context.Context, g *Group, r *Reconciler) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var gerr error
	gdone := make(chan struct{})
	go func() {
		defer close(gdone)
		gerr = g.Run(ctx)
		cancel()
	}()
	rerr := r.Run(ctx)
	cancel()
	<-gdone
	return errors.Join(rerr, gerr)
}

// logStopped says how the reconciler stopped: "snapshots written" only
// when every partition's final snapshot was.
func logStopped(log *slog.Logger, r *Reconciler, also string) {
	unsaved := r.Unsaved()
	if len(unsaved) == 0 {
		log.Info("reconciler stopped; snapshots written" + also)
		return
	}
	parts := slices.Sorted(maps.Keys(unsaved))
	log.Warn("reconciler stopped; the final snapshot of some partitions was not written: a restart refolds them from their previous one"+also,
		"partitions", parts, "err", unsaved[parts[0]])
}
