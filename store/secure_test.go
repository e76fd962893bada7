package store_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/store"
)

// writeCreds writes a creds file of a user named name whose JWT allows
// subscribing to subs.
func writeCreds(t *testing.T, name string, subs ...string) string {
	t.Helper()
	acc, _ := nkeys.CreateAccount()
	u, _ := nkeys.CreateUser()
	pub, _ := u.PublicKey()
	seed, _ := u.Seed()
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.Sub.Allow.Add(subs...)
	tok, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(p, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A user whose JWT allows only its own inbox connects with that inbox
// prefix; any other user keeps NATS's default; an explicit prefix wins.
func TestCredsInboxPrefix(t *testing.T) {
	t.Parallel()
	own := writeCreds(t, "node-ace", "_INBOX_node-ace.>", "mesh.ace.fill")
	other := writeCreds(t, "someone", "_INBOX.>")
	open := writeCreds(t, "admin")
	for _, c := range []struct {
		creds, inbox, want string
	}{
		{own, "", "_INBOX_node-ace"},
		{other, "", "_INBOX"},
		{open, "", "_INBOX"},
		{own, "_INBOX_x", "_INBOX_x"},
	} {
		o := applyOptions(t, store.ConnectConfig{Creds: c.creds, InboxPrefix: c.inbox})
		got := o.InboxPrefix
		if got == "" {
			got = "_INBOX"
		}
		if got != c.want {
			t.Errorf("%s (explicit %q): inbox prefix %q, want %q", filepath.Base(c.creds), c.inbox, got, c.want)
		}
	}
	if _, err := (store.ConnectConfig{Creds: filepath.Join(t.TempDir(), "missing.creds")}).Options(); err == nil {
		t.Error("a missing creds file was accepted")
	}
}
