package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	group            *groupFlags // reconcile only
	// signer and own are set from signingKey before runReconciler.
	signer *store.Signer
	own    *store.Trust
	notes  []string // printed once the stream is there
}

func (f *loopFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.partitions, "partitions", 0, "partitions of a new stream (default 16); fixed for the stream's life, 0 adopts an existing stream's")
	fl.IntVar(&f.replicas, "replicas", 0, "stream and snapshot replicas (default 1 for a new stream; 3 on a cluster); 0 keeps an existing stream's")
	fl.DurationVar(&f.dedup, "dedup-window", 0, "the stream's Nats-Msg-Id dedup window (default 2m)")
	fl.DurationVar(&f.maxAge, "max-age", 0, "drop events older than this (default: keep all history for audit)")
	fl.Int64Var(&f.maxBytes, "max-bytes", 0, "cap the stream's size in bytes, dropping the oldest events (default: no cap)")
	fl.IntVar(&f.snapshotEvery, "snapshot-every", engine.DefaultSnapshotEvery, "write a partition's snapshot after this many events")
	fl.DurationVar(&f.snapshotInterval, "snapshot-interval", engine.DefaultSnapshotInterval, "write a partition's snapshot at least this often while events arrive")
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on HOST:PORT at /metrics (default: off)")
	fl.BoolVar(&f.pprof, "pprof", false, "with --metrics: also serve Go's profiles (heap, CPU, goroutines) at /debug/pprof/ on that listener, for diagnosing the reconciler's memory and CPU; they expose its internals: keep the listener private")
	fl.StringVar(&f.signingKey, "signing-key", "", "the reconciler's signing key (an nkey seed; created when missing), which signs every plan and knock; partitioned reconcilers share one (default: serve: DATA/"+signingKeyFile+", with --auth DIR/"+signingKeyFile+"; reconcile: $XDG_STATE_HOME/meshfold/"+signingKeyFile+", required with --group)")
}

// printNotes prints what loadKeys noted (the signing key, the trust
// file), after the command's first line.
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
	return nil
}

func (f *loopFlags) printNotes(a *app) {
	for _, n := range f.notes {
		fmt.Fprintln(a.stdout, n)
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
	}
	f.notes = append(f.notes, fmt.Sprintf("meshfold: plans and knocks %s %s (seed %s)", verb, signer.PublicKey(), path))
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

--http ADDR also serves the read-only web console (meshfold console); with
--auth it reads as the directory's operator-read user, and serve refuses to
start when the directory has none (meshfold auth add-user operator-read).

serve exits with status 1 when its reconciler's connection is closed for
good (the reconciler user revoked), so that its service manager restarts it.`,
		Example: `  meshfold serve
  meshfold serve --http 127.0.0.1:7070          # and the web console
  meshfold serve --data /var/lib/meshfold --listen 0.0.0.0:4222 --metrics 127.0.0.1:9090
  meshfold serve --auth ./mesh-auth --tls-cert server.pem --tls-key server-key.pem --listen 0.0.0.0:4222`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.check(); err != nil {
				return err
			}
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
			// The signing key, and the trust file the node agents and
			// provisioners of this machine (or of the auth directory)
			// read: serve, then node, needs no extra step.
			keyDir, trustPath := abs, ""
			if af.dir != "" {
				keyDir, trustPath = af.dir, filepath.Join(af.dir, trustFileName)
			} else if trustPath, err = defaultTrustFile(); err != nil {
				return err
			}
			if lf.signingKey == "" {
				lf.signingKey = filepath.Join(keyDir, signingKeyFile)
			}
			if err := lf.loadKeys(a, lf.signingKey); err != nil {
				return err
			}
			// Without --auth the key joins the machine's default trust
			// file, beside those of other serves started here (another
			// --data and port): replacing it would make their node
			// agents refuse their own reconciler's plans once restarted.
			// With --auth the directory's trust file is written only
			// when missing: rotate-reconciler owns it.
			if af.dir == "" {
				keys, err := publishTrust(trustPath, lf.signer)
				if err != nil {
					return fmt.Errorf("trust file: %w", err)
				}
				note := "meshfold: node agents and provisioners trust it through " + trustPath
				if n := len(keys) - 1; n > 0 {
					note += fmt.Sprintf(" (beside %d other key(s) of serves started on this machine)", n)
				}
				lf.notes = append(lf.notes, note)
			} else if _, err := os.Stat(trustPath); err != nil {
				if err := store.WriteTrustFile(trustPath, lf.signer.PublicKey()); err != nil {
					return fmt.Errorf("trust file: %w", err)
				}
				lf.notes = append(lf.notes, "meshfold: node agents and provisioners trust it through "+trustPath)
			}
			// The console's port is taken before anything starts, so a
			// busy one ends serve at once, as a busy NATS port does.
			var webLn net.Listener
			if web != "" {
				if webLn, err = net.Listen("tcp", web); err != nil {
					return fmt.Errorf("--http: %w", err)
				}
				defer webLn.Close()
			}
			srv, err := embedded.Start(ecfg)
			if err != nil {
				return err
			}
			defer srv.Shutdown()
			var rv revocation
			nc, err := srv.Connect(append(copts, nats.Name("meshfold serve"), rv.option())...)
			if err != nil {
				return err
			}
			defer nc.Close()
			return rv.explain(runReconciler(cmd.Context(), a, log, nc, lf, func(ctx context.Context, cfg store.StreamConfig) {
				fmt.Fprintf(a.stdout, "meshfold: serving NATS at %s; stream %s (%d partitions, prefix %q); data in %s\n",
					srv.ClientURL(), cfg.Name, cfg.Partitions, cfg.Prefix, abs)
				lf.printNotes(a)
				if webLn != nil {
					serveConsole(ctx, a, log, srv, webOpts, cfg, webLn, cf)
				}
			}))
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
naming the holder (a holder that died is waited out, at most its lease TTL).
reconcile exits with status 1 when its NATS connection is closed for good
(its user revoked), so that its service manager restarts it.`,
		Example: `  meshfold reconcile --server nats://a:4222,nats://b:4222,nats://c:4222 --replicas 3 --creds reconciler.creds
  meshfold reconcile --server nats://a:4222,nats://b:4222,nats://c:4222 --replicas 3 --group reconcilers --instance r1 --signing-key reconciler-signing.nk
  meshfold reconcile --context prod`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.check(); err != nil {
				return err
			}
			log, err := a.logger()
			if err != nil {
				return err
			}
			if lf.signingKey == "" {
				if gf.enabled() {
					return withCode(exitUsage, errors.New("--signing-key is required with --group: every instance must sign with the same key"))
				}
				base, err := stateBase()
				if err != nil {
					return withCode(exitUsage, fmt.Errorf("--signing-key: %w", err))
				}
				lf.signingKey = filepath.Join(base, signingKeyFile)
			}
			if err := lf.loadKeys(a, lf.signingKey); err != nil {
				return err
			}
			nc, err := a.conn.connectWait(cmd.Context(), "meshfold reconcile", a)
			if err != nil {
				return err
			}
			defer nc.Close()
			return runReconciler(cmd.Context(), a, log, nc, lf, func(_ context.Context, cfg store.StreamConfig) {
				fmt.Fprintf(a.stdout, "meshfold: reconciling stream %s (%d partitions, prefix %q, %d replicas) on %s\n",
					cfg.Name, cfg.Partitions, cfg.Prefix, cfg.Replicas, nc.ConnectedUrlRedacted())
				lf.printNotes(a)
			})
		},
	}
	a.conn.add(cmd)
	a.stream.add(cmd)
	lf.add(cmd)
	gf.add(cmd)
	return cmd
}

// revocation closes serve's in-process connection for good when the
// server revokes (or expires) its user. nats.go gives a TCP connection up
// once the same auth error refuses it twice, but a refused in-process
// reconnect ends with its pipe closed before the -ERR is read, so it
// would retry for ever and the reconciler would hang; closed here, serve
// exits as reconcile does (errConnClosed).
type revocation struct {
	mu  sync.Mutex
	err error
}

func (r *revocation) option() nats.Option {
	return nats.ErrorHandler(func(c *nats.Conn, _ *nats.Subscription, err error) {
		if !errors.Is(err, nats.ErrAuthRevoked) && !errors.Is(err, nats.ErrAuthExpired) {
			return
		}
		r.mu.Lock()
		if r.err == nil {
			r.err = err
		}
		r.mu.Unlock()
		c.Close()
	})
}

// explain names the revocation as the reason of an errConnClosed.
func (r *revocation) explain(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil && errors.Is(err, errConnClosed) {
		return fmt.Errorf("%w: %w", errConnClosed, r.err)
	}
	return err
}

// runReconciler ensures the stream, starts the state service and the
// metrics endpoint, and folds until ctx is done or nc closes for good;
// ready is called once the stream is there, with the context it runs
// under. A connection closed for good (its user revoked) ends it with
// errConnClosed: nats.go would never reconnect it, and the service
// manager's restart brings the reconciler back, or says why it cannot.
func runReconciler(ctx context.Context, a *app, log *slog.Logger, nc *nats.Conn, lf loopFlags, ready func(context.Context, store.StreamConfig)) error {
	ctx, stop := whileConnected(ctx, nc)
	defer stop()
	err := runReconcilerLoop(ctx, a, log, nc, lf, ready)
	if cerr := connClosed(ctx, nc); cerr != nil {
		return cerr
	}
	return err
}

func runReconcilerLoop(ctx context.Context, a *app, log *slog.Logger, nc *nats.Conn, lf loopFlags, ready func(context.Context, store.StreamConfig)) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, cfg, err := store.EnsureStream(sctx, js, lf.stream(a.stream))
	if err == nil {
		// The node agents' lease bucket: created here, where the
		// credentials may create it (a node's may not).
		_, err = store.OpenNodeLeases(sctx, js, cfg)
	}
	cancel()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	// go_gc_heap_live_bytes (the heap the last collection marked live)
	// beside the classic memstats: the memory per node of issue 17 is read
	// from it.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := engine.NewMetrics(reg)
	if lf.metrics != "" {
		ln, err := net.Listen("tcp", lf.metrics)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		if lf.pprof {
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
		defer hs.Close()
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	}
	rcfg := engine.ReconcilerConfig{Stream: cfg, Logger: log, Signer: lf.signer, Own: lf.own,
		Metrics: metrics, SnapshotEvery: lf.snapshotEvery, SnapshotInterval: lf.snapshotInterval}
	var (
		group *engine.Group
		lease *store.Lease
	)
	if lf.group.enabled() {
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		group, err = engine.JoinGroup(gctx, js, engine.GroupConfig{Stream: cfg, Name: lf.group.name,
			Instance: lf.group.instance, TTL: lf.group.ttl, Logger: log})
		cancel()
		if err != nil {
			return err
		}
		rcfg.Grants = group.Grants()
	} else {
		// One ungrouped reconciler per stream, and none beside a group.
		if lease, err = engine.HoldStream(ctx, js, cfg, log); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := lease.Release(rctx); err != nil {
				log.Warn("stream lease not released; it expires after its TTL", "ttl", lease.TTL(), "err", err)
			}
		}()
	}
	r, err := engine.NewReconciler(ctx, js, rcfg)
	if err != nil {
		return err
	}
	reg.MustRegister(r.StateCollector())
	// In a group each instance knows only its partitions' nodes: every
	// instance hears every request and the owner answers.
	svc, err := engine.AddStateService(nc, r.Node, engine.StateServiceConfig{Prefix: cfg.Prefix, Partial: group != nil})
	if err != nil {
		return err
	}
	defer svc.Stop()
	ready(ctx, cfg)
	if group != nil {
		log.Info("reconciler running in a group", "stream", cfg.Name, "partitions", cfg.Partitions,
			"group", lf.group.name, "instance", group.Instance(), "lease_ttl", group.TTL())
		if err := runGrouped(ctx, group, r); err != nil || connClosed(ctx, nc) != nil {
			return err // a closed connection released nothing: runReconciler says so
		}
		logStopped(log, r, ", leases released")
		return nil
	}
	log.Info("reconciler running", "stream", cfg.Name, "partitions", cfg.Partitions, "lease_ttl", lease.TTL())
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-lease.Lost():
			log.Error("stream lease taken by another reconciler: stopping", "err", lease.Err())
			stop()
		case <-rctx.Done():
		}
	}()
	if err := r.Run(rctx); err != nil || connClosed(ctx, nc) != nil {
		return err
	}
	if err := lease.Err(); err != nil {
		return fmt.Errorf("stream lease lost: %w", err)
	}
	logStopped(log, r, "")
	return nil
}

// logStopped says how the reconciler stopped: "snapshots written" only
// when every partition's final snapshot was.
func logStopped(log *slog.Logger, r *engine.Reconciler, also string) {
	unsaved := r.Unsaved()
	if len(unsaved) == 0 {
		log.Info("reconciler stopped; snapshots written" + also)
		return
	}
	parts := slices.Sorted(maps.Keys(unsaved))
	log.Warn("reconciler stopped; the final snapshot of some partitions was not written: a restart refolds them from their previous one"+also,
		"partitions", parts, "err", unsaved[parts[0]])
}
