package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
)

func init() {
	register(newServeCmd)
	register(newReconcileCmd)
}

// loopFlags configure the reconciler loop, in serve and reconcile.
type loopFlags struct {
	partitions       int
	replicas         int
	dedup            time.Duration
	maxAge           time.Duration
	maxBytes         int64
	snapshotEvery    int
	snapshotInterval time.Duration
	metrics          string
	pprof            bool
	signingKey       string
	leaseTTL         time.Duration
	group            *groupFlags // reconcile only
	controllerCreds  string      // reconcile only
	// rolloutsBeside: the engine runs no rollout controller, serve and
	// reconcile --controller-creds run their own beside it
	// (controllerLoop); rolloutsOff, when set, says why none runs.
	rolloutsBeside bool
	// storeStatus: serve's embedded server's watch of its data
	// directory, which the state service answers (engine.Config).
	storeStatus func() store.StoreStatus
	rolloutsOff string
	// signer and own are set from signingKey before runReconciler.
	signer *store.Signer
	own    *store.Trust
	notes  []string // printed once the stream is there
	// created lists the files loadKeys and writeTrust created (a new
	// signing key, a new trust file), for reconcile to remove when it
	// is refused before it starts.
	created []string
}

func (f *loopFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.partitions, "partitions", 0, "partitions of a new stream (default 16); fixed for the stream's life, 0 adopts an existing stream's")
	fl.IntVar(&f.replicas, "replicas", 0, "stream and snapshot replicas (default 1 for a new stream; 3 on a cluster); 0 keeps an existing stream's")
	fl.DurationVar(&f.dedup, "dedup-window", 0, "the stream's Nats-Msg-Id dedup window (default 2m)")
	fl.DurationVar(&f.maxAge, "max-age", 0, "drop events older than this (default: keep all history for audit, or an existing stream's); the stream's, shared by every reconciler: a change is logged at warn, before and after")
	fl.Int64Var(&f.maxBytes, "max-bytes", 0, "cap the stream's size in bytes, dropping the oldest events (default: no cap, or an existing stream's); a change is logged as --max-age's")
	fl.IntVar(&f.snapshotEvery, "snapshot-every", engine.DefaultSnapshotEvery, "write a partition's snapshot after this many events")
	fl.DurationVar(&f.snapshotInterval, "snapshot-interval", engine.DefaultSnapshotInterval, "write a partition's snapshot at least this often while events arrive")
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on HOST:PORT at /metrics (default: off)")
	fl.BoolVar(&f.pprof, "pprof", false, "with --metrics: also serve Go's profiles (heap, CPU, goroutines) at /debug/pprof/ on that listener, for diagnosing the reconciler's memory and CPU; they expose its internals: keep the listener private")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", engine.DefaultLeaseTTL, "how long a hung reconciler, or one that died on another host, keeps the stream (or, with --group, its partitions) before another takes over; one that died on this host is replaced at once; set by the first reconciler (the lease bucket's TTL)")
	fl.StringVar(&f.signingKey, "signing-key", "", "the reconciler's signing key (an nkey seed; created when missing), which signs every plan and knock; partitioned reconcilers share one (default: serve: DATA/"+signingKeyFile+", with --auth DIR/"+signingKeyFile+"; reconcile: required); its public key is written beside it, in "+trustFileName+" when missing, for the node agents' --trust-from")
}

// check refuses values of the loop's flags that mean nothing, before
// anything starts: a snapshot cadence of zero or less (it was silently
// taken as the default), and --pprof without --metrics.
func (f *loopFlags) check() error {
	if f.snapshotEvery < 1 {
		return withCode(exitUsage, fmt.Errorf("--snapshot-every %d: must be at least 1 event", f.snapshotEvery))
	}
	if f.snapshotInterval <= 0 {
		return withCode(exitUsage, fmt.Errorf("--snapshot-interval %s: must be more than 0", f.snapshotInterval))
	}
	if f.pprof && f.metrics == "" {
		return withCode(exitUsage, errors.New("--pprof needs --metrics: the profiles are served on its listener"))
	}
	// The server refuses a stream whose dedup window is longer than its
	// max-age with a raw API error (a fresh user's finding U28).
	if dedup := cmp.Or(f.dedup, store.DefaultDuplicates); f.maxAge > 0 && f.maxAge < dedup {
		return withCode(exitUsage, fmt.Errorf("--max-age %s: must be at least --dedup-window (%s)", f.maxAge, dedup))
	}
	if f.maxAge < 0 {
		return withCode(exitUsage, fmt.Errorf("--max-age %s: must not be negative", f.maxAge))
	}
	return nil
}

// printNotes prints what loadKeys noted (the signing key, the trust
// file), and why rollouts are off, after the command's first line.
func (f *loopFlags) printNotes(a *app) {
	for _, n := range f.notes {
		fmt.Fprintln(a.stdout, n)
	}
	if f.rolloutsOff != "" {
		fmt.Fprintln(a.stdout, "meshfold: rollouts are off: "+f.rolloutsOff)
	}
}

// rolloutsOffWarn logs why rollouts are off, when they are.
func (f *loopFlags) rolloutsOffWarn(log *slog.Logger) {
	if f.rolloutsOff != "" {
		log.Warn("rollouts are off: no rollout controller runs in this process", "why", f.rolloutsOff)
	}
}

// loadKeys loads (or creates) the signing key at path and prints its
// public key.
func (f *loopFlags) loadKeys(a *app, path string) error {
	signer, own, created, err := reconcilerKeys(path)
	if err != nil {
		return fmt.Errorf("--signing-key: %w", err)
	}
	f.signer, f.own = signer, own
	verb := "signed with"
	if created {
		verb = "signed with a new key,"
		f.created = append(f.created, path)
	}
	f.notes = append(f.notes, fmt.Sprintf("meshfold: plans and knocks %s %s (seed %s)", verb, signer.PublicKey(), path))
	return nil
}

// removeCreated removes the files loadKeys and writeTrust created, for a
// reconciler refused before it started.
func (f *loopFlags) removeCreated(log *slog.Logger) {
	for _, p := range f.created {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("cannot remove the file this refused start created", "file", p, "err", err)
		}
	}
	f.created = nil
}

// writeTrust writes the trust file of this deployment's node agents and
// provisioners at path, naming the signing key: when missing, or with
// replace when it names other current keys (serve's data directory). An
// auth directory's, which rotate-reconciler owns, is never replaced; a
// note warns when it does not name the key. A data directory's that
// names the key as its one current key and others retired is
// rotate-reconciler's overlap: kept until --finish.
func (f *loopFlags) writeTrust(path string, replace bool) error {
	pub := f.signer.PublicKey()
	t, err := store.ReadTrustFile(path)
	switch {
	case err == nil && t.Trusts(pub) && (!replace || slices.Equal(t.Current(), []string{pub})):
	case err == nil && !replace:
		f.notes = append(f.notes, fmt.Sprintf("meshfold: warning: %s does not name %s: agents that trust it refuse these plans", path, pub))
		return nil
	case err != nil && !errors.Is(err, os.ErrNotExist) && !replace:
		return fmt.Errorf("trust file: %w", err)
	default:
		if err := store.WriteTrustFile(path, pub); err != nil {
			return fmt.Errorf("trust file: %w", err)
		}
		if errors.Is(err, os.ErrNotExist) {
			f.created = append(f.created, path)
		}
	}
	f.notes = append(f.notes, fmt.Sprintf("meshfold: node agents and provisioners trust it with --trust-from %s (%s)", filepath.Dir(path), path))
	return nil
}

func (f *loopFlags) stream(s streamFlags) store.StreamConfig {
	return store.StreamConfig{Name: s.name, Prefix: s.prefix, Partitions: f.partitions, Replicas: f.replicas,
		Duplicates: f.dedup, MaxAge: f.maxAge, MaxBytes: f.maxBytes}
}

func newServeCmd(a *app) *cobra.Command {
	var (
		data   string
		listen string
		lf     loopFlags
		af     serveAuthFlags
		web    string
		cf     consoleFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run an embedded NATS server with JetStream, the event stream and the reconciler",
		Long: `serve is meshfold on one machine: an embedded nats-server with JetStream (file
storage under --data), the event stream, the snapshot bucket, the reconciler and
its state service, in one process. Other roles (node, provision, want, ...)
connect to the NATS URL it prints.

The file store fsyncs every 2 minutes: a crash of this process loses nothing
acknowledged, a power loss can lose the last moments. Run a NATS cluster with
three replicas when that matters (see docs/operations.md).

Without --auth anyone who reaches the port may do anything: keep the default
loopback address, or run with --auth DIR (meshfold auth init), where every
role connects with its own creds file and least-privilege permissions.
--tls-cert and --tls-key make clients connect with TLS; --tls-client-ca also
requires their certificates.

serve runs the rollout controller (meshfold apply, rollout): with --auth it
publishes the rollouts' wants as the directory's controller user, on a
connection of its own; a directory without that user (or with it revoked)
starts with rollouts off, saying so (meshfold auth add-user controller).

--http ADDR also serves the read-only web console (meshfold console); with
--auth it reads as the directory's operator-read user, and serve refuses to
start when the directory has none (meshfold auth add-user operator-read).

serve exits with status 1 when its reconciler's connection is closed for
good (the reconciler user revoked), so that its service manager restarts it.`,
		Example: `  meshfold serve
  meshfold serve --http 127.0.0.1:7070          # and the web console
  meshfold serve --data /var/lib/meshfold --listen 0.0.0.0:4222 --metrics 127.0.0.1:9090
  meshfold serve --auth ./mesh-auth --tls-cert server.pem --tls-key server-key.pem --listen 0.0.0.0:4222`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.check(); err != nil {
				return err
			}
			if _, _, err := embedded.ParseListen(listen); err != nil {
				return withCode(exitUsage, fmt.Errorf("--listen: %w", err))
			}
			a.bufferLogs()
			log, err := a.logger()
			if err != nil {
				return err
			}
			abs, err := filepath.Abs(data)
			if err != nil {
				return err
			}
			if fi, err := os.Stat(abs); err == nil && !fi.IsDir() {
				return withCode(exitUsage, fmt.Errorf("--data %s: not a directory", abs))
			}
			ecfg := embedded.Config{DataDir: abs, Listen: listen, ServerName: "meshfold", Logger: log}
			copts, err := af.apply(cmd, a, &ecfg)
			if err != nil {
				return err
			}
			// The console's user is checked before any key or file is
			// written: with --auth and no operator-read user, serve
			// refuses to start (serveConsoleOptions says why).
			var webOpts []nats.Option
			if web != "" {
				if webOpts, err = serveConsoleOptions(af); err != nil {
					return err
				}
			}
			// What would fail the server's start (a busy port, a data
			// directory another serve holds, TLS files that do not load)
			// is checked before the signing key or the trust file is
			// written: a serve that cannot start leaves --data as it was.
			if err := embedded.Check(ecfg); err != nil {
				return natsPortInUse(err, listen)
			}
			warnServerCert(log, ecfg.TLSCert, listen, time.Now())
			// The console's port is taken before anything is written, so
			// a busy one ends serve at once, as a busy NATS port does.
			var webLn net.Listener
			if web != "" {
				if webLn, err = net.Listen("tcp", web); err != nil {
					return fmt.Errorf("--http: %w%s", err, httpPortInUse(err, web))
				}
				defer webLn.Close()
			}
			// The signing key, and the trust file of this deployment's
			// node agents and provisioners, beside it: the data
			// directory, or the auth directory. Nothing machine-wide: a
			// node agent trusts exactly the keys it is given (--trust-from
			// DIR, --trust FILE), never another deployment's (issue 24).
			keyDir := abs
			if af.dir != "" {
				keyDir = af.dir
			}
			trustPath := filepath.Join(keyDir, trustFileName)
			if lf.signingKey == "" {
				lf.signingKey = filepath.Join(keyDir, signingKeyFile)
			}
			if err := lf.loadKeys(a, lf.signingKey); err != nil {
				return err
			}
			// With --auth the directory's trust file is written only when
			// missing: rotate-reconciler owns it. Without, it names the
			// signing key, rewritten when it names another.
			if err := lf.writeTrust(trustPath, af.dir == ""); err != nil {
				return err
			}
			srv, err := embedded.Start(ecfg)
			if err != nil {
				return natsPortInUse(err, listen)
			}
			defer srv.Shutdown()
			var rv revocation
			nc, err := srv.Connect(append(copts, nats.Name("meshfold serve"), rv.option())...)
			if err != nil {
				return err
			}
			defer nc.Close()
			// With --auth the rollout controller publishes wants as the
			// directory's controller user, on a connection of its own:
			// the reconciler's user stays least-privilege.
			ctlOpts, off, err := af.controllerOptions()
			if err != nil {
				return err
			}
			lf.rolloutsOff = off
			// The controller runs beside the reconciler, not in it: its
			// user can be revoked (a rotation) and issued again, and
			// serve then connects it with the new creds (controllerLoop).
			var ctl *controllerLoop
			if ctlOpts != nil {
				ctl = serveControllerLoop(log, srv, af, ctlOpts, lf.signer, lf.own)
				lf.rolloutsBeside = true
			}
			lf.rolloutsOffWarn(log)
			lf.storeStatus = srv.StoreStatus
			rctx, stopCtl := context.WithCancel(cmd.Context())
			defer stopCtl()
			err = rv.explain(runReconciler(rctx, a, log, nc, lf, func(ctx context.Context, cfg store.StreamConfig) {
				fmt.Fprintf(a.stdout, "meshfold: serving NATS at %s; stream %s (%s, prefix %q, keeps %s); data in %s\n",
					srv.ClientURL(), cfg.Name, plural(cfg.Partitions, "partition"), cfg.Prefix, cfg.Keeps(), abs)
				lf.printNotes(a)
				if ctl != nil {
					ctl.start(rctx, nil, nil, cfg)
				}
				if webLn != nil {
					serveConsole(ctx, a, log, srv, af, webOpts, cfg, webLn, cf)
				}
			}))
			stopCtl()
			ctl.wait()
			return err
		},
	}
	cmd.Flags().StringVar(&data, "data", "meshfold-data", "directory of the JetStream file store")
	cmd.Flags().StringVar(&listen, "listen", embedded.DefaultListen, "client listen address HOST:PORT (port 0: a random one)")
	cmd.Flags().StringVar(&web, "http", "", "also serve the read-only web console (meshfold console) on HOST:PORT; with --auth it reads as the directory's operator-read user (default: off)")
	a.stream.add(cmd)
	lf.add(cmd)
	af.add(cmd)
	cf.add(cmd)
	return cmd
}

func newReconcileCmd(a *app) *cobra.Command {
	var lf loopFlags
	var gf groupFlags
	lf.group = &gf
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Run the reconciler alone against any NATS deployment",
		Long: `reconcile runs the reconciler against an existing NATS server or cluster: it
creates or adopts the event stream and the snapshot bucket, folds every node's
events and publishes plans, knocks and journal entries, and answers state
requests. Connect with a URL list, a creds file, an NKey seed, TLS, or a nats
CLI context.

With --group, several reconcile instances share the stream's partitions: each
partition is folded by one instance at a time, from its snapshot, and the
partitions of an instance that dies or hangs are taken over by the others
within --lease-ttl. Membership and leases live in the KV bucket
<stream>_LEASES (nats kv watch MESH_LEASES shows them change); each instance
answers state requests for the nodes it folds. See docs/operations.md.

Without --group one reconcile (or serve) folds the stream alone: another
ungrouped one, or one beside a group, is refused at start with an error
naming the holder (a holder that died on this host is replaced at once; one
elsewhere is waited out, at most --lease-ttl).

reconcile runs the rollout controller (meshfold apply, rollout). Under auth
the reconciler's user may not publish wants: give the controller user's
credentials with --controller-creds FILE (an auth directory's
creds/controller.creds), used on a connection of its own. Connected with
credentials and without --controller-creds, reconcile starts with rollouts
off and says so. When the controller user is revoked, its controller stops
with one ERROR and starts again, without a restart, once the file changes
(copy the re-issued user's creds over it).

reconcile exits with status 1 when its NATS connection is closed for good
(its user revoked), so that its service manager restarts it.`,
		Example: `  meshfold reconcile --server nats://a:4222,nats://b:4222,nats://c:4222 --replicas 3 --creds reconciler.creds --controller-creds controller.creds
  meshfold reconcile --server nats://a:4222,nats://b:4222,nats://c:4222 --replicas 3 --group reconcilers --instance r1 --signing-key reconciler-signing.nk
  meshfold reconcile --context prod`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.check(); err != nil {
				return err
			}
			a.bufferLogs()
			log, err := a.logger()
			if err != nil {
				return err
			}
			if lf.signingKey == "" {
				// No machine-wide default: two deployments on one machine
				// would sign with one key, and each one's agents would
				// trust the other's plans (issue 24).
				return withCode(exitUsage, errors.New("--signing-key FILE is required: the deployment's signing key (an auth directory's "+signingKeyFile+", or a new file: created when missing; every --group instance the same)"))
			}
			// A reconcile refused before it starts (another reconciler
			// folds the stream, flags that do not fit it, no server)
			// leaves no new key or trust file behind: a fresh user's
			// refused reconcile left a new reconcilers.pub beside the
			// operator's files (U24). The key is needed to start, so it
			// is made first and removed on the way out.
			started := false
			defer func() {
				if !started {
					lf.removeCreated(log)
				}
			}()
			if err := lf.loadKeys(a, lf.signingKey); err != nil {
				return err
			}
			if err := lf.writeTrust(filepath.Join(filepath.Dir(lf.signingKey), trustFileName), false); err != nil {
				return err
			}
			nc, err := a.conn.connectWait(cmd.Context(), "meshfold reconcile", a)
			if err != nil {
				return err
			}
			defer nc.Close()
			ctl, ctlConn, ctlWatch, off, err := controllerConn(a, log, lf)
			if err != nil {
				return err
			}
			lf.rolloutsOff = off
			if ctl != nil {
				// Beside the reconciler, as serve's: its user can be
				// revoked and its creds file rewritten (controllerLoop).
				defer ctlConn.Close()
				lf.rolloutsBeside = true
			}
			lf.rolloutsOffWarn(log)
			rctx, stopCtl := context.WithCancel(cmd.Context())
			defer stopCtl()
			err = runReconciler(rctx, a, log, nc, lf, func(_ context.Context, cfg store.StreamConfig) {
				started = true
				fmt.Fprintf(a.stdout, "meshfold: reconciling stream %s (%s, prefix %q, %s, keeps %s) on %s\n",
					cfg.Name, plural(cfg.Partitions, "partition"), cfg.Prefix, plural(cfg.Replicas, "replica"), cfg.Keeps(), nc.ConnectedUrlRedacted())
				lf.printNotes(a)
				if ctl != nil {
					ctl.start(rctx, ctlConn, ctlWatch, cfg)
				}
			})
			stopCtl()
			ctl.wait()
			return err
		},
	}
	a.conn.add(cmd)
	a.stream.add(cmd)
	lf.add(cmd)
	gf.add(cmd)
	cmd.Flags().StringVar(&lf.controllerCreds, "controller-creds", "", "the rollout controller's NATS credentials (.creds; an auth directory's creds/controller.creds): it publishes the rollouts' wants as that user, on a connection of its own, with the server and TLS flags of the reconciler's; without it, when the reconciler connects with credentials (--creds, --nkey, a context's), rollouts are off in this process")
	return cmd
}

// controllerConn connects the rollout controller of reconcile as the
// user of --controller-creds, with the connection flags' servers and
// TLS, and returns the loop that runs it on that connection (and again
// on a new one after a revocation, once the file changes). Without the
// flag it returns no loop: the controller runs in the engine on the
// reconciler's connection, unless that one is authenticated, where the
// reconciler's user may not publish wants (store/auth), and off says so.
func controllerConn(a *app, log *slog.Logger, lf loopFlags) (ctl *controllerLoop, nc *nats.Conn, rv *revocation, off string, err error) {
	cfg, err := a.conn.config("meshfold reconcile rollouts", a)
	if err != nil {
		return nil, nil, nil, "", err
	}
	creds := lf.controllerCreds
	if creds == "" {
		authed, err := cfg.Authenticated()
		if err != nil || !authed {
			return nil, nil, nil, "", err
		}
		return nil, nil, nil, "the reconciler connects with credentials of its own, which may not publish the rollouts' wants, and no --controller-creds FILE was given (the controller user's, e.g. an auth directory's creds/controller.creds)", nil
	}
	if _, err := store.CredsInboxPrefix(creds); err != nil {
		return nil, nil, nil, "", withCode(exitUsage, fmt.Errorf("--controller-creds: %w", err))
	}
	authDir := "DIR"
	if filepath.Base(filepath.Dir(creds)) == "creds" {
		authDir = filepath.Dir(filepath.Dir(creds)) // an auth directory's own file
	}
	ctl = credsControllerLoop(log, cfg, creds, authDir, lf.signer, lf.own)
	rv = &revocation{}
	if nc, err = ctl.dial(rv.option()); err != nil {
		return nil, nil, nil, "", fmt.Errorf("--controller-creds: connect to NATS at %s: %w", strings.Join(cfg.URLs, ","), err)
	}
	return ctl, nc, rv, "", nil
}

// revocation closes serve's in-process connection for good when the
// server revokes (or expires) its user. nats.go gives a TCP connection up
// once the same auth error refuses it twice, but a refused in-process
// reconnect ends with its pipe closed before the -ERR is read, so it
// would retry for ever and the reconciler would hang; closed here, serve
// exits as reconcile does (store.ErrConnClosed).
type revocation struct {
	mu   sync.Mutex
	err  error
	ch   chan struct{} // closed when err is set: revoked
	gone chan struct{} // closed when the connection is closed
}

// option watches a connection (the last of its options: it keeps the
// error and closed handlers set before it, and calls them first).
func (r *revocation) option() nats.Option {
	return func(o *nats.Options) error {
		prevErr, prevClosed := o.AsyncErrorCB, o.ClosedCB
		o.AsyncErrorCB = func(c *nats.Conn, s *nats.Subscription, err error) {
			if prevErr != nil {
				prevErr(c, s, err)
			}
			if !errors.Is(err, nats.ErrAuthRevoked) && !errors.Is(err, nats.ErrAuthExpired) {
				return
			}
			r.mu.Lock()
			if r.err == nil {
				r.err = err
				close(r.chans().ch)
			}
			r.mu.Unlock()
			c.Close()
		}
		o.ClosedCB = func(c *nats.Conn) {
			if prevClosed != nil {
				prevClosed(c)
			}
			r.mu.Lock()
			select {
			case <-r.chans().gone:
			default:
				close(r.gone)
			}
			r.mu.Unlock()
		}
		return nil
	}
}

// chans makes the channels once; r.mu is held.
func (r *revocation) chans() *revocation {
	if r.ch == nil {
		r.ch, r.gone = make(chan struct{}), make(chan struct{})
	}
	return r
}

// revoked is closed once the connection's user is revoked (or expired).
func (r *revocation) revoked() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chans().ch
}

// closed is closed once the connection is closed, for good (nats.go
// gives a connection up after the server refused the same user twice).
func (r *revocation) closed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chans().gone
}

// error returns the revocation, nil before.
func (r *revocation) error() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// explain names the revocation as the reason of a store.ErrConnClosed.
func (r *revocation) explain(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil && errors.Is(err, store.ErrConnClosed) {
		return fmt.Errorf("%w: %w", store.ErrConnClosed, r.err)
	}
	return err
}

// runReconciler runs the reconciler on nc through engine.Serve, with
// the loop's flags, until ctx is done or it fails; ready is called once
// everything is up, with the context it runs under and the stream's
// effective configuration. A connection closed for good (its user
// revoked) ends it with store.ErrConnClosed: nats.go would never
// reconnect it, and the service manager's restart brings the reconciler
// back, or says why it cannot.
func runReconciler(ctx context.Context, a *app, log *slog.Logger, nc *nats.Conn, lf loopFlags, ready func(context.Context, store.StreamConfig)) error {
	tp, stopTracing, err := a.startTracing(ctx, "meshfold-reconciler", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	cfg := engine.Config{Stream: lf.stream(a.stream), Logger: log, Signer: lf.signer, Own: lf.own, Tracing: tp,
		SnapshotEvery: lf.snapshotEvery, SnapshotInterval: lf.snapshotInterval,
		MetricsAddr: lf.metrics, Pprof: lf.pprof, LeaseTTL: lf.leaseTTL,
		NoRollouts: lf.rolloutsOff != "" || lf.rolloutsBeside, StoreStatus: lf.storeStatus,
		Ready: func(ctx context.Context, r *engine.Reconciler) { ready(ctx, r.Stream()) }}
	if lf.group.enabled() {
		cfg.Group, cfg.Instance = lf.group.name, lf.group.instance
	}
	return engine.Serve(ctx, nc, cfg)
}

// natsPortInUse returns err, a failed start of serve's NATS server, with
// what to do when another process listens on listen (--listen): a second
// `meshfold serve` on the default port is what a reader of the README
// meets who keeps the first one running (a fresh user's finding U1), and
// "bind: address already in use" alone names neither it nor the flags.
func natsPortInUse(err error, listen string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	host, _, perr := embedded.ParseListen(listen)
	if perr != nil || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	hp := net.JoinHostPort(host, "PORT")
	return fmt.Errorf("%w: another process listens on %s (perhaps another 'meshfold serve'): stop it, "+
		"or give this serve --listen %s and every other command -s nats://%s (or export NATS_URL=nats://%s)", err, listen, hp, hp, hp)
}

// httpPortInUse says what to do when another process listens on web
// (--http); "" for any other error.
func httpPortInUse(err error, web string) string {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return ""
	}
	host, _, perr := net.SplitHostPort(web)
	if perr != nil {
		host = "127.0.0.1"
	}
	return fmt.Sprintf(": another process listens on %s (perhaps another serve --http, or 'meshfold console'): stop it, or give --http %s",
		web, net.JoinHostPort(host, "PORT"))
}

// warnServerCert warns, as serve starts, about a server certificate its
// clients will refuse (expired, not valid yet, not naming the address
// serve listens on) or soon will (store.CertSoon): serve started with an
// expired certificate and said nothing, and every client then failed its
// handshake (a fresh user's finding F4).
func warnServerCert(log *slog.Logger, certFile, listen string, now time.Time) {
	if certFile == "" {
		return
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = ""
	}
	ws, err := store.CertWarnings(certFile, host, now)
	if err != nil {
		log.Warn("could not read --tls-cert to check its dates and names", "err", err)
		return
	}
	for _, w := range ws {
		log.Warn("--tls-cert: " + w)
	}
}
