package main

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
)

// meshfold version prints the link-time version and commit, and the Go
// version that built it.
func TestVersion(t *testing.T) {
	// Not parallel: it sets the package-level version and commit.
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v1.2.3", "0123abcd"
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"version"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := "meshfold v1.2.3\ncommit   0123abcd\ngo       " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
	// --version says the same, as meshfold-shim --version does.
	out.Reset()
	if code := run(context.Background(), []string{"--version"}, nil, &out, &errb); code != 0 || out.String() != want {
		t.Fatalf("--version: exit %d, got\n%s\nwant\n%s%s", code, out.String(), want, errb.String())
	}
	version, commit = "", ""
	out.Reset()
	if code := run(context.Background(), []string{"version"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.HasPrefix(out.String(), "meshfold devel\ncommit   ") {
		t.Fatalf("without link-time values: %q", out.String())
	}
}
