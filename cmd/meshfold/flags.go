package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/store"
)

// connFlags are the flags of every command that connects to NATS.
type connFlags struct {
	server  string
	creds   string
	nkey    string
	context string
	tlsCA   string
	tlsCert string
	tlsKey  string
}

func (f *connFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.server, "server", "s", "", "NATS server URLs, comma separated ($NATS_URL; default nats://127.0.0.1:4222, or the context's)")
	fl.StringVar(&f.creds, "creds", "", "NATS credentials file (.creds; $NATS_CREDS)")
	fl.StringVar(&f.nkey, "nkey", "", "NKey seed file ($NATS_NKEY)")
	fl.StringVar(&f.context, "context", "", "a nats CLI context name or .json file (~/.config/nats/context/NAME.json; $NATS_CONTEXT)")
	fl.StringVar(&f.tlsCA, "tls-ca", "", "CA certificate to verify the server ($NATS_CA)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "client certificate ($NATS_CERT)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "client certificate's key ($NATS_KEY)")
}

// connEnv maps each connection flag to the environment variable the nats
// CLI reads for it: a flag given wins over its variable, a variable over
// the context's field.
var connEnv = []struct{ flag, env string }{
	{"server", "NATS_URL"}, {"creds", "NATS_CREDS"}, {"nkey", "NATS_NKEY"}, {"context", "NATS_CONTEXT"},
	{"tls-ca", "NATS_CA"}, {"tls-cert", "NATS_CERT"}, {"tls-key", "NATS_KEY"},
}

// withEnv returns f with each flag left empty taken from its environment
// variable (connEnv), as the nats CLI does.
func (f connFlags) withEnv() connFlags {
	fields := map[string]*string{"server": &f.server, "creds": &f.creds, "nkey": &f.nkey, "context": &f.context,
		"tls-ca": &f.tlsCA, "tls-cert": &f.tlsCert, "tls-key": &f.tlsKey}
	for _, e := range connEnv {
		if p := fields[e.flag]; *p == "" {
			*p = os.Getenv(e.env)
		}
	}
	return f
}

func (f *connFlags) config(name string, a *app) (store.ConnectConfig, error) {
	log, err := a.logger()
	if err != nil {
		return store.ConnectConfig{}, err
	}
	g := f.withEnv()
	cfg := store.ConnectConfig{Creds: g.creds, NKeySeed: g.nkey, Context: g.context,
		TLSCA: g.tlsCA, TLSCert: g.tlsCert, TLSKey: g.tlsKey, Name: name, Logger: log}
	if g.server != "" {
		cfg.URLs = strings.Split(g.server, ",")
	} else if g.context == "" {
		cfg.URLs = []string{nats.DefaultURL}
	}
	return cfg, nil
}

// connect connects with the flags for a client command; name names the
// connection. A permission the server denies it ends the command at once
// (app.watchDenied), so that it is explained, not waited out.
func (f *connFlags) connect(name string, a *app) (*nats.Conn, error) {
	nc, err := f.dial(name, a)
	if err == nil {
		a.watchDenied(nc)
	}
	return nc, err
}

// connectJS is [connFlags.connect] with the JetStream context on the
// connection, for the verbs that read or write streams, buckets and
// object stores directly. The caller closes the connection; on an error
// nothing is left open.
func (a *app) connectJS(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := a.conn.connect(name, a)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// dial connects with the flags; name names the connection.
func (f *connFlags) dial(name string, a *app) (*nats.Conn, error) {
	cfg, err := f.config(name, a)
	if err != nil {
		return nil, err
	}
	nc, err := store.Connect(cfg)
	if errors.Is(err, nats.ErrNoServers) {
		return nil, noServersErr{err, cfg}
	}
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w%s%s", serversTried(cfg), err, authHint(err, cfg), cfg.TLSHint(err, time.Now()))
	}
	return nc, nil
}

// serverURL names the server nc is connected to, for a message that
// must say which server was asked (an operator with two servers reads "no
// events" of a node as "it does not exist", a fresh user's finding U1):
// its URL without user, password or token.
func serverURL(nc *nats.Conn) string {
	u, err := url.Parse(nc.ConnectedUrl())
	if err != nil || u.Host == "" {
		return "the server this command connected to"
	}
	u.User = nil
	return u.String()
}

// serversTried names the servers cfg connects to: its URLs, or the
// context's when the URLs come from a nats context.
func serversTried(cfg store.ConnectConfig) string {
	if len(cfg.URLs) > 0 {
		return strings.Join(cfg.URLs, ",")
	}
	return "the servers of context " + cfg.Context
}

// noServersErr is a first connection no server answered at all
// (nats.ErrNoServers: "no servers available for connection"), which a
// new user meets when a command runs before the server is up. It says so
// in one line with what to do: "connect to NATS at URL: connect to nats:
// nats: no servers available for connection (no server answered …)" said
// connect three times before the part that helps (a fresh user's finding
// U24).
type noServersErr struct {
	err error
	cfg store.ConnectConfig
}

func (e noServersErr) Error() string {
	return fmt.Sprintf("no NATS server answered at %s: is `meshfold serve` running? "+
		"Name another server with --server URL or $NATS_URL", serversTried(e.cfg))
}

func (e noServersErr) Unwrap() error { return e.err }

// authHint says what to do about a server refusing the connection's
// credentials (nats.ErrAuthorization: "Authorization Violation"), which
// alone names neither the flag nor the role; "" for any other error.
func authHint(err error, cfg store.ConnectConfig) string {
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		return ""
	}
	if cfg.Creds == "" && cfg.NKeySeed == "" && cfg.Context == "" {
		return " (the server requires credentials: give a user's creds file with --creds FILE or $NATS_CREDS: " +
			"controller for want, operator for the operator verbs, operator-read for reads, node-NAME and provisioner-NAME for the agents; " +
			"'meshfold auth init' writes them under DIR/creds)"
	}
	return " (the server refused these credentials: revoked, expired, or issued by another auth directory's operator? 'meshfold auth' issues and revokes them)"
}

// connectWait is connect for the long-running roles (node, provision,
// reconcile): a server not up yet is waited for, with backoff, until ctx
// is done, so that the roles of a mesh may start in any order; so is one
// that dropped the connection before it answered (connectUnanswered).
// Errors that retrying cannot cure (a bad creds file, bad flags, the
// server's refusal of the credentials) end it at once.
func (f *connFlags) connectWait(ctx context.Context, name string, a *app) (*nats.Conn, error) {
	log, err := a.logger()
	if err != nil {
		return nil, err
	}
	return waitFor(ctx, connectUnanswered, func() (*nats.Conn, error) { return f.dial(name, a) },
		func(err error, d time.Duration) { log.Warn("NATS not reachable yet; retrying", "err", err, "in", d) })
}

// connectUnanswered reports whether a first connection failed without
// the server's answer: no server listens (nats.ErrNoServers), or one
// accepted and dropped the connection (EOF, a broken pipe, a reset, a
// timeout, its "Authentication Timeout": a server under load, or going
// down, whose handshake outlasted its 2 s auth timeout). A provisioner
// started against a server at load 40 exited with "write: broken pipe"
// (TestRevokedRolesExit).
func connectUnanswered(err error) bool {
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, os.ErrDeadlineExceeded) || strings.Contains(strings.ToLower(err.Error()), "authentication timeout")
}

// waitFor calls op until it succeeds or fails with an error retryable
// does not report, with jittered backoff (250 ms doubling to 5 s) and
// note called before each wait; when ctx ends it returns op's last error.
func waitFor[T any](ctx context.Context, retryable func(error) bool, op func() (T, error), note func(err error, d time.Duration)) (T, error) {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		v, err := op()
		if err == nil || !retryable(err) {
			return v, err
		}
		d := b.NextBackOff()
		note(err, d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(d):
		}
	}
}

// streamFlags name the stream and its subjects.
type streamFlags struct {
	name   string
	prefix string
}

func (f *streamFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.name, "stream", store.DefaultStreamName, "the event stream's name")
	fl.StringVar(&f.prefix, "prefix", "mesh", "the subject prefix")
}

func (f *streamFlags) config() store.StreamConfig {
	return store.StreamConfig{Name: f.name, Prefix: f.prefix}
}

// openStream looks the existing stream up (it never creates one: only the
// reconciler does) and returns its effective configuration. A cluster
// electing the stream's leader is waited out until ctx ends (30 s when
// ctx has no deadline: store.OpenStreamRiding), not for a fixed 10 s: a
// publishing verb's --timeout bounds it (a fresh user's finding V2).
func (f *streamFlags) openStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, store.StreamConfig, error) {
	return store.OpenStreamRiding(ctx, js, f.config())
}

// openStreamWait is openStream for the long-running roles: a stream the
// reconciler has not created yet is waited for, with backoff, until ctx is
// done.
func (f *streamFlags) openStreamWait(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (jetstream.Stream, store.StreamConfig, error) {
	type opened struct {
		st  jetstream.Stream
		cfg store.StreamConfig
	}
	o, err := waitFor(ctx, func(err error) bool { return errors.Is(err, store.ErrNoStream) }, func() (opened, error) {
		st, cfg, err := f.openStream(ctx, js)
		return opened{st, cfg}, err
	}, func(_ error, d time.Duration) {
		log.Warn("the event stream does not exist yet; waiting for the reconciler", "stream", f.name, "in", d)
	})
	return o.st, o.cfg, err
}
