package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
)

func init() { register(newConsoleCmd) }

// consoleFlags configure the web console, in console and serve --http.
type consoleFlags struct {
	stale    time.Duration
	warnings time.Duration
}

func (f *consoleFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.DurationVar(&f.stale, "stale", 10*time.Minute, "the console shows a have older than this as stale")
	fl.DurationVar(&f.warnings, "warnings", time.Hour, "the console counts journal warnings this far back at start (0: do not)")
}

func newConsoleCmd(a *app) *cobra.Command {
	var (
		listen string
		cf     consoleFlags
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "A read-only web console of the fleet and of each node's history",
		Long: `console serves web pages of the fleet and of each node, read-only:

  /                 what needs an operator first, then every node; filter by
                    name; updated live as events fold (server-sent events)
  /node/NODE        the node's history as a picture, one lane per event kind,
                    plans, knocks and held rows marked (?from= ?to= zoom by
                    sequence or time, ?axis=time); its state and composition
                    (meshfold state); ?why=SEQ the causal chain of an event
                    (meshfold audit --why); ?as_of= the page as of a sequence
                    or time (meshfold audit --as-of)

Everything shown is computed by the same code as fleet, state and audit. The
console only reads: give it the operator-read user's creds (meshfold auth
add-user operator-read). It listens on loopback unless --listen says
otherwise; it has no login of its own, so put anything wider behind a proxy
that authenticates. The same pages are served by meshfold serve --http ADDR.`,
		Example: `  meshfold console
  meshfold console --server nats://hub:4222 --creds mesh-auth/creds/operator-read.creds --listen 127.0.0.1:7070`,
		Args: noArgs(""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := a.logger()
			if err != nil {
				return err
			}
			nc, err := a.conn.connectWait(cmd.Context(), "meshfold console", a)
			if err != nil {
				return err
			}
			defer nc.Close()
			// A permission the creds lack while the console starts (the
			// stream, the snapshots, the follow) ends it at once,
			// explained, naming the role it reads as (exit 1, as the node
			// agent's): another role's creds are no transient failure (a
			// fresh user's finding L12: it ended on "snapshot bucket
			// MESH_SNAPSHOTS: context deadline exceeded", the cause only
			// in a WARN line). Once loaded, a violation is logged.
			loaded := make(chan struct{})
			a.watchDeniedUntil(nc, loaded)
			a.deniedNeeds = fmt.Sprintf("'meshfold console' reads as the %s role ('meshfold auth add-user %s' writes its creds file)",
				auth.RoleOperatorRead, auth.RoleOperatorRead)
			// A connection closed for good (a revoked user) ends the
			// console with an error, as it does the other long-running
			// roles: its pages would never read anything again.
			err = store.WhileConnected(cmd.Context(), nc, func(ctx context.Context) error {
				return consoleAlone(ctx, a, log, nc, listen, cf, loaded)
			})
			if d := a.deniedErr(); d != nil {
				return d // ended by the violation, which run explains
			}
			return err
		},
	}
	cmd.Flags().StringVar(&listen, "listen", console.DefaultListen, "HTTP listen address HOST:PORT (loopback unless told otherwise)")
	// serve calls the same address --http (its --listen is NATS's), so
	// console takes that name too rather than "unknown flag: --http" (a
	// fresh user's finding U24).
	cmd.Flags().StringVar(&listen, "http", console.DefaultListen, "the same as --listen (the name serve gives it)")
	_ = cmd.Flags().MarkHidden("http")
	cf.add(cmd)
	a.conn.add(cmd)
	a.stream.add(cmd)
	return cmd
}

// consoleAlone is meshfold console on nc: it waits for the stream, takes
// the listen address and serves until ctx is done.
func consoleAlone(ctx context.Context, a *app, log *slog.Logger, nc *nats.Conn, listen string, cf consoleFlags, loaded chan<- struct{}) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, cfg, err := a.stream.openStreamWait(ctx, js, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("--listen: %w", err))
	}
	return runConsole(ctx, a, log, nc, cfg, ln, cf, loaded)
}

// runConsole serves the console on ln until ctx is done, and closes ln;
// it closes loaded (nil: none) once the console has loaded the fleet
// (console.Console.Loaded).
func runConsole(ctx context.Context, a *app, log *slog.Logger, nc *nats.Conn, cfg store.StreamConfig, ln net.Listener, cf consoleFlags, loaded chan<- struct{}) error {
	defer ln.Close()
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		return err
	}
	warnings := cf.warnings
	if warnings == 0 {
		warnings = -1
	}
	c, err := console.New(console.Config{Source: r,
		Logger: log, Stale: cf.stale, Warnings: warnings})
	if err != nil {
		return err
	}
	if !console.IsLoopback(ln.Addr().String()) {
		log.Warn("the console listens beyond loopback; it has no login of its own", "addr", ln.Addr().String())
	}
	fmt.Fprintf(a.stdout, "meshfold: console at http://%s/ (stream %s)\n", ln.Addr(), cfg.Name)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	if loaded != nil {
		go func() {
			select {
			case <-c.Loaded():
				close(loaded)
			case <-ctx.Done():
			}
		}()
	}
	served := make(chan error, 1)
	go func() { served <- console.Serve(ctx, ln, c) }()
	select {
	case err = <-ran:
		cancel()
		<-served
	case err = <-served:
		cancel()
		<-ran
	}
	return err
}

// serveConsoleOptions are the options of the in-process connection of
// serve --http's console: with --auth, the directory's operator-read
// user, so the pages read with the console's permissions, not the
// reconciler's. serve calls it before anything starts: a directory with
// no usable operator-read user (one made before the role existed, or
// whose user was revoked) ends serve at once with the command that fixes
// it, as a busy --http port does, rather than running on without the
// console that was asked for.
func serveConsoleOptions(af serveAuthFlags) ([]nats.Option, error) {
	opts := []nats.Option{nats.Name("meshfold serve console")}
	if af.dir == "" {
		return opts, nil
	}
	d, err := auth.Open(af.dir)
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--auth: %w", err))
	}
	user := string(auth.RoleOperatorRead)
	fix := fmt.Sprintf("meshfold auth add-user %s --dir %s", user, af.dir)
	u, err := d.User(user)
	if errors.Is(err, auth.ErrUnknownUser) {
		return nil, withCode(exitUsage, fmt.Errorf("--http: the auth directory %s has no %s user for the console; issue it with '%s', or drop --http", af.dir, user, fix))
	} else if err != nil {
		return nil, err
	}
	if u.Revoked != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--http: the console's user %s of %s is revoked; issue it again with '%s', or drop --http", user, af.dir, fix))
	}
	creds := d.CredsPath(user)
	inbox, err := store.CredsInboxPrefix(creds)
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--http: the console's user %s: %w", user, err))
	}
	return append(opts, nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox)), nil
}

// serveConsole starts the console of serve --http on its own in-process
// connection, made with opts (serveConsoleOptions). It serves on ln (taken
// before serve started, so that a busy port ends serve) until ctx is
// done; a later failure is logged, and does not stop the reconciler.
//
// A revocation of the console's user (auth revoke operator-read, a
// rotation) closes its connection for good: the pages then answer 503,
// saying the console lost its credentials and what issues them again,
// one ERROR says the same, and once the user is issued again the console
// connects with the new creds and serves live pages again. Before, the
// pages went on answering from the frozen picture with "live" and "as of
// <now>" (a fresh user's finding F7).
func serveConsole(ctx context.Context, a *app, log *slog.Logger, srv *embedded.Server, af serveAuthFlags, opts []nats.Option, cfg store.StreamConfig, ln net.Listener, cf consoleFlags) {
	h := &swapHandler{}
	h.set(unavailable("the console is connecting to NATS"), ctx)
	go func() {
		if err := console.Serve(ctx, ln, h); err != nil {
			log.Error("console", "err", err)
		}
	}()
	if !console.IsLoopback(ln.Addr().String()) {
		log.Warn("the console listens beyond loopback; it has no login of its own", "addr", ln.Addr().String())
	}
	fmt.Fprintf(a.stdout, "meshfold: console at http://%s/ (stream %s)\n", ln.Addr(), cfg.Name)
	go func() {
		user := string(auth.RoleOperatorRead)
		for {
			var rv revocation
			err := func() error {
				nc, err := srv.Connect(append(opts, rv.option())...)
				if err != nil {
					return err
				}
				defer nc.Close()
				gctx, cancel := context.WithCancel(ctx)
				defer cancel()
				c, err := newConsole(nc, cfg, cf, log)
				if err != nil {
					return err
				}
				ran := make(chan error, 1)
				go func() { ran <- c.Run(gctx) }()
				h.set(c, gctx)
				select {
				case <-ctx.Done():
					return nil
				case <-rv.revoked():
					return rv.error()
				case err := <-ran:
					return err
				}
			}()
			if ctx.Err() != nil {
				return
			}
			fix := fmt.Sprintf("meshfold auth add-user %s --dir %s", user, af.dir)
			if rv.error() != nil {
				log.Error("console stopped: its user was revoked; its pages say so until the user is issued again, which serve picks up without a restart",
					"user", user, "err", err, "fix", fix)
				h.set(unavailable(fmt.Sprintf("the console lost its NATS connection: its user %s was revoked (%v); "+
					"nothing shown here is current. Issue the user again with '%s': the console reconnects by itself.", user, err, fix)), ctx)
			} else {
				log.Error("console stopped; connecting it again", "err", err)
				h.set(unavailable(fmt.Sprintf("the console lost its NATS connection (%v); it is connecting again.", err)), ctx)
			}
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(reissuePoll):
				}
				o, err := serveConsoleOptions(af)
				if err == nil {
					if rv.error() != nil {
						log.Info("console: its user was issued again; connecting with the new creds", "user", user)
					}
					opts = o
					break
				}
			}
		}
	}()
}

// newConsole makes the console of the connection nc.
func newConsole(nc *nats.Conn, cfg store.StreamConfig, cf consoleFlags, log *slog.Logger) (*console.Console, error) {
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		return nil, err
	}
	warnings := cf.warnings
	if warnings == 0 {
		warnings = -1
	}
	return console.New(console.Config{Source: r, Logger: log, Stale: cf.stale, Warnings: warnings})
}

// swapHandler serves with the handler set last; a request is cancelled
// when the handler it was given to is replaced (its context ends): a live
// page's event stream of a console that stopped ends, and the page says
// it is no longer live.
type swapHandler struct {
	mu  sync.Mutex
	h   http.Handler
	ctx context.Context
}

func (s *swapHandler) set(h http.Handler, ctx context.Context) {
	s.mu.Lock()
	s.h, s.ctx = h, ctx
	s.mu.Unlock()
}

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	h, hctx := s.h, s.ctx
	s.mu.Unlock()
	rctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(hctx, cancel)
	defer stop()
	h.ServeHTTP(w, r.WithContext(rctx))
}

// unavailable answers every request 503 with msg, as plain text.
func unavailable(msg string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "meshfold console: "+msg)
	})
}
