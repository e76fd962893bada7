package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
)

// controllerLoop runs the rollout controller beside the reconciler, on a
// connection of its own as the controller user, and again once new
// creds of that user connect after a revocation (auth revoke controller:
// a rotation) closed it for good: serve --auth (the directory's user
// issued again) and reconcile --controller-creds (the creds file
// rewritten). A stop is said once, as one ERROR naming the revocation
// and the fix; nothing is retried until the creds change. Before, the
// controller went on with its closed connection: "rollout controller
// stopped; starting again … connection closed" every second for ever,
// nothing said "revoked", and new creds changed nothing until the
// process restarted (a fresh user's finding F12 for serve; a reviewer's
// for reconcile).
type controllerLoop struct {
	log    *slog.Logger
	signer *store.Signer
	own    *store.Trust
	// dial connects as the controller user with the creds current now;
	// watch goes among its options, last.
	dial func(watch nats.Option) (*nats.Conn, error)
	// fix says what to do after a revocation; again what the process
	// then does on its own ("which serve picks up without a restart").
	fix, again string
	// changed reports, polled every reissuePoll after a stop, whether
	// creds to dial with again are there; reissued says so in the INFO
	// line that follows.
	changed  func() bool
	reissued string

	done    chan struct{} // closed once run returns
	started bool          // set by start, before the reconciler's Ready returns
}

// reissuePoll is how often a stopped controller looks for its user's new
// creds (the auth directory, the creds file).
const reissuePoll = time.Second

// run runs the controller on nc (nil: dial first) with the revocation
// watch rv until ctx ends, again on a new connection after each stop:
// after a refusal of its user once changed says new creds are there,
// after any other stop (a dial that failed while the server was away)
// at the next poll. A stop is logged once while its words stay the same.
func (c *controllerLoop) run(ctx context.Context, nc *nats.Conn, rv *revocation, cfg store.StreamConfig) {
	defer close(c.done)
	user := string(auth.RoleController)
	said := ""
	for {
		var err error
		if nc == nil {
			rv = &revocation{}
			nc, err = c.dial(rv.option())
		}
		if err == nil {
			said = "" // a stop after this run is said again
			rctx, cancel := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() {
				ran <- engine.RunRollouts(rctx, nc, cfg, engine.Config{Logger: c.log, Signer: c.signer, Own: c.own})
			}()
			select {
			case <-ctx.Done():
			case <-rv.revoked():
			case <-rv.closed():
			case err = <-ran:
				ran <- err
			}
			cancel()
			if rerr := <-ran; err == nil {
				err = rerr
			}
			if err == nil && ctx.Err() == nil {
				err = cmpErr(nc.LastError(), nats.ErrConnectionClosed)
			}
			nc.Close()
			nc = nil
		}
		if ctx.Err() != nil {
			return
		}
		refused := rv.error() != nil || authRefused(err)
		err = cmpErr(rv.error(), err)
		if msg := err.Error(); msg != said {
			said = msg
			if refused {
				c.log.Error("rollout controller stopped: its user was revoked; no rollout is stepped until the user is issued again, "+c.again,
					"user", user, "err", err, "fix", c.fix)
			} else {
				c.log.Error("rollout controller stopped; starting it again once its user's creds connect", "user", user, "err", err)
			}
		}
		// Wait for creds to dial with again.
		for first := true; first || refused && !c.changed(); first = false {
			select {
			case <-ctx.Done():
				return
			case <-time.After(reissuePoll):
			}
		}
		if refused {
			c.log.Info("rollout controller: "+c.reissued+"; starting with the new creds", "user", user)
		}
	}
}

// start runs run in a goroutine; wait waits for it, once started.
func (c *controllerLoop) start(ctx context.Context, nc *nats.Conn, rv *revocation, cfg store.StreamConfig) {
	c.done = make(chan struct{})
	c.started = true
	go c.run(ctx, nc, rv, cfg)
}

func (c *controllerLoop) wait() {
	if c != nil && c.started {
		<-c.done
	}
}

// cmpErr returns the first error that is not nil.
func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// authRefused reports whether err is the server refusing the user: its
// creds revoked, expired or unknown (a connection made while the user was
// revoked, or closed after two such refusals).
func authRefused(err error) bool {
	return err != nil && (errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthRevoked) ||
		errors.Is(err, nats.ErrAuthExpired) || strings.Contains(strings.ToLower(err.Error()), "authorization violation"))
}

// serveControllerLoop is serve --auth's: an in-process connection as the
// auth directory's controller user, dialled again once the directory
// lists that user not revoked (auth add-user controller).
func serveControllerLoop(log *slog.Logger, srv *embedded.Server, af serveAuthFlags, opts []nats.Option, signer *store.Signer, own *store.Trust) *controllerLoop {
	return &controllerLoop{log: log, signer: signer, own: own,
		dial: func(watch nats.Option) (*nats.Conn, error) { return srv.Connect(append(opts, watch)...) },
		fix:  fmt.Sprintf("meshfold auth add-user %s --dir %s", auth.RoleController, af.dir), again: "which serve picks up without a restart",
		changed: func() bool {
			o, off, err := af.controllerOptions()
			if err != nil || off != "" {
				return false
			}
			opts = o
			return true
		},
		reissued: "its user was issued again"}
}

// credsControllerLoop is reconcile --controller-creds FILE's: a
// connection as the user of FILE (cfg: the reconciler's servers and TLS),
// dialled again once FILE's content differs from the creds refused (the
// user issued again and its creds copied over FILE). A dial of new
// creds the server refuses too waits for the next change; one that
// fails otherwise (the server away) is tried again every reissuePoll.
func credsControllerLoop(log *slog.Logger, cfg store.ConnectConfig, file, authDir string, signer *store.Signer, own *store.Trust) *controllerLoop {
	refused, _ := os.ReadFile(file) // the creds the stop was about
	var tried []byte
	c := &controllerLoop{log: log, signer: signer, own: own,
		fix: fmt.Sprintf("meshfold auth add-user %s --dir %s, then copy %s over %s (reconcile reads it again when it changes, without a restart)",
			auth.RoleController, authDir, "DIR/creds/"+string(auth.RoleController)+".creds", file),
		again:    "and its creds file rewritten, which reconcile picks up without a restart",
		reissued: "its creds file " + file + " changed",
	}
	c.dial = func(watch nats.Option) (*nats.Conn, error) {
		refused, _ = os.ReadFile(file)
		cfg := cfg
		cfg.Creds, cfg.NKeySeed = file, ""
		inbox, err := store.CredsInboxPrefix(file)
		if err != nil {
			return nil, err
		}
		cfg.InboxPrefix = inbox
		opts, err := cfg.Options()
		if err != nil {
			return nil, err
		}
		return nats.Connect("", append(opts, watch)...)
	}
	c.changed = func() bool {
		b, err := os.ReadFile(file)
		if err != nil || len(b) == 0 || bytes.Equal(b, refused) || bytes.Equal(b, tried) {
			return false
		}
		if _, err := store.CredsInboxPrefix(file); err != nil {
			return false // being written: read again at the next poll
		}
		tried = b
		return true
	}
	return c
}
