package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultListen is the client listen address of an embedded server when
// [EmbeddedConfig.Listen] is empty.
const DefaultListen = "127.0.0.1:4222"

// EmbeddedConfig configures an embedded nats-server with JetStream.
type EmbeddedConfig struct {
	// DataDir holds the server's state; JetStream's file store is
	// DataDir/jetstream. Required: an empty StoreDir would make the server
	// share $TMPDIR/nats/jetstream with every other process.
	DataDir string
	// Listen is the client address, host:port. Empty means
	// [DefaultListen]; port 0 or -1 picks a free port (see
	// [Embedded.ClientURL]).
	Listen string
	// ServerName names the server; empty means "meshfold".
	ServerName string
	// Logger receives the server's log lines (notice → Info, warn → Warn,
	// error and fatal → Error, debug and trace → Debug). Nil silences them.
	Logger *slog.Logger
}

// Embedded is a running in-process nats-server with JetStream enabled.
type Embedded struct {
	srv *server.Server
}

// readyTimeout bounds how long StartEmbedded waits for the server to accept
// connections.
const readyTimeout = 10 * time.Second

// StartEmbedded starts a nats-server with JetStream and a file store under
// cfg.DataDir and returns once it accepts connections. Restarting on the
// same DataDir recovers every acknowledged message (the file store fsyncs
// every 2 minutes by default: a process crash loses nothing acknowledged,
// a power loss can lose the last interval; see docs/store.md).
//
// Errors: a missing DataDir, an unparsable Listen, a server that fails to
// start or is not ready within 10 s.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded nats: DataDir is required")
	}
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, fmt.Errorf("embedded nats: listen %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT // for nats-server, 0 means its default 4222
	}
	name := cfg.ServerName
	if name == "" {
		name = "meshfold"
	}
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "jetstream"),
		NoSigs:     true,
		NoLog:      cfg.Logger == nil,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Logger != nil {
		debug := cfg.Logger.Enabled(context.Background(), slog.LevelDebug)
		srv.SetLoggerV2(&slogAdapter{l: cfg.Logger.With("component", "nats-server")}, debug, false, false)
	}
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats: not ready for connections within %s", readyTimeout)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("embedded nats: JetStream did not start (see the server log)")
	}
	return &Embedded{srv: srv}, nil
}

// ClientURL returns the URL clients in other processes connect to, with the
// port actually bound (nats://127.0.0.1:PORT).
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Server returns the underlying server, for options this package does not
// expose.
func (e *Embedded) Server() *server.Server { return e.srv }

// Connect returns a connection to the embedded server that does not use a
// socket (nats.InProcessServer). opts are applied after it.
func (e *Embedded) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{nats.InProcessServer(e.srv), nats.Name("meshfold-inprocess")}, opts...)
	nc, err := nats.Connect("", all...)
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}
	return nc, nil
}

// Shutdown stops the server and waits until it has stopped, its stores
// flushed and closed. Safe to call twice.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// slogAdapter implements server.Logger on a *slog.Logger.
type slogAdapter struct{ l *slog.Logger }

var _ server.Logger = (*slogAdapter)(nil)

func (a *slogAdapter) Noticef(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Warnf(format string, v ...any)   { a.l.Warn(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Errorf(format string, v ...any)  { a.l.Error(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Fatalf(format string, v ...any) {
	a.l.Error(fmt.Sprintf(format, v...), "fatal", true)
}
func (a *slogAdapter) Debugf(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Tracef(format string, v ...any) {
	a.l.Debug(fmt.Sprintf(format, v...), "trace", true)
}
