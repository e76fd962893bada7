package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
)

// A fresh user's finding F7: the console of serve --auth --http went on
// answering from its frozen picture, "live" and "as of <now>", once its
// user operator-read was revoked. Now its pages answer 503 saying the
// console lost its credentials and what issues them again, and once the
// user is issued again they are live again, serve never restarted.
func TestServeConsoleUserRevokedAndIssuedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	sctx, stop := context.WithCancel(ctx)
	out, done := newNoteBuffer(), make(chan int, 1)
	go func() {
		done <- run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0",
			"--http", "127.0.0.1:0", "--log-level", "info"}, nil, out, out)
	}()
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("serve said:\n%s", out.String())
		}
	})
	out.waitText(ctx, t, "serve", "meshfold: console at http://")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(out.String())[1]
	page := regexp.MustCompile(`console at (http://\S+/)`).FindStringSubmatch(out.String())[1]
	get := func() (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, page, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var body string
	waitfor.Until(t, time.Minute, "the console's fleet page", func() bool {
		code, b := get()
		body = b
		return code == http.StatusOK && strings.Contains(b, ">live<")
	})

	if code, o, errs := runCLI(ctx, "auth", "revoke", "operator-read", "--dir", dir, "--server", url); code != exitOK {
		t.Fatalf("auth revoke operator-read: %d %s %s", code, o, errs)
	}
	waitfor.Until(t, time.Minute, "the console saying its user was revoked", func() bool {
		code, b := get()
		body = b
		return code == http.StatusServiceUnavailable && strings.Contains(b, "its user operator-read was revoked") &&
			strings.Contains(b, "meshfold auth add-user operator-read --dir "+dir)
	})
	if strings.Contains(body, "live") {
		t.Errorf("the page of a console that lost its user says live:\n%s", body)
	}
	if n := strings.Count(out.String(), "console stopped: its user was revoked"); n != 1 {
		t.Errorf("%d ERRORs naming the console's revocation, want 1", n)
	}

	if code, o, errs := runCLI(ctx, "auth", "add-user", "operator-read", "--dir", dir); code != exitOK {
		t.Fatalf("auth add-user operator-read: %d %s %s", code, o, errs)
	}
	waitfor.Until(t, time.Minute, "the console live again", func() bool {
		code, b := get()
		body = b
		return code == http.StatusOK && strings.Contains(b, ">live<")
	})
}
