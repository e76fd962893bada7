package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/storetest"
)

// quiet discards a test connection's log lines.
var quiet = slog.New(slog.DiscardHandler)

// runCLI runs meshfold with args until it returns or ctx is done.
func runCLI(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out bytes.Buffer
	var errb storetest.SyncBuffer
	code = run(ctx, append(args, "--log-level", "warn"), nil, &out, &errb)
	return code, out.String(), errb.String()
}

func TestAuthVerbs(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "auth")
	code, out, errs := runCLI(ctx, "auth", "init", "--dir", dir)
	if code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	for _, u := range []string{"reconciler", "controller", "operator", "sys"} {
		if !strings.Contains(out, filepath.Join(dir, "creds", u+".creds")) {
			t.Errorf("auth init does not name %s's creds:\n%s", u, out)
		}
	}
	for path, mode := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, "operator.nk"): 0o600,
		filepath.Join(dir, "accounts", "MESH.nk"): 0o600, filepath.Join(dir, "creds", "controller.creds"): 0o600,
		filepath.Join(dir, "auth.json"): 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, want mode %v", path, err, mode)
		}
	}
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitUsage || !strings.Contains(errs, "--force") {
		t.Errorf("auth init over an auth directory: %d %s, want a usage error naming --force", code, errs)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "operator.jwt"))
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir, "--force"); code != exitOK {
		t.Errorf("auth init --force: %d %s", code, errs)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "operator.jwt")); bytes.Equal(before, after) {
		t.Error("auth init --force kept the operator")
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := runCLI(ctx, "auth", "init", "--dir", other, "--force"); code != exitUsage {
		t.Errorf("auth init --force over a directory that is not an auth directory: exit %d, want %d", code, exitUsage)
	}
	if _, err := os.Stat(filepath.Join(other, "notes.txt")); err != nil {
		t.Errorf("auth init --force touched a foreign directory: %v", err)
	}

	if code, out, errs := runCLI(ctx, "auth", "add-node", "ace", "--dir", dir); code != exitOK ||
		!strings.Contains(out, "node-ace") || !strings.Contains(out, "provisioner-ace") {
		t.Fatalf("auth add-node: %d %s %s", code, out, errs)
	}
	if code, _, _ := runCLI(ctx, "auth", "add-node", "ace", "--dir", dir); code != exitUsage {
		t.Errorf("auth add-node twice: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := runCLI(ctx, "auth", "add-node", "Ace!", "--dir", dir); code != exitUsage {
		t.Errorf("auth add-node with a bad name: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := runCLI(ctx, "auth", "revoke", "nobody", "--dir", dir, "--no-push"); code != exitUsage {
		t.Errorf("auth revoke of an unknown user: exit %d, want %d", code, exitUsage)
	}
	if code, out, _ := runCLI(ctx, "auth", "revoke", "node-ace", "--dir", dir, "--no-push"); code != exitOK || !strings.Contains(out, "not pushed") {
		t.Errorf("auth revoke --no-push: %d %s", code, out)
	}
	if code, out, errs := runCLI(ctx, "auth", "add-node", "ace", "--dir", dir); code != exitOK || !strings.Contains(out, "node-ace") || strings.Contains(out, "provisioner-ace") {
		t.Errorf("auth add-node after revoking node-ace: %d %s %s, want node-ace issued again alone", code, out, errs)
	}
	if code, _, _ := runCLI(ctx, "auth", "add-user", "operator-read", "--dir", dir); code != exitUsage {
		t.Errorf("auth add-user of a valid user: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := runCLI(ctx, "auth", "add-user", "node", "--dir", dir); code != exitUsage {
		t.Errorf("auth add-user node: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := runCLI(ctx, "auth", "revoke", "operator-read", "--dir", dir, "--no-push"); code != exitOK {
		t.Errorf("auth revoke operator-read: exit %d", code)
	}
	if code, out, errs := runCLI(ctx, "auth", "add-user", "operator-read", "--dir", dir); code != exitOK || !strings.Contains(out, "operator-read.creds") {
		t.Errorf("auth add-user operator-read after revoking it: %d %s %s", code, out, errs)
	}
	if code, _, errs := runCLI(ctx, "serve", "--auth", dir, "--prefix", "other", "--data", t.TempDir()); code != exitUsage {
		t.Errorf("serve --auth with another prefix: %d %s, want a usage error", code, errs)
	}
}

// lines is an io.Writer that hands each complete line to a channel; safe
// for the concurrent writes of a process's goroutines (a lease renewal and
// a reconnect handler log at once).
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line)
			return len(p), nil
		}
		select {
		case l.ch <- line:
		default:
		}
	}
}

// watchBuffer is a storetest.SyncBuffer that calls onViolation when a permissions
// violation is written to it.
type watchBuffer struct {
	storetest.SyncBuffer
	onViolation func()
}

func (w *watchBuffer) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("Violation")) {
		w.onViolation()
	}
	return w.SyncBuffer.Write(p)
}

// Incident 1 end to end with every role on its own credentials, over
// mutual TLS, each role a real command: serve --auth (the reconciler
// inside it as its user), node, provision, want (controller), audit
// (operator), and a revocation pushed to the running server.
func TestIncident1WithCredentialsOverTLS(t *testing.T) {
	t.Parallel()
	// A refused component would otherwise show only as a wait running
	// out: a permissions violation in any component's log ends the test.
	ctx, refused := context.WithCancel(testCtx(t))
	defer refused()
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	tf := storetest.TLS(t)

	// background runs a long-lived command until the test ends.
	var stops []func()
	t.Cleanup(func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	})
	background := func(name string, stdout *lines, args ...string) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		errb := &watchBuffer{onViolation: refused}
		go func() {
			defer close(done)
			if stdout == nil {
				stdout = &lines{ch: make(chan string)}
			}
			if code := run(cctx, append(args, "--log-level", "warn"), nil, stdout, errb); code != exitOK {
				t.Errorf("%s: exit %d: %s", name, code, errb.String())
			}
		}()
		stops = append(stops, func() {
			cancel()
			<-done
			if s := errb.String(); strings.Contains(s, "iolation") {
				t.Errorf("%s was refused something:\n%s", name, s)
			}
		})
	}

	serveOut := &lines{ch: make(chan string, 4)}
	background("serve", serveOut, "serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0",
		"--tls-cert", tf.ServerCert, "--tls-key", tf.ServerKey, "--tls-client-ca", tf.CA)
	var url string
	select {
	case l := <-serveOut.ch:
		m := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("serve printed %q", l)
		}
		url = m[1]
	case <-ctx.Done():
		t.Fatal("serve did not start")
	}
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("serve listens on %s, want tls://", url)
	}
	as := func(user string) []string {
		return []string{"--server", url, "--creds", d.CredsPath(user), "--tls-ca", tf.CA, "--tls-cert", tf.ClientCert, "--tls-key", tf.ClientKey}
	}
	connect := func(user string) (*nats.Conn, error) {
		return store.Connect(store.ConnectConfig{URLs: []string{url}, Creds: d.CredsPath(user), Name: user,
			TLSCA: tf.CA, TLSCert: tf.ClientCert, TLSKey: tf.ClientKey, Logger: quiet})
	}

	// The operator watches ace's events.
	onc, err := connect("operator")
	if err != nil {
		t.Fatal(err)
	}
	defer onc.Close()
	ojs, err := jetstream.New(onc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.StreamConfig{}.WithDefaults()
	cons, err := ojs.OrderedConsumer(ctx, cfg.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{cfg.Subjects().StoredNode("ace")}, InactiveThreshold: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	watch, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	waitFor := func(what string, pred func(events.Event) bool) events.Event {
		t.Helper()
		for {
			m, err := watch.Next(jetstream.NextContext(ctx))
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			meta, _ := m.Metadata()
			ev, err := cfg.Subjects().DecodeEvent(m.Subject(), m.Data(), meta.Sequence.Stream, meta.Timestamp)
			if err == nil && ev.Err == nil && pred(ev) {
				return ev
			}
		}
	}

	const path = "/run/mesh-build-go/broker.creds"
	const secret = "broker credential of ace"
	secrets, root := filepath.Join(base, "secrets"), filepath.Join(base, "ace-root")
	src := filepath.Join(secrets, "mesh-build-go", path)
	if err := os.MkdirAll(filepath.Dir(src), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	trust := filepath.Join(dir, trustFileName) // written by auth init, copied to each node
	background("node", nil, append([]string{"node", "ace", "--runtime", "record", "--root", root, "--state-dir", filepath.Join(base, "ace-state"), "--trust", trust}, as("node-ace")...)...)
	// Sealed secrets first, the directory after: until a secret is put,
	// the directory fills.
	background("provision", nil, append([]string{"provision", "ace", "--from", "sealed", "--from", secrets, "--key", filepath.Join(base, "prov", "curve.key"),
		"--account", "prov", "--trust", trust}, as("provisioner-ace")...)...)

	want := func(body string) uint64 {
		t.Helper()
		code, out, errs := runCLI(ctx, append([]string{"want", "ace", "--new", "-f", writeWantFile(t, body)}, as("controller")...)...)
		m := regexp.MustCompile(`stream sequence (\d+)`).FindStringSubmatch(out)
		if code != exitOK || m == nil {
			t.Fatalf("want: %d %s %s", code, out, errs)
		}
		seq, _ := strconv.ParseUint(m[1], 10, 64)
		return seq
	}
	const prov = `{"name":"provisioner","build":"p:1","runs_as":"prov","provisioner":true}`
	w1 := want(`{"modules":[` + prov + `]}`)
	p1 := waitFor("the first plan", func(ev events.Event) bool {
		p, ok := ev.Payload.(*events.Plan)
		return ok && p.Cause == w1
	})
	waitFor("its settle", func(ev events.Event) bool {
		s, ok := ev.Payload.(*events.Settle)
		return ok && s.Plan == p1.Seq
	})

	// The provisioner's credential runs ahead of the declaration.
	pnc, err := connect("provisioner-ace")
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(cfg.Subjects().Fill("ace"))
	msg.Header.Set(events.HeaderModule, "mesh-build-go")
	msg.Header.Set(events.HeaderPath, path)
	msg.Header.Set(events.HeaderWriter, "prov")
	msg.Data = []byte(secret)
	resp, err := pnc.RequestMsgWithContext(ctx, msg)
	pnc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var reply events.FillReply
	if err := json.Unmarshal(resp.Data, &reply); err != nil || reply.OK || reply.Reason != events.ReasonUndeclared {
		t.Fatalf("early fill: %s (%v), want refused undeclared", resp.Data, err)
	}

	w2 := want(`{"modules":[` + prov + `,{"name":"mesh-build-go","build":"g:1","runs_as":"mbg","files":[{"path":"` + path + `","mode":"0600"}]}]}`)
	filled := waitFor("the refill", func(ev events.Event) bool {
		f, ok := ev.Payload.(*events.Filled)
		return ok && f.Path == path && ev.Seq > w2
	})
	if b, err := os.ReadFile(filepath.Join(root, path)); err != nil || string(b) != secret {
		t.Fatalf("the credential on ace: %q, %v", b, err)
	}

	// A sealed secret, put by the operator, reaches ace through its
	// provisioner's watch, every step within the users' permissions.
	sealedFile := filepath.Join(base, "sealed")
	if err := os.WriteFile(sealedFile, []byte("sealed "+secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCLI(ctx, append([]string{"secret", "put", "ace", "mesh-build-go", path, "-f", sealedFile, "--by", "alice"}, as("operator")...)...); code != exitOK {
		t.Fatalf("secret put as the operator: %d %s %s", code, out, errs)
	}
	waitFor("the sealed fill", func(ev events.Event) bool {
		f, ok := ev.Payload.(*events.Filled)
		return ok && f.Path == path && ev.Seq > filled.Seq
	})
	if b, err := os.ReadFile(filepath.Join(root, path)); err != nil || string(b) != "sealed "+secret {
		t.Fatalf("the sealed credential on ace: %q, %v", b, err)
	}
	if code, out, errs := runCLI(ctx, append([]string{"secret", "ls", "ace"}, as("operator")...)...); code != exitOK || !strings.Contains(out, "current") {
		t.Errorf("secret ls as the operator: %d %s %s", code, out, errs)
	}

	code, out, errs := runCLI(ctx, append([]string{"audit", "ace", "--until", strconv.FormatUint(filled.Seq, 10)}, as("operator")...)...)
	if code != exitOK || strings.Count(out, " knock ") != 1 || !strings.Contains(out, " refusal ") {
		t.Errorf("audit as the operator: %d %s\n%s\nwant one knock after the refusal", code, errs, out)
	}

	// Without a client certificate, or with no creds, nobody gets in.
	for name, c := range map[string]store.ConnectConfig{
		"no client certificate": {URLs: []string{url}, Creds: d.CredsPath("controller"), TLSCA: tf.CA},
		"no creds":              {URLs: []string{url}, TLSCA: tf.CA, TLSCert: tf.ClientCert, TLSKey: tf.ClientKey},
	} {
		c.Logger = quiet
		if nc, err := store.Connect(c); err == nil {
			nc.Close()
			t.Errorf("%s: connected", name)
		}
	}

	// Revoking the controller is pushed to the running server.
	rargs := append([]string{"auth", "revoke", "controller", "--dir", dir}, as(auth.SystemUser)...)
	if code, out, errs := runCLI(ctx, rargs...); code != exitOK || !strings.Contains(out, "jwt updated") {
		t.Fatalf("auth revoke: %d %s %s", code, out, errs)
	}
	if nc, err := connect("controller"); err == nil {
		nc.Close()
		t.Error("the revoked controller connected")
	}
}
