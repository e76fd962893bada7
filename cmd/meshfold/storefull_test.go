package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store/storetest"
)

// mountSmallFS is storetest.SmallFS under /tmp/storefull-*.
func mountSmallFS(t *testing.T, size string) string {
	t.Helper()
	dir, _ := storetest.SmallFS(t, "storefull-", size)
	return dir
}

// fillFS writes a file beside the data directory until the filesystem
// has no room (another process filling it, as on a shared disk).
func fillFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			return // no space left
		}
	}
}

// storeFullRig is serve on a 32 MB tmpfs, stopped (and waited for) before
// the filesystem is unmounted.
type storeFullRig struct {
	dir, url string
	srv      *role
}

func startStoreFullRig(t *testing.T, ctx context.Context) *storeFullRig {
	t.Helper()
	dir := mountSmallFS(t, "32m")
	srv, url, _ := startServe(t, ctx, filepath.Join(dir, "data"))
	t.Cleanup(func() {
		srv.cancel()
		<-srv.done
	})
	return &storeFullRig{dir: dir, url: url, srv: srv}
}

// wantUntilUnanswered publishes wants of new nodes, after the filesystem
// was filled, until one fails (a file store's block takes a few writes
// before one fails), and returns the failure's stderr.
func (r *storeFullRig) wantUntilUnanswered(t *testing.T, ctx context.Context) string {
	t.Helper()
	want := writeWantFile(t, goodWant)
	for i := range 60 {
		var out, errb strings.Builder
		code := run(ctx, []string{"want", fmt.Sprintf("w%d", i), "--new", "-f", want, "-s", r.url, "--timeout", "4s"}, nil, &out, &errb)
		if code != exitOK {
			return errb.String()
		}
	}
	t.Fatal("60 wants stored on a full filesystem")
	return ""
}

// A want sent while another process has filled serve's filesystem is
// never answered by the server (a file store that failed a write keeps
// its error and answers no later one): it was told "the stream did not
// answer within 30s (a server too busy …)", not the documented "the
// server cannot store" (a fresh user's finding G1). Now the CLI asks
// serve, which watches its store, and says the cause, since when, and
// what to do.
func TestWantOnFullFilesystemNamesTheCause(t *testing.T) {
	ctx := testCtx(t)
	r := startStoreFullRig(t, ctx)
	want := writeWantFile(t, goodWant)
	var out, errb strings.Builder
	if code := run(ctx, []string{"want", "first", "--new", "-f", want, "-s", r.url}, nil, &out, &errb); code != exitOK {
		t.Fatalf("want before the fill: exit %d: %s", code, errb.String())
	}
	fillFS(t, r.dir)
	errs := r.wantUntilUnanswered(t, ctx)
	t.Logf("stderr: %s", errs)
	for _, s := range []string{"the server cannot store: its data directory is full", "serve's store has taken no write since",
		"the filesystem has no room", "free space under the server's data directory", `"Disk full"`} {
		if !strings.Contains(errs, s) {
			t.Errorf("the refused want's error does not say %q:\n%s", s, errs)
		}
	}
	if strings.Contains(errs, "too busy") {
		t.Errorf("the refused want's error still guesses a busy server:\n%s", errs)
	}
}

// fleet while serve's store takes no write opens with it: since when,
// why, and what to do (a fresh user's finding G1: the stream was
// unwritable for more than 10 minutes while fleet said all was well).
func TestFleetSaysTheStoreTakesNoWrite(t *testing.T) {
	ctx := testCtx(t)
	r := startStoreFullRig(t, ctx)
	want := writeWantFile(t, goodWant)
	fleet := func() (string, string) {
		t.Helper()
		var out, errb strings.Builder
		if code := run(ctx, []string{"fleet", "-s", r.url}, nil, &out, &errb); code != exitOK {
			t.Fatalf("fleet: exit %d: %s", code, errb.String())
		}
		return out.String(), errb.String()
	}
	var out, errb strings.Builder
	if code := run(ctx, []string{"want", "first", "--new", "-f", want, "-s", r.url}, nil, &out, &errb); code != exitOK {
		t.Fatalf("want before the fill: exit %d: %s", code, errb.String())
	}
	if o, _ := fleet(); strings.Contains(o, "NOTHING IS STORED") {
		t.Fatalf("fleet says the store is full before it is:\n%s", o)
	}
	cons := startRole(ctx, "console", "--server", r.url, "--listen", "127.0.0.1:0")
	t.Cleanup(func() {
		cons.cancel()
		<-cons.done
	})
	m := regexp.MustCompile(`console at (http://\S+)/ `).FindStringSubmatch(cons.line(t, ctx))
	if m == nil {
		t.Fatal("the console's first line names no URL")
	}
	page := func() string {
		resp, err := http.Get(m[1] + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waitfor.Until(t, time.Minute, "the console's fleet page", func() bool { return strings.Contains(page(), `id="summary"`) })
	if p := page(); strings.Contains(p, "Nothing is stored") {
		t.Fatalf("the console says the store is full before it is:\n%s", p)
	}
	fillFS(t, r.dir)
	r.wantUntilUnanswered(t, ctx)
	o, _ := fleet()
	first, _, _ := strings.Cut(o, "\n")
	t.Logf("first line: %s", first)
	for _, s := range []string{"-- NOTHING IS STORED: serve's store has taken no write since ", "the filesystem has no room",
		"refuse", "free space under serve's --data", `"Disk full"`} {
		if !strings.Contains(first, s) {
			t.Errorf("fleet's first line does not say %q:\n%s", s, o)
		}
	}
	// The console's fleet page opens with it too (it asks every 2 s).
	p := waitfor.Value(t, time.Minute, "the console's fleet page saying the store takes no write", func() (string, bool) {
		p := page()
		return p, strings.Contains(p, "Nothing is stored: serve&#39;s store has taken no write since ")
	})
	for _, s := range []string{"the filesystem has no room", "free space under serve&#39;s --data"} {
		if !strings.Contains(p, s) {
			t.Errorf("the console's fleet page does not say %q", s)
		}
	}
	// -o json keeps stdout to the rows: the line is a note on stderr.
	var jout, jerr strings.Builder
	if code := run(ctx, []string{"fleet", "-s", r.url, "-o", "json"}, nil, &jout, &jerr); code != exitOK {
		t.Fatalf("fleet -o json: exit %d: %s", code, jerr.String())
	}
	if !strings.Contains(jerr.String(), "note: serve's store has taken no write since ") || strings.Contains(jout.String(), "taken no write") {
		t.Errorf("fleet -o json: the store's line not (only) on stderr:\nstdout %s\nstderr %s", jout.String(), jerr.String())
	}
}
