package auth_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// An auth directory: its files and modes, reopened as written, and the
// refusals of Init and AddNode.
func TestDir(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(parent, "auth")
	d, err := auth.Init(path, auth.Config{Names: auth.Names{Prefix: "fleet"}})
	if err != nil {
		t.Fatal(err)
	}
	// Only the auth directory is private: the parents Init made have the
	// mode mkdir -p gives (0755 under the umask), as ref has.
	ref := filepath.Join(t.TempDir(), "ref")
	if err := os.Mkdir(ref, 0o755); err != nil {
		t.Fatal(err)
	}
	rfi, _ := os.Stat(ref)
	for _, p := range []string{parent, filepath.Dir(parent)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != rfi.Mode().Perm() {
			t.Errorf("parent %s: %v, want mode %v", p, err, rfi.Mode().Perm())
		}
	}
	if _, err := d.AddNode("ace"); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{
		path: 0o700, filepath.Join(path, "auth.json"): 0o600, filepath.Join(path, "operator.nk"): 0o600,
		filepath.Join(path, "accounts", "SYS.nk"): 0o600, filepath.Join(path, "accounts", "MESH.nk"): 0o600,
		d.CredsPath("node-ace"): 0o600, d.CredsPath("sys"): 0o600, filepath.Join(path, "resolver.conf"): 0o644,
	} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, want mode %v", p, err, mode)
		}
	}
	o, err := auth.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if o.Names() != (auth.Names{Stream: store.DefaultStreamName, Prefix: "fleet"}) || o.Account() != d.Account() || len(o.Users()) != 7 {
		t.Errorf("reopened: names %+v, account %s, %d users", o.Names(), o.Account(), len(o.Users()))
	}
	for _, u := range o.Users() {
		if inbox, err := store.CredsInboxPrefix(o.CredsPath(u.Name)); u.Role != auth.RoleSystem && (err != nil || inbox != "_INBOX_"+u.Name) {
			t.Errorf("%s: inbox prefix %q, %v", u.Name, inbox, err)
		}
	}

	if _, err := auth.Init(path, auth.Config{}); !errors.Is(err, auth.ErrExists) {
		t.Errorf("Init over an auth directory: %v, want ErrExists", err)
	}
	if _, err := auth.Open(t.TempDir()); !errors.Is(err, auth.ErrNotAuthDir) {
		t.Errorf("Open of an empty directory: %v, want ErrNotAuthDir", err)
	}
	if _, err := o.AddNode("ace"); !errors.Is(err, auth.ErrUserExists) {
		t.Errorf("AddNode twice: %v, want ErrUserExists", err)
	}
	if _, err := o.AddNode("../x"); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("AddNode with a bad name: %v, want events.ErrInvalid", err)
	}
	// AddUser: the one-user roles only, again only once revoked.
	if _, err := o.AddUser(auth.RoleOperatorRead); !errors.Is(err, auth.ErrUserExists) {
		t.Errorf("AddUser of a valid operator-read: %v, want ErrUserExists", err)
	}
	for _, r := range []auth.Role{auth.RoleNode, auth.RoleSystem, "admin"} {
		if _, err := o.AddUser(r); !errors.Is(err, auth.ErrUnknownRole) {
			t.Errorf("AddUser(%s): %v, want ErrUnknownRole", r, err)
		}
	}
	if err := o.Revoke("operator-read"); err != nil {
		t.Fatal(err)
	}
	old, _ := o.User("operator-read")
	if u, err := o.AddUser(auth.RoleOperatorRead); err != nil || u.Revoked != nil || u.PublicKey == old.PublicKey {
		t.Errorf("AddUser after revoking: %+v, %v; want a new valid key", u, err)
	}
	if err := o.Revoke("nobody"); !errors.Is(err, auth.ErrUnknownUser) {
		t.Errorf("Revoke of an unknown user: %v, want ErrUnknownUser", err)
	}
	if err := o.Revoke(auth.SystemUser); !errors.Is(err, auth.ErrSystemUser) {
		t.Errorf("Revoke of the system user: %v, want ErrSystemUser", err)
	}
	if _, err := auth.Permissions("admin", "", auth.Names{}); !errors.Is(err, auth.ErrUnknownRole) {
		t.Errorf("Permissions of an unknown role: %v, want ErrUnknownRole", err)
	}
	// The prefix is in every permission.
	p, err := auth.Permissions(auth.RoleNode, "ace", o.Names())
	if err != nil {
		t.Fatal(err)
	}
	if !p.Pub.Allow.Contains("fleet.ace.have") || !p.Sub.Allow.Contains("fleet.ace.fill") {
		t.Errorf("node-ace under prefix fleet: %+v", p)
	}
}
