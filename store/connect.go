package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ConnectConfig says how to reach an external NATS deployment. Every
// field is optional; explicit fields override what the context file says.
type ConnectConfig struct {
	// URLs are server URLs (nats://, tls://, ws://); an entry may hold a
	// comma-separated list. Empty: the context's url, else
	// nats://127.0.0.1:4222.
	URLs []string
	// Creds is the path of a user credentials file (JWT and seed).
	Creds string
	// NKeySeed is the path of a file holding a user NKey seed.
	NKeySeed string
	// TLSCA, TLSCert and TLSKey are PEM file paths: the CA to trust, and
	// the client certificate and key (the two go together).
	TLSCA, TLSCert, TLSKey string
	// Context names a `nats` CLI context: NAME reads
	// $XDG_CONFIG_HOME/nats/context/NAME.json (default
	// ~/.config/nats/context/NAME.json); a value ending in .json or
	// holding a path separator is read as a file path. The fields url,
	// creds, nkey, cert, key, ca, user, password, token, inbox_prefix and
	// tls_first are used.
	Context string
	// InboxPrefix is the first token of the connection's reply subjects
	// (nats.CustomInboxPrefix). Empty: the context's inbox_prefix, else
	// the one the creds file's JWT names (see [CredsInboxPrefix]), else
	// NATS's default _INBOX.
	InboxPrefix string
	// Name is the connection name the server shows; default "meshfold".
	Name string
	// Logger receives disconnect, reconnect, close and asynchronous error
	// reports; nil uses slog.Default().
	Logger *slog.Logger
}

// natsContext is the part of a natscli context file meshfold uses (the
// format of github.com/nats-io/jsm.go/natscontext).
type natsContext struct {
	URL         string `json:"url"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Token       string `json:"token"`
	InboxPrefix string `json:"inbox_prefix"`
	TLSFirst    bool   `json:"tls_first"`
}

// contextPath resolves a context name or path to its file.
func contextPath(name string) (string, error) {
	if strings.HasSuffix(name, ".json") || strings.ContainsRune(name, os.PathSeparator) || strings.Contains(name, "/") {
		return expandHome(name), nil
	}
	if strings.Contains(name, "..") {
		return "", fmt.Errorf("nats context %q: invalid name", name)
	}
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("nats context %q: %w", name, err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "nats", "context", name+".json"), nil
}

// expandHome expands a leading ~/ as natscli does for paths in contexts.
func expandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, p[1:])
		}
	}
	return p
}

func loadContext(name string) (natsContext, error) {
	var c natsContext
	path, err := contextPath(name)
	if err != nil {
		return c, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("nats context %q: %w", name, err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("nats context %q: %s: %w", name, path, err)
	}
	c.Creds, c.NKey = expandHome(c.Creds), expandHome(c.NKey)
	c.Cert, c.Key, c.CA = expandHome(c.Cert), expandHome(c.Key), expandHome(c.CA)
	return c, nil
}

// Reconnect pacing: unlimited attempts, 2 s apart plus up to 1 s (2 s with
// TLS) of jitter so a fleet does not reconnect in lockstep.
const (
	reconnectWait      = 2 * time.Second
	reconnectJitter    = time.Second
	reconnectJitterTLS = 2 * time.Second
)

// connectTimeout bounds a connect's whole exchange with the server (the
// dial, INFO, the TLS handshake, CONNECT with its signature, the first
// PING): nats.go's 2 s default ran out on a loaded 2-core machine with
// mutual TLS ("i/o timeout"), and the command failed. 5 s, as long as a
// JetStream request may take.
const connectTimeout = 5 * time.Second

// MaxReconnectDelay is the longest a connection made with [ConnectConfig.Options]
// waits, after its server is reachable again, before its next reconnect
// attempt: the wait plus TLS's jitter (4 s). A node agent renews its lease
// on that reconnect, so a server back from an outage sees every live
// agent's lease written again within this delay and one renewal period.
const MaxReconnectDelay = reconnectWait + reconnectJitterTLS

// Options returns the nats.Connect options c describes, the servers
// included: use them as nats.Connect("", opts...) and append your own.
// They reconnect forever with a jittered wait and log disconnects,
// reconnects, the close and asynchronous errors (slow consumer,
// permission denied) through c.Logger. Connection URLs are logged with
// their credentials redacted.
//
// Errors (each [ErrBadConfig]: a fault of the configuration, which no
// retry cures): an unreadable or malformed context file, an unreadable
// NKey seed, an unreadable creds file or one without a user JWT or seed, a
// client certificate without its key or the reverse, an unreadable or
// malformed TLS CA, certificate or key file.
func (c ConnectConfig) Options() ([]nats.Option, error) {
	opts, _, err := c.options()
	if err != nil {
		return nil, badConfig{err}
	}
	return opts, nil
}

// ErrBadConfig is what every error of [ConnectConfig.Options] (and so of
// [Connect] before it dials) matches with errors.Is: the configuration
// itself is wrong (a file named is missing or malformed), not the
// deployment; retrying cannot cure it.
var ErrBadConfig = errors.New("store: bad connection configuration")

// badConfig marks err as [ErrBadConfig] without changing its text.
type badConfig struct{ err error }

func (e badConfig) Error() string        { return e.err.Error() }
func (e badConfig) Unwrap() error        { return e.err }
func (e badConfig) Is(target error) bool { return target == ErrBadConfig }

func (c ConnectConfig) options() ([]nats.Option, func(*nats.Conn), error) {
	var ctx natsContext
	if c.Context != "" {
		var err error
		if ctx, err = loadContext(c.Context); err != nil {
			return nil, nil, err
		}
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	name := c.Name
	if name == "" {
		name = "meshfold"
	}

	var servers []string
	urls := c.URLs
	if len(urls) == 0 && ctx.URL != "" {
		urls = []string{ctx.URL}
	}
	for _, u := range urls {
		for _, s := range strings.Split(u, ",") {
			if s = strings.TrimSpace(s); s != "" {
				servers = append(servers, s)
			}
		}
	}
	if len(servers) == 0 {
		servers = []string{nats.DefaultURL}
	}

	// last is the server URL each connection made with these options
	// was last connected to (set when it connects and reconnects): once
	// disconnected, nats.Conn.ConnectedUrl is empty, and the disconnect
	// is logged with the URL it lost, or without one when none is known.
	// Keyed by connection: a [Companion] shares these handlers.
	var last sync.Map // *nats.Conn → string
	keep := func(nc *nats.Conn) {
		if u := nc.ConnectedUrlRedacted(); u != "" {
			last.Store(nc, u)
		}
	}
	// named adds the connection's name to a line about a companion (a
	// connection opened with nc's options and a name of its own): the
	// lines of the connection these options were made for stay as they
	// were.
	named := func(nc *nats.Conn, attrs []any) []any {
		if n := nc.Opts.Name; n != name {
			attrs = append(attrs, "conn", n)
		}
		return attrs
	}
	opts := []nats.Option{
		func(o *nats.Options) error { o.Servers = servers; return nil },
		nats.Name(name),
		nats.Timeout(connectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectJitter, reconnectJitterTLS),
		nats.ConnectHandler(keep),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			var attrs []any
			u := nc.ConnectedUrlRedacted()
			if p, ok := last.Load(nc); u == "" && ok {
				u = p.(string)
			}
			if u != "" {
				attrs = append(attrs, "url", u)
			}
			attrs = named(nc, attrs)
			if err != nil {
				log.Warn("nats disconnected", append(attrs, "err", err)...)
			} else {
				log.Debug("nats disconnected", attrs...)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			keep(nc)
			log.Info("nats reconnected", named(nc, []any{"url", nc.ConnectedUrlRedacted(), "server", nc.ConnectedServerName()})...)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			last.Delete(nc)
			if err := nc.LastError(); err != nil {
				log.Warn("nats connection closed", named(nc, []any{"err", err})...)
			} else {
				log.Debug("nats connection closed", named(nc, nil)...)
			}
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("nats async error", named(nc, []any{"subject", sub.Subject, "err", err})...)
			} else {
				log.Error("nats async error", named(nc, []any{"err", err})...)
			}
		}),
	}

	// Authentication: an explicit creds file or NKey seed replaces
	// whatever the context says; otherwise the context's, in natscli's
	// order (user, creds, nkey), with its token.
	switch {
	case c.Creds != "":
		if err := checkCreds(c.Creds); err != nil {
			return nil, nil, err
		}
		opts = append(opts, nats.UserCredentials(c.Creds))
	case c.NKeySeed != "":
		o, err := nats.NkeyOptionFromSeed(c.NKeySeed)
		if err != nil {
			return nil, nil, fmt.Errorf("nkey seed %s: %w", c.NKeySeed, err)
		}
		opts = append(opts, o)
	default:
		switch {
		case ctx.User != "":
			opts = append(opts, nats.UserInfo(ctx.User, ctx.Password))
		case ctx.Creds != "":
			if err := checkCreds(ctx.Creds); err != nil {
				return nil, nil, fmt.Errorf("nats context %q: %w", c.Context, err)
			}
			opts = append(opts, nats.UserCredentials(ctx.Creds))
		case ctx.NKey != "":
			o, err := nats.NkeyOptionFromSeed(ctx.NKey)
			if err != nil {
				return nil, nil, fmt.Errorf("nats context %q: nkey %s: %w", c.Context, ctx.NKey, err)
			}
			opts = append(opts, o)
		}
		if ctx.Token != "" {
			opts = append(opts, nats.Token(ctx.Token))
		}
	}

	cert, key := ctx.Cert, ctx.Key
	if c.TLSCert != "" || c.TLSKey != "" {
		cert, key = c.TLSCert, c.TLSKey
	}
	switch {
	case cert != "" && key != "":
		opts = append(opts, nats.ClientCert(cert, key))
	case cert != "" || key != "":
		return nil, nil, errors.New("TLS client certificate and key must be given together")
	}
	ca := ctx.CA
	if c.TLSCA != "" {
		ca = c.TLSCA
	}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	inbox := c.InboxPrefix
	if inbox == "" {
		inbox = ctx.InboxPrefix
	}
	if inbox == "" {
		creds := c.Creds
		if creds == "" && c.NKeySeed == "" && ctx.User == "" {
			creds = ctx.Creds
		}
		if creds != "" {
			p, err := CredsInboxPrefix(creds)
			if err != nil {
				return nil, nil, err
			}
			inbox = p
		}
	}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	if ctx.TLSFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	// The TLS options read their files when applied, inside nats.Connect,
	// where a missing file would look like a failed connection: apply
	// them here first, so that it is a configuration error.
	var scratch nats.Options
	for _, o := range opts {
		if err := o(&scratch); err != nil {
			return nil, nil, err
		}
	}
	return opts, keep, nil
}

// checkCreds reads the creds file at path and checks that it holds a
// user JWT and an NKey seed, the two nats.UserCredentials reads only
// when it connects.
func checkCreds(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("creds: %w", err)
	}
	if _, err := nkeys.ParseDecoratedJWT(data); err != nil {
		return fmt.Errorf("creds %s: %w", path, err)
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return fmt.Errorf("creds %s: no NKey seed: %w", path, err)
	}
	kp.Wipe()
	return nil
}

// Authenticated reports whether c connects as a user of its own: a creds
// file or an NKey seed given, or a user, creds file, NKey seed or token
// named by its context.
//
// Errors: an unreadable or malformed context file.
func (c ConnectConfig) Authenticated() (bool, error) {
	if c.Creds != "" || c.NKeySeed != "" {
		return true, nil
	}
	if c.Context == "" {
		return false, nil
	}
	ctx, err := loadContext(c.Context)
	if err != nil {
		return false, err
	}
	return ctx.User != "" || ctx.Creds != "" || ctx.NKey != "" || ctx.Token != "", nil
}

// InboxPrefixToken is how a user's own inbox prefix is named:
// InboxPrefixToken + the user's name, "_INBOX_node-ace" for the user
// node-ace. meshfold's credentials (package store/auth) allow each user to
// subscribe to its own inbox only.
const InboxPrefixToken = "_INBOX_"

// CredsInboxPrefix returns the inbox prefix a user must connect with, read
// from the user JWT in the creds file at path: "_INBOX_<name>" when the
// JWT allows subscribing to "_INBOX_<name>.>" (its name claim), "" (NATS's
// default, _INBOX) otherwise. The JWT is decoded, not verified: the server
// verifies it.
//
// Errors: an unreadable file; no user JWT in it.
func CredsInboxPrefix(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("creds: %w", err)
	}
	tok, err := nkeys.ParseDecoratedJWT(data)
	if err != nil {
		return "", fmt.Errorf("creds %s: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("creds %s: user JWT: %w", path, err)
	}
	p := InboxPrefixToken + uc.Name
	if uc.Name != "" && slices.Contains(uc.Sub.Allow, p+".>") {
		return p, nil
	}
	return "", nil
}

// Connect connects to the deployment cfg describes (see
// [ConnectConfig.Options]). The first connection must succeed; after that
// the connection reconnects forever.
//
// Errors: those of Options, and the first connection's failure.
func Connect(cfg ConnectConfig) (*nats.Conn, error) {
	opts, keep, err := cfg.options()
	if err != nil {
		return nil, badConfig{err}
	}
	// The error unwrapped: callers name the server they tried, and a
	// "connect to nats:" here made their line say connect twice.
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, err
	}
	// The server's URL kept at once for the disconnect's log line: the
	// connect handler that keeps it runs asynchronously, and one that
	// ran after a disconnect found no URL to keep (url="" logged; under
	// load in TestDisconnectLogsLastURL).
	keep(nc)
	return nc, nil
}

// Companion opens a second connection to the deployment nc is connected
// to, with nc's options as they are when it is called: its servers,
// credentials, TLS, inbox prefix, reconnect pacing and handlers (those
// [ConnectConfig.Options] sets log its disconnects, reconnects, close and
// asynchronous errors as nc's, each line naming it: conn=name), named
// name, which the server shows (its connz). The same user opens both:
// meshfold's credentials (package store/auth) set no connection limit.
// The caller closes it, with nc. Handlers chained onto nc after the call
// are nc's alone.
//
// A companion is for a role whose reads must not share a connection with
// its own asynchronous writes: the reconciler writes its effects and
// snapshots on one, and its partitions' pull requests went unanswered
// now and then while they shared one (docs/architecture.md, "The
// reconciler writes on a connection of its own").
//
// Errors: nats.ErrConnectionClosed when nc is closed; the first
// connection's failure, as nc's own first connect would fail.
func Companion(nc *nats.Conn, name string) (*nats.Conn, error) {
	if nc.IsClosed() {
		return nil, nats.ErrConnectionClosed
	}
	o := nc.Opts
	o.Name = name
	c, err := o.Connect()
	if err != nil {
		return nil, fmt.Errorf("connection %q: %w", name, err)
	}
	return c, nil
}
