package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
)

// The console on an operator-mode server, both ways it runs: inside serve
// (--http, connecting as the directory's operator-read user) and as its
// own command with the operator-read creds. Each shows the fleet, follows
// it live, serves the node's page, and is refused nothing by the server;
// anything but GET is refused by the console.
func TestConsoleWithCredentials(t *testing.T) {
	t.Parallel()
	ctx, refused := context.WithCancel(testCtx(t))
	defer refused()
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	var stops []func()
	t.Cleanup(func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	})
	// background runs a command until the test ends; a permissions
	// violation in its log ends the test at once.
	background := func(name string, args ...string) *lines {
		out := &lines{ch: make(chan string, 8)}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		errb := &watchBuffer{onViolation: refused}
		go func() {
			defer close(done)
			if code := run(cctx, append(args, "--log-level", "warn"), nil, out, errb); code != exitOK {
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
		return out
	}
	line := func(out *lines, re string) string {
		t.Helper()
		for {
			select {
			case l := <-out.ch:
				if m := regexp.MustCompile(re).FindStringSubmatch(l); m != nil {
					return m[1]
				}
			case <-ctx.Done():
				t.Fatalf("no line matching %s", re)
			}
		}
	}

	serve := background("serve", "serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0",
		"--http", "127.0.0.1:0")
	url := line(serve, `serving NATS at (\S+);`)
	served := line(serve, `console at (http://\S+)/ `)
	alone := line(background("console", "console", "--server", url, "--listen", "127.0.0.1:0",
		"--creds", filepath.Join(dir, "creds", "operator-read.creds")), `console at (http://\S+)/ `)

	// Each console's live stream, opened before the want. A console
	// says where it listens before it has connected to NATS, and answers
	// 503 until it has: the stream is the first 200.
	streams := map[string]*bufio.Scanner{}
	for name, u := range map[string]string{"serve --http": served, "console": alone} {
		resp := waitfor.Value(t, time.Minute, name+"'s live stream answering 200", func() (*http.Response, bool) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/events", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				return nil, false
			}
			return resp, true
		})
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		streams[name] = sc
	}
	code, out, errs := runCLI(ctx, "want", "ace", "--new", "-f", writeWantFile(t, `{"modules":[{"name":"provisioner","build":"p:1","runs_as":"prov","provisioner":true}]}`),
		"--server", url, "--creds", filepath.Join(dir, "creds", "controller.creds"))
	if code != exitOK {
		t.Fatalf("want: %d %s %s", code, out, errs)
	}
	for name, sc := range streams {
		for {
			if !sc.Scan() {
				t.Fatalf("%s: the live stream ended before ace appeared: %v", name, sc.Err())
			}
			// ace's plan is emitted and unsettled: no agent runs.
			if strings.Contains(sc.Text(), `id="need-ace"`) {
				break
			}
		}
	}
	for name, u := range map[string]string{"serve --http": served, "console": alone} {
		resp, err := http.Get(u + "/node/ace")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `class="ev ev-want`) || !strings.Contains(string(body), "the reconciler (live)") {
			t.Errorf("%s: GET /node/ace: %d\n%s", name, resp.StatusCode, body)
		}
		resp, err = http.Post(u+"/node/ace", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: POST: %d, want 405", name, resp.StatusCode)
		}
	}
}

// serve --http on a port already taken ends serve at start, with an error
// naming the flag, as a busy NATS port does, instead of running on
// without its console.
func TestServeHTTPPortBusy(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	done := make(chan struct{})
	var code int
	var out, errs string
	go func() {
		defer close(done)
		code, out, errs = runCLI(ctx, "serve", "--data", filepath.Join(t.TempDir(), "data"), "--listen", "127.0.0.1:0",
			"--http", busy.Addr().String())
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("serve --http on a busy port kept running")
	}
	if code == exitOK || !strings.Contains(errs, "--http") || !strings.Contains(errs, "address already in use") {
		t.Errorf("serve --http %s (busy): exit %d, stderr %q", busy.Addr(), code, errs)
	}
	if strings.Contains(out, "serving NATS") {
		t.Errorf("serve started NATS before failing on --http: %q", out)
	}
}

// serve --data naming a regular file is refused as such, before the
// signing key (kept in the data directory) is looked for.
func TestServeDataNotADirectory(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCLI(testCtx(t), "serve", "--data", f, "--listen", "127.0.0.1:0")
	if code != exitUsage || !strings.Contains(errs, "--data "+f+": not a directory") || strings.Contains(errs, "signing-key") {
		t.Errorf("serve --data FILE: exit %d, stderr %q", code, errs)
	}
}

// serve --http --auth DIR with no usable operator-read user for its
// console (a directory made before the role existed, or whose user was
// revoked) refuses to start, naming the command that fixes it, rather
// than running on without the console it was asked for.
func TestServeHTTPWithoutConsoleUser(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		unfit func(ctx context.Context, t *testing.T, dir string)
		says  string
	}{
		{"made before operator-read", func(_ context.Context, t *testing.T, dir string) {
			// As a directory made before the role: no such user in
			// auth.json, no creds file.
			if err := os.Remove(filepath.Join(dir, "creds", "operator-read.creds")); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "auth.json")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			delete(m["users"].(map[string]any), "operator-read")
			if b, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "has no operator-read user for the console"},
		{"revoked", func(ctx context.Context, t *testing.T, dir string) {
			if code, _, errs := runCLI(ctx, "auth", "revoke", "operator-read", "--dir", dir, "--no-push"); code != exitOK {
				t.Fatalf("auth revoke: %d %s", code, errs)
			}
		}, "operator-read of " + "DIR is revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			base := t.TempDir()
			dir := filepath.Join(base, "auth")
			if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
				t.Fatalf("auth init: %d %s", code, errs)
			}
			tc.unfit(ctx, t, dir)
			code, out, errs := runCLI(ctx, "serve", "--auth", dir, "--data", filepath.Join(base, "data"),
				"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0")
			says := strings.ReplaceAll(tc.says, "DIR", dir)
			fix := "meshfold auth add-user operator-read --dir " + dir
			if code != exitUsage || !strings.Contains(errs, says) || !strings.Contains(errs, fix) {
				t.Errorf("serve --http --auth (%s): exit %d, want %d and an error saying %q and %q:\n%s", tc.name, code, exitUsage, says, fix, errs)
			}
			if out != "" {
				t.Errorf("serve printed before refusing: %q", out)
			}
			// The fix it names works: serve then starts with its console.
			if code, _, errs := runCLI(ctx, "auth", "add-user", "operator-read", "--dir", dir); code != exitOK {
				t.Fatalf("%s: %d %s", fix, code, errs)
			}
			sctx, stop := context.WithCancel(ctx)
			served := newNoteBuffer()
			done := make(chan int, 1)
			go func() {
				done <- run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"),
					"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "warn"}, nil, served, served)
			}()
			served.waitText(ctx, t, "serve after "+fix, "meshfold: console at http://")
			stop()
			if code := <-done; code != exitOK {
				t.Errorf("serve after %s: exit %d:\n%s", fix, code, served.String())
			}
		})
	}
}

// console takes serve's name for its address, --http, as --listen (a
// fresh user's "unknown flag: --http").
func TestConsoleHTTPIsListen(t *testing.T) {
	t.Parallel()
	root := newRoot(nil, io.Discard, io.Discard)
	cmd, _, err := root.Find([]string{"console"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags([]string{"--http", "127.0.0.1:7171"}); err != nil {
		t.Fatalf("console --http: %v", err)
	}
	if got := cmd.Flags().Lookup("listen").Value.String(); got != "127.0.0.1:7171" {
		t.Errorf("console --http 127.0.0.1:7171 listens on %s", got)
	}
}
