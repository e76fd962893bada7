package storetest

import (
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PermPassword is the password of every user of a [PermServer].
const PermPassword = "pw"

// Publish is what a [PermServer] user may publish to. Allow nil is every
// subject (">"); Deny wins over Allow. The zero Publish sets no
// permissions at all, as a config whose user has no permissions block.
type Publish struct {
	Allow, Deny []string
}

// PermServer is an in-process nats-server with JetStream whose users log
// in with a name and [PermPassword] and publish only what their [Publish]
// allows: the server of the tests of permission denials. [PermServer.Deny]
// takes a permission away while the server runs, by a config reload, as
// an operator's edit of the users' permissions and `nats-server --signal
// reload` do: the server applies the new permissions to the connections
// already open.
type PermServer struct {
	srv   *server.Server
	dir   string
	users map[string]Publish
}

// StartPermServer starts a [PermServer] on a random loopback port, its
// JetStream data in t.TempDir(), with users (name to what it may publish)
// and no log. Cleanup shuts it down (and closes every connection
// [PermServer.Connect] made first). It fails the test on any error.
func StartPermServer(t testing.TB, users map[string]Publish) *PermServer {
	t.Helper()
	s := &PermServer{dir: t.TempDir(), users: clonePerms(users)}
	srv, err := server.NewServer(s.options())
	if err != nil {
		t.Fatalf("storetest: perm server: %v", err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("storetest: perm server not ready within 10 s")
	}
	s.srv = srv
	return s
}

func clonePerms(users map[string]Publish) map[string]Publish {
	m := make(map[string]Publish, len(users))
	for name, p := range users {
		m[name] = Publish{Allow: slices.Clone(p.Allow), Deny: slices.Clone(p.Deny)}
	}
	return m
}

// options are the server's options with its users' permissions as they
// are now: the same every time but for those, as a reload needs.
func (s *PermServer) options() *server.Options {
	var users []*server.User
	for name, p := range s.users {
		u := &server.User{Username: name, Password: PermPassword}
		if p.Allow != nil || p.Deny != nil {
			allow := p.Allow
			if allow == nil {
				allow = []string{">"}
			}
			u.Permissions = &server.Permissions{Publish: &server.SubjectPermission{Allow: allow, Deny: p.Deny}}
		}
		users = append(users, u)
	}
	return &server.Options{ServerName: "storetest-perm", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: s.dir, NoLog: true, NoSigs: true, Users: users}
}

// Deny adds subjects to what user may not publish to and reloads the
// server's config with it (user keeps what it was allowed otherwise).
// It returns when the reload was applied, to the open connections too;
// it fails the test when user is not a user of s or the reload fails.
func (s *PermServer) Deny(t testing.TB, user string, subjects ...string) time.Time {
	t.Helper()
	p, ok := s.users[user]
	if !ok {
		t.Fatalf("storetest: perm server: no user %q", user)
	}
	p.Deny = append(slices.Clone(p.Deny), subjects...)
	s.users[user] = p
	if err := s.srv.ReloadOptions(s.options()); err != nil {
		t.Fatalf("storetest: perm server reload: %v", err)
	}
	return time.Now()
}

// Connect connects to s as user, with opts after its own (an error
// handler that says nothing: the denials are expected), and returns the
// connection and a JetStream context of it. Cleanup closes the
// connection. It fails the test on any error.
func (s *PermServer) Connect(t testing.TB, user string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts = append([]nats.Option{nats.UserInfo(user, PermPassword),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, opts...)
	nc, err := nats.Connect(s.srv.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("storetest: connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("storetest: jetstream: %v", err)
	}
	return nc, js
}

// URL is the server's client URL with user and [PermPassword] in it
// (nats://user:pw@127.0.0.1:port), for a command's --server.
func (s *PermServer) URL(user string) string {
	u := url.URL{Scheme: "nats", User: url.UserPassword(user, PermPassword), Host: s.srv.Addr().String()}
	return u.String()
}
