package main

import (
	"context"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store/storetest"
)

// Against serve with mutual TLS, a client with no certificate, one of
// another CA, or an expired one is told which of the three it is and
// which flag to check, not only "connection closed by remote after TLS
// handshake: broken pipe"; serve warns as it starts about a certificate
// its clients will refuse (expired, for other names) or soon will; and
// a running node agent whose server comes back with an expired
// certificate says so in its outage lines, not only "context deadline
// exceeded" (a fresh user's finding F4).
func TestTLSErrorsNamed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	base := t.TempDir()
	tf := storetest.TLS(t)
	now := time.Now()

	type proc struct {
		out  *noteBuffer
		stop func() int // cancels it and waits for its exit code
	}
	start := func(args ...string) *proc {
		cctx, cancel := context.WithCancel(ctx)
		p := &proc{out: newNoteBuffer()}
		done := make(chan int, 1)
		go func() { done <- run(cctx, args, nil, p.out, p.out) }()
		p.stop = sync.OnceValue(func() int { cancel(); return <-done })
		t.Cleanup(func() { p.stop() })
		return p
	}
	data := filepath.Join(base, "data")
	serveArgs := func(listen, cert, key string) []string {
		return []string{"serve", "--data", data, "--listen", listen, "--log-level", "warn",
			"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", tf.CA}
	}
	// The fixture's server certificate lasts an hour: serve would warn.
	goodCert, goodKey := tf.Issue(t, "server30d", now.Add(-time.Hour), now.Add(30*24*time.Hour), false, "127.0.0.1", "localhost")
	// Its port is reserved (storetest.FreeAddr): serve comes back on it
	// below, and no other bind may take it meanwhile.
	serve := start(serveArgs(storetest.FreeAddr(t), goodCert, goodKey)...)
	serve.out.waitText(ctx, t, "serve", "serving NATS at ")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(serve.out.String())[1]

	// Each client certificate problem, named with the flag to check.
	expCert, expKey := tf.Issue(t, "expired-client", now.Add(-48*time.Hour), now.Add(-24*time.Hour), false)
	otherCert, otherKey := tf.Issue(t, "other-client", now.Add(-time.Hour), now.Add(time.Hour), true)
	for _, c := range []struct {
		name string
		tls  []string
		want string
	}{
		{"no client certificate", nil, "it requires a client certificate (mutual TLS) and none was given: give one signed by the CA the server trusts (serve's --tls-client-ca) with --tls-cert FILE --tls-key FILE"},
		{"another CA's", []string{"--tls-cert", otherCert, "--tls-key", otherKey}, "the server rejected the client certificate " + otherCert + " (--tls-cert), which is valid until"},
		{"an expired one", []string{"--tls-cert", expCert, "--tls-key", expKey}, "the server rejected the client certificate " + expCert + " (--tls-cert): it expired at"},
	} {
		args := append([]string{"fleet", "--server", url, "--tls-ca", tf.CA}, c.tls...)
		code, _, errs := runCLI(ctx, args...)
		if code == exitOK || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q, want %q", c.name, code, errs, c.want)
		}
		if c.name == "another CA's" && !strings.Contains(errs, "is its issuer, CN=another CA, the CA the server trusts") {
			t.Errorf("%s: the issuer is not named: %q", c.name, errs)
		}
	}
	// A good client certificate connects.
	if code, _, errs := runCLI(ctx, "fleet", "--server", url, "--tls-ca", tf.CA, "--tls-cert", tf.ClientCert, "--tls-key", tf.ClientKey); code != exitOK {
		t.Fatalf("fleet with a good certificate: exit %d, %s", code, errs)
	}
	// (serve's log lines are written within 100 ms: long gone by now.)
	if s := serve.out.String(); strings.Contains(s, "--tls-cert:") {
		t.Errorf("serve warned about a good certificate:\n%s", s)
	}

	// A node agent, running, then serve back on its port with an expired
	// certificate: the agent's outage lines name the x509 reason.
	node := start("node", "ace", "--runtime", "record", "--root", filepath.Join(base, "root"), "--state-dir", filepath.Join(base, "state"),
		"--trust", filepath.Join(data, trustFileName), "--server", url, "--tls-ca", tf.CA, "--tls-cert", tf.ClientCert, "--tls-key", tf.ClientKey)
	node.out.waitText(ctx, t, "node", "node agent running")
	if code := serve.stop(); code != exitOK {
		t.Fatalf("serve stopped with exit %d:\n%s", code, serve.out.String())
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "tls://"))
	expServer, expServerKey := tf.Issue(t, "expired-server", now.Add(-48*time.Hour), now.Add(-24*time.Hour), false, "127.0.0.1", "localhost")
	serve2 := start(serveArgs("127.0.0.1:"+port, expServer, expServerKey)...)
	serve2.out.waitText(ctx, t, "serve", "--tls-cert: the certificate "+expServer+" (CN=expired-server) expired ")
	if s := serve2.out.String(); !strings.Contains(s, "every client will refuse it (x509: certificate has expired); renew it and restart with the new --tls-cert") {
		t.Errorf("serve with an expired certificate:\n%s", s)
	}
	node.out.waitText(ctx, t, "node", "x509: certificate has expired")
	if s := node.out.String(); !regexp.MustCompile(`NATS (still )?unreachable since .*cause=".*x509: certificate has expired`).MatchString(s) {
		t.Errorf("the agent's outage line does not name the handshake's error:\n%s", s)
	}

	// serve warns about a certificate that does not name the listen
	// address, and about one that expires within 14 days.
	for _, c := range []struct {
		name     string
		notAfter time.Time
		hosts    []string
		want     string
	}{
		{"other-name", now.Add(30 * 24 * time.Hour), []string{"hub.example"}, "does not cover 127.0.0.1, the address serve listens on: it names hub.example"},
		{"soon", now.Add(3*24*time.Hour + time.Hour), []string{"127.0.0.1"}, "expires in 3 days, at "},
	} {
		cert, key := tf.Issue(t, c.name, now.Add(-time.Hour), c.notAfter, false, c.hosts...)
		data = filepath.Join(base, "data-"+c.name)
		s := start(serveArgs("127.0.0.1:0", cert, key)...)
		s.out.waitText(ctx, t, "serve", c.want)
		s.stop()
	}
}
