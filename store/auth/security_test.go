package auth_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// A node cannot widen what the subject of a JetStream request grants
// with its body: the server checks a consumer's filter against the one in
// the subject, refuses a direct get body that asks for more than the
// subject's last message, and a wildcard in the subject does not match a
// node's literal token.
func TestScopedJetStreamCannotBeWidened(t *testing.T) {
	s := startSecured(t)
	cfg, _ := fixture(t, s)
	subj := cfg.Subjects()
	ctx := testCtx(t)
	nc, _ := s.mustConnect(t, "node-ace")
	plan := func(node string) string { return subj.Stored(node, events.KindPlan) }

	// A consumer whose subject says ace's plan and whose body says shanks'.
	body, _ := json.Marshal(map[string]any{"stream_name": cfg.Name, "config": map[string]any{
		"name": "forged", "filter_subject": plan("shanks"), "ack_policy": "none", "deliver_policy": "all"}})
	msg, err := nc.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE."+cfg.Name+".forged."+plan("ace"), body)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error == nil {
		t.Fatalf("forged consumer: reply %s (%v), want an error", msg.Data, err)
	}
	t.Logf("forged consumer refused: %s", resp.Error.Description)

	// A direct get of ace's plan whose body asks for sequence 1.
	msg, err = nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+cfg.Name+"."+plan("ace"), []byte(`{"seq":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if st := msg.Header.Get("Status"); st != "408" {
		t.Errorf("direct get with a body: status %q, data %q; want 408", st, msg.Data)
	}

	// Wildcards in the node token of the API subject.
	for _, subject := range []string{
		"$JS.API.CONSUMER.CREATE." + cfg.Name + ".wide.*." + subj.Prefix + ".*.plan",
		"$JS.API.DIRECT.GET." + cfg.Name + ".*." + subj.Prefix + ".*.plan",
		"$JS.API.DIRECT.GET." + cfg.Name,
	} {
		if err := nc.Publish(subject, nil); err != nil {
			t.Fatal(err)
		}
		if err := nc.FlushWithContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := nc.LastError(); !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
			t.Errorf("publish on %s: last error %v, want a permissions violation", subject, err)
		}
	}
}

// The operator may watch the live subjects, but a fill request, whose body
// is a secret, never reaches it.
func TestOperatorNeverSeesFills(t *testing.T) {
	s := startSecured(t)
	cfg, _ := fixture(t, s)
	ctx := testCtx(t)
	onc, _ := s.mustConnect(t, "operator")
	sub, err := onc.SubscribeSync(cfg.Prefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := onc.FlushWithContext(ctx); err != nil || onc.LastError() != nil {
		t.Fatalf("operator watching %s.>: %v %v", cfg.Prefix, err, onc.LastError())
	}
	pnc, _ := s.mustConnect(t, "provisioner-ace")
	if _, err := pnc.RequestWithContext(ctx, cfg.Subjects().Fill("ace"), []byte("s3cr3t")); err != nil {
		t.Fatal(err)
	}
	// A marker published after the fill arrives after it, if it arrives.
	_, cjs := s.mustConnect(t, "controller")
	if _, err := cjs.Publish(ctx, cfg.Subjects().Event("ace", events.KindWant), []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(m.Subject, ".fill") || strings.Contains(string(m.Data), "s3cr3t") {
			t.Fatalf("the operator received %s: %q", m.Subject, m.Data)
		}
		if m.Subject == cfg.Subjects().Event("ace", events.KindWant) {
			return
		}
	}
}

// No credentials, credentials of another operator, and a revoked user are
// refused; a revocation pushed to the running server closes the user's
// connections at once and leaves the others alone.
func TestRefusedCredentials(t *testing.T) {
	s := startSecured(t)
	ctx := testCtx(t)

	if nc, err := nats.Connect(s.srv.ClientURL()); err == nil || !isAuthError(err) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("no credentials: %v, want an authorization violation", err)
	}
	other, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.srv.ClientURL(), nats.UserCredentials(other.CredsPath("controller"))); err == nil || !isAuthError(err) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("another operator's controller: %v, want an authorization violation", err)
	}

	revoked, closed := make(chan error, 1), make(chan struct{})
	shanks, err := s.connect("node-shanks",
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case revoked <- err:
			default:
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatal(err)
	}
	defer shanks.Close()
	ace, _ := s.mustConnect(t, "node-ace")

	if err := s.dir.Revoke("node-shanks"); err != nil {
		t.Fatal(err)
	}
	sys, _ := s.mustConnect(t, auth.SystemUser)
	rep, err := s.dir.Push(ctx, sys)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Servers) != 1 || !rep.Applied() || rep.Servers[0].Message != "jwt updated" {
		t.Errorf("push to one server: %+v, want its one answer, jwt updated", rep)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("node-shanks's connection is still open after the push")
	}
	select {
	case err := <-revoked:
		if !errors.Is(err, nats.ErrAuthRevoked) {
			t.Errorf("node-shanks was told %v, want %v", err, nats.ErrAuthRevoked)
		}
	default:
		t.Error("node-shanks was closed without being told it was revoked")
	}
	if nc, err := s.connect("node-shanks"); err == nil || !isAuthError(err) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("revoked node-shanks connecting: %v, want an authorization violation", err)
	}
	if err := ace.FlushWithContext(ctx); err != nil || !ace.IsConnected() {
		t.Errorf("node-ace after revoking node-shanks: %v", err)
	}

	// A user that is not the system user cannot push: its request is
	// answered by no one, or refused.
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := s.dir.Push(pctx, ace); err == nil {
		t.Error("node-ace pushed an account update")
	}

	// Revoked, the node is issued again with a new key.
	users, err := s.dir.AddNode("shanks")
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 1 || users[0].Name != "node-shanks" || users[0].Revoked != nil {
		t.Errorf("added again: %+v, want node-shanks alone, valid", users)
	}
	nc, err := s.connect("node-shanks")
	if err != nil {
		t.Fatalf("re-issued node-shanks: %v", err)
	}
	nc.Close()
}

// resolver.conf configures a standalone nats-server (a full resolver) with
// the same operator and accounts; a revocation pushed to it is applied.
func TestResolverConfigForAnExternalServer(t *testing.T) {
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddNode("ace"); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	rc, err := d.ResolverConfigFor(filepath.Join(work, "jwt"))
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(work, "resolver.conf"), []byte(rc), 0o644))
	conf := "host: 127.0.0.1\nport: -1\njetstream: {store_dir: " + `"` + filepath.Join(work, "js") + `"` + "}\ninclude \"resolver.conf\"\n"
	must(t, os.WriteFile(filepath.Join(work, "nats-server.conf"), []byte(conf), 0o644))
	opts, err := server.ProcessConfigFile(filepath.Join(work, "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(readyTimeout) {
		t.Fatal("not ready")
	}
	connect := func(user string) (*nats.Conn, error) {
		return store.Connect(store.ConnectConfig{URLs: []string{srv.ClientURL()}, Creds: d.CredsPath(user), Name: user})
	}
	ctx := testCtx(t)
	ace, err := connect("node-ace")
	if err != nil {
		t.Fatalf("node-ace: %v", err)
	}
	defer ace.Close()
	sys, err := connect(auth.SystemUser)
	if err != nil {
		t.Fatalf("sys: %v", err)
	}
	defer sys.Close()
	must(t, d.Revoke("node-ace"))
	if rep, err := d.Push(ctx, sys); err != nil || !rep.Applied() {
		t.Fatalf("push: %+v %v", rep, err)
	}
	if nc, err := connect("node-ace"); err == nil || !isAuthError(err) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("revoked node-ace: %v, want an authorization violation", err)
	}
}

// The policy names the node agent's micro service as package node does.
func TestNodeServiceName(t *testing.T) {
	p, err := auth.Permissions(auth.RoleNode, "ace", auth.Names{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Sub.Allow.Contains("$SRV.INFO." + node.ServiceName) {
		t.Errorf("node permissions %v do not name service %q", p.Sub.Allow, node.ServiceName)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
