package embedded

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store"
)

// DefaultListen is the client listen address of an embedded server when
// [Config.Listen] is empty.
const DefaultListen = "127.0.0.1:4222"

// Config configures an embedded nats-server with JetStream.
type Config struct {
	// DataDir holds the server's state; JetStream's file store is
	// DataDir/jetstream. Required: an empty StoreDir would make the server
	// share $TMPDIR/nats/jetstream with every other process.
	DataDir string
	// Listen is the client address, host:port. Empty means
	// [DefaultListen]; port 0 or -1 picks a free port (see
	// [Server.ClientURL]).
	Listen string
	// ServerName names the server; empty means "meshfold".
	ServerName string
	// Logger receives the server's log lines (notice → Info, warn → Warn,
	// error and fatal → Error, debug and trace → Debug). Nil silences them.
	Logger *slog.Logger
	// Auth, when set, runs the server in operator mode (decentralized JWT
	// authentication): only users signed by an account the operator
	// signed may connect, with the permissions their JWT carries. Nil:
	// no authentication (anyone who reaches the port may do anything).
	Auth *store.ServerAuth
	// TLSCert and TLSKey are PEM files: when both are set, clients must
	// connect with TLS. TLSClientCA, when set as well, is the CA whose
	// certificates clients must present (mutual TLS). In-process
	// connections ([Server.Connect]) never use TLS.
	TLSCert, TLSKey, TLSClientCA string
}

// authOptions sets the server options of operator mode from a, and
// returns the public keys of its accounts.
func authOptions(opts *server.Options, a *store.ServerAuth) ([]string, error) {
	op, err := jwt.DecodeOperatorClaims(a.OperatorJWT)
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	if a.SystemAccount == "" {
		return nil, errors.New("operator mode: SystemAccount is required")
	}
	res := &server.MemAccResolver{}
	var accounts []string
	for _, s := range a.AccountJWTs {
		ac, err := jwt.DecodeAccountClaims(s)
		if err != nil {
			return nil, fmt.Errorf("account JWT: %w", err)
		}
		if !op.DidSign(ac) {
			return nil, fmt.Errorf("account %s (%s) is not signed by operator %s", ac.Name, ac.Subject, op.Subject)
		}
		if err := res.Store(ac.Subject, s); err != nil {
			return nil, fmt.Errorf("account %s: %w", ac.Subject, err)
		}
		accounts = append(accounts, ac.Subject)
	}
	if !slices.Contains(accounts, a.SystemAccount) {
		return nil, fmt.Errorf("operator mode: no JWT for the system account %s", a.SystemAccount)
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{op}
	opts.SystemAccount = a.SystemAccount
	opts.AccountResolver = res
	// A user's JWT travels in its CONNECT line: the reconciler's, with
	// its role's permissions, is near the default 4 KiB limit.
	opts.MaxControlLine = store.MaxControlLine
	return accounts, nil
}

// Server is a running in-process nats-server with JetStream enabled.
type Server struct {
	srv   *server.Server
	lock  *os.File // the data directory's lock, released by Shutdown
	watch *storageWatch
	once  sync.Once
}

// readyTimeout bounds how long Start waits for the server to accept
// connections.
const readyTimeout = 10 * time.Second

// Start starts a nats-server with JetStream and a file store under
// cfg.DataDir and returns once it accepts connections. Restarting on the
// same DataDir recovers every acknowledged message (the file store fsyncs
// every 2 minutes by default: a process crash loses nothing acknowledged,
// a power loss can lose the last interval; see docs/store.md).
//
// Errors: a missing DataDir, an unparsable Listen, unusable Auth or TLS
// settings, a server that fails to start or is not ready within 10 s.
func Start(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded nats: DataDir is required")
	}
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, port, err := ParseListen(listen)
	if err != nil {
		return nil, err
	}
	if port == 0 {
		port = server.RANDOM_PORT // for nats-server, 0 means its default 4222
	}
	name := cfg.ServerName
	if name == "" {
		name = "meshfold"
	}
	// Two servers on one store directory would assign the same sequences
	// to different events and lose acknowledged writes: refuse the second.
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	// A busy port fails in milliseconds here, not after the ready timeout.
	if err := probePort(listen, host, port); err != nil {
		lock.Close()
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			lock.Close()
		}
	}()
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "jetstream"),
		NoSigs:     true,
		NoLog:      cfg.Logger == nil,
	}
	var accounts []string
	if cfg.Auth != nil {
		if accounts, err = authOptions(opts, cfg.Auth); err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
	}
	if err := tlsOptions(opts, cfg); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	opts.AuthTimeout = authTimeout.Seconds()
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
	// Load every account now: a claims update pushed for an account the
	// server has not loaded yet is skipped, and the resolver would then
	// hand out the preloaded (older) JWT at the first connection.
	for _, a := range accounts {
		if _, err := srv.LookupAccount(a); err != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, fmt.Errorf("embedded nats: account %s: %w", a, err)
		}
	}
	started = true
	writeHolder(lock, srv.ClientURL())
	// A full data directory stops JetStream storing until its limit is
	// derived anew (full.go): the watch says so and restarts it once
	// there is room.
	w := newStorageWatch(srv, opts, cfg.DataDir, cfg.Logger)
	go w.run(storageCheckEvery)
	return &Server{srv: srv, lock: lock, watch: w}, nil
}

// Check reports, without creating or writing anything, what would make
// [Start] fail before its server runs: a missing DataDir, a Listen that is
// not HOST:PORT ([ErrBadListen]), a port another process listens on, a
// data directory another server holds ([ErrDataDirInUse]), unusable Auth
// or TLS settings. A caller that writes files of its own before Start
// (serve's signing key and trust file) checks first, so that a busy port
// leaves nothing behind; Start checks again (a port taken in between
// still fails it).
func Check(cfg Config) error {
	if cfg.DataDir == "" {
		return errors.New("embedded nats: DataDir is required")
	}
	listen := cfg.Listen
	if listen == "" {
		listen = DefaultListen
	}
	host, port, err := ParseListen(listen)
	if err != nil {
		return err
	}
	if err := probePort(listen, host, port); err != nil {
		return err
	}
	if err := dataDirFree(cfg.DataDir); err != nil {
		return err
	}
	var opts server.Options
	if cfg.Auth != nil {
		if _, err := authOptions(&opts, cfg.Auth); err != nil {
			return fmt.Errorf("embedded nats: %w", err)
		}
	}
	if err := tlsOptions(&opts, cfg); err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	return nil
}

// probePort listens on host:port and closes at once: an error when
// another process listens there. Port 0 and -1 (a free port) pass.
func probePort(listen, host string, port int) error {
	if port <= 0 {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("embedded nats: listen %s: %w", listen, err)
	}
	return ln.Close()
}

// dataDirFree reports ErrDataDirInUse when another process holds the
// lock of dir/LOCK; a directory or LOCK that does not exist is free. It
// creates nothing and keeps no lock.
func dataDirFree(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("embedded nats: data dir: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return inUse(dir)
	}
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

// ErrBadListen: a listen address that is not HOST:PORT with a port
// from -1 to 65535.
var ErrBadListen = errors.New("embedded nats: bad listen address")

// ParseListen splits a listen address, HOST:PORT, into its host and port
// (-1 to 65535; 0 and -1 pick a free port), as [Start] reads
// [Config.Listen]; a caller checks a flag with it before writing
// anything.
//
// Errors: ErrBadListen, wrapped with the address and what is wrong.
func ParseListen(listen string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("%w %q: %v", ErrBadListen, listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("%w %q: the port must be a number from 0 to 65535", ErrBadListen, listen)
	}
	return host, port, nil
}

// ErrDataDirInUse: another process (or Server) holds the data directory.
var ErrDataDirInUse = errors.New("embedded: the data directory is in use by another meshfold server")

// lockDataDir creates dir and takes an exclusive lock on dir/LOCK for the
// life of the server.
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded nats: data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, inUse(dir)
	}
	writeHolder(f, "")
	return f, nil
}

// writeHolder records in the held LOCK who holds it: this process's pid
// and, once the server listens, its client URL, for the message of the
// server refused the directory ([inUse]). Best effort: the lock, not its
// content, guards the directory.
func writeHolder(f *os.File, url string) {
	s := fmt.Sprintf("pid %d\n", os.Getpid())
	if url != "" {
		s += "url " + url + "\n"
	}
	if f.Truncate(0) == nil {
		_, _ = f.WriteAt([]byte(s), 0)
	}
}

// inUse is ErrDataDirInUse for dir, naming the holder its LOCK records
// (pid and URL), so that the operator need not look for it (a fresh
// user's finding U24: "in use by another meshfold server" without which).
func inUse(dir string) error {
	var pid, url string
	if b, err := os.ReadFile(filepath.Join(dir, "LOCK")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && k == "pid" {
				pid = v
			} else if ok && k == "url" {
				url = v
			}
		}
	}
	switch {
	case pid != "" && url != "":
		return fmt.Errorf("%w: %s (pid %s, serving %s)", ErrDataDirInUse, dir, pid, url)
	case pid != "":
		return fmt.Errorf("%w: %s (pid %s)", ErrDataDirInUse, dir, pid)
	}
	return fmt.Errorf("%w: %s", ErrDataDirInUse, dir)
}

// tlsOptions sets the server's TLS options from cfg.
func tlsOptions(opts *server.Options, cfg Config) error {
	switch {
	case cfg.TLSCert == "" && cfg.TLSKey == "" && cfg.TLSClientCA == "":
		return nil
	case cfg.TLSCert == "" || cfg.TLSKey == "":
		return errors.New("TLS: a certificate and its key go together (and a client CA needs both)")
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey,
		CaFile: cfg.TLSClientCA, Verify: cfg.TLSClientCA != ""})
	if err != nil {
		return fmt.Errorf("TLS: %w", err)
	}
	opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, cfg.TLSClientCA != ""
	opts.TLSTimeout = tlsTimeout.Seconds()
	return nil
}

// tlsTimeout bounds a client's TLS handshake: 5 s, as long as the
// client's whole connect may take (store's connectTimeout). The server's
// 2 s default cut handshakes on a loaded 2-core machine.
const tlsTimeout = 5 * time.Second

// authTimeout bounds how long a client may take from its connection to
// its CONNECT (the TLS handshake included): the client's whole connect
// (5 s, store's connectTimeout) and a second, what nats-server picks with
// TLS. Without TLS its default was 2 s: on a loaded 2-core machine a CLI
// that had not signed the nonce and sent its CONNECT in 2 s was cut off
// ("write: broken pipe" at its connect) though it would have been let
// in.
const authTimeout = tlsTimeout + time.Second

// inProcessTimeout bounds an in-process connect's exchange with the
// server (its INFO, CONNECT, the first PING), as store's connectTimeout
// bounds a TCP one: nats.go's default 2 s ended in-process connects
// under load ("read pipe: i/o timeout").
const inProcessTimeout = 5 * time.Second

// ClientURL returns the URL clients in other processes connect to, with the
// port actually bound: nats://127.0.0.1:PORT, or tls://127.0.0.1:PORT when
// the server requires TLS.
func (e *Server) ClientURL() string { return e.srv.ClientURL() }

// NATS returns the underlying nats-server, for options this package does
// not expose.
func (e *Server) NATS() *server.Server { return e.srv }

// StoreStatus returns what the watch of the data directory saw at its
// last look (once a second): whether JetStream takes writes and, if not,
// since when and why, and which streams' file stores keep a write error
// (those answer no write: the client times out). meshfold serve's state
// service answers it (store.StoreStatusName).
func (e *Server) StoreStatus() store.StoreStatus { return e.watch.storeStatus() }

// Connect returns a connection to the embedded server that does not use a
// socket (nats.InProcessServer), its connect bounded by 5 s as a TCP
// one's (store.Connect). opts are applied after these.
func (e *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{nats.InProcessServer(e.srv), nats.Name("meshfold-inprocess"), nats.Timeout(inProcessTimeout)}, opts...)
	nc, err := nats.Connect("", all...)
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}
	return nc, nil
}

// Shutdown stops the server and waits until it has stopped, its stores
// flushed and closed. Safe to call twice.
func (e *Server) Shutdown() {
	e.once.Do(e.watch.close)
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	if e.lock != nil {
		e.lock.Close() // releases the data directory
	}
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
