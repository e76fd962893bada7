package auth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store/auth"
)

// AddNodes issues every node's two users with one write of auth.json,
// and refuses the whole call, issuing nothing, when a name is invalid,
// repeated, or a node whose users both exist (a fresh user's finding M1).
func TestAddNodes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	d, err := auth.Init(path, auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	users, err := d.AddNodes("n1", "n2", "n3")
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 6 {
		t.Fatalf("AddNodes of 3 nodes issued %d users, want 6: %v", len(users), users)
	}
	re, err := auth.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node-n1", "provisioner-n1", "node-n3", "provisioner-n3"} {
		if _, err := re.User(n); err != nil {
			t.Errorf("reopened: %s: %v", n, err)
		}
		if _, err := os.Stat(re.CredsPath(n)); err != nil {
			t.Errorf("creds of %s: %v", n, err)
		}
	}
	for _, tc := range []struct {
		names []string
		want  error
		says  string
	}{
		{[]string{"n4", "n1", "n2"}, auth.ErrUserExists, "nodes n1, n2"},
		{[]string{"n4", "n1"}, auth.ErrUserExists, "node n1"},
		{[]string{"n4", "n5", "n4"}, events.ErrInvalid, "given twice"},
		{[]string{"n4", "N5!"}, events.ErrInvalid, "N5!"},
	} {
		_, err := re.AddNodes(tc.names...)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("AddNodes(%v): %v, want %v saying %q", tc.names, err, tc.want, tc.says)
		}
		if _, err := re.User("node-n4"); err == nil {
			t.Errorf("AddNodes(%v) refused, but issued node-n4", tc.names)
		}
	}
	if again, err := auth.Open(path); err != nil {
		t.Fatal(err)
	} else if _, err := again.User("node-n4"); err == nil {
		t.Error("a refused AddNodes wrote node-n4 into auth.json")
	}
}

// resolver.conf's JWT directory, once an operator set it, is kept by
// every rewrite (add-node, revoke): it was put back to "jwt" (a fresh
// user's finding m5).
func TestResolverDirKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	d, err := auth.Init(path, auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(path, "resolver.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if dir, ok := auth.ResolverDirOf(string(b)); !ok || dir != auth.DefaultResolverDir {
		t.Fatalf("a new resolver.conf names %q (%v), want %q", dir, ok, auth.DefaultResolverDir)
	}
	const mine = "/srv/nats/jwt dir"
	edited := strings.Replace(string(b), `dir: "jwt"`, `dir: "`+mine+`"  # the operator's`, 1)
	if edited == string(b) {
		t.Fatalf("no dir line to edit in:\n%s", b)
	}
	if err := os.WriteFile(conf, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddNode("ace"); err != nil {
		t.Fatal(err)
	}
	check := func(after string) {
		t.Helper()
		b, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		if dir, ok := auth.ResolverDirOf(string(b)); !ok || dir != mine {
			t.Errorf("after %s, resolver.conf names %q, want the operator's %q:\n%s", after, dir, mine, b)
		}
	}
	check("add-node")
	if err := d.Revoke("node-ace"); err != nil {
		t.Fatal(err)
	}
	check("revoke")
}

// ResolverDirOf reads the resolver block's dir in nats-server's
// configuration forms.
func TestResolverDirOf(t *testing.T) {
	for conf, want := range map[string]string{
		"resolver: {\n  type: full\n  dir: \"/a/b\"\n}\n":                "/a/b",
		"resolver: {\n  dir = '/a b'\n}\n":                               "/a b",
		"resolver: {\n\tdir: /var/lib/nats/jwt # comment\n}\n":           "/var/lib/nats/jwt",
		"resolver: { type: full, dir: \"jwt2\", allow_delete: false }\n": "jwt2",
		"operator: \"x\"\nresolver: {\n  dir: \"a\\\"b\"\n}\n":           `a"b`,
	} {
		if got, ok := auth.ResolverDirOf(conf); !ok || got != want {
			t.Errorf("ResolverDirOf(%q) = %q, %v; want %q", conf, got, ok, want)
		}
	}
	for _, conf := range []string{"resolver: MEMORY\n", "resolver_preload: {\n dir: \"x\"\n}\n", ""} {
		if got, ok := auth.ResolverDirOf(conf); ok {
			t.Errorf("ResolverDirOf(%q) = %q, want none", conf, got)
		}
	}
}
