package store_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
	"github.com/nats-io/nats.go"
)

// applyOptions returns the nats.Options the options produce.
func applyOptions(t *testing.T, cfg store.ConnectConfig) nats.Options {
	t.Helper()
	opts, err := cfg.Options()
	if err != nil {
		t.Fatalf("Options: %v", err)
	}
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			t.Fatalf("applying an option: %v", err)
		}
	}
	return o
}

func writeContext(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, "nats", "context", name+".json")
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConnectContextFile(t *testing.T) {
	// Not parallel: t.Setenv.
	cfgHome := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfgHome)
	path := writeContext(t, cfgHome, "hub", `{
  "description": "the hub",
  "url": "nats://a.example:4222, nats://b.example:4222",
  "user": "ops",
  "password": "s3cret",
  "token": "",
  "creds": "",
  "nkey": "",
  "cert": "",
  "key": "",
  "ca": "",
  "nsc": "",
  "jetstream_domain": "",
  "inbox_prefix": "_INBOX_ops",
  "color_scheme": ""
}`)

	o := applyOptions(t, store.ConnectConfig{Context: "hub"})
	if want := []string{"nats://a.example:4222", "nats://b.example:4222"}; !reflect.DeepEqual(o.Servers, want) {
		t.Errorf("servers = %v, want %v", o.Servers, want)
	}
	if o.User != "ops" || o.Password != "s3cret" {
		t.Errorf("user/password = %q/%q", o.User, o.Password)
	}
	if o.InboxPrefix != "_INBOX_ops" {
		t.Errorf("inbox prefix = %q", o.InboxPrefix)
	}
	if o.MaxReconnect != -1 || o.ReconnectJitter == 0 || o.Name != "meshfold" || o.Timeout != 5*time.Second {
		t.Errorf("reconnect %d, jitter %v, name %q, connect timeout %v: want unlimited, jittered, meshfold, 5s",
			o.MaxReconnect, o.ReconnectJitter, o.Name, o.Timeout)
	}
	if o.DisconnectedErrCB == nil || o.ReconnectedCB == nil || o.ClosedCB == nil || o.AsyncErrorCB == nil {
		t.Error("connection event handlers not set")
	}

	// A path works as well as a name; explicit URLs override the context's.
	o = applyOptions(t, store.ConnectConfig{Context: path, URLs: []string{"nats://c.example:4222"}, Name: "rec"})
	if want := []string{"nats://c.example:4222"}; !reflect.DeepEqual(o.Servers, want) || o.User != "ops" || o.Name != "rec" {
		t.Errorf("with a path and explicit URL: servers %v user %q name %q", o.Servers, o.User, o.Name)
	}

	// Unknown context, malformed file.
	if _, err := (store.ConnectConfig{Context: "nope"}).Options(); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown context: err = %v", err)
	}
	writeContext(t, cfgHome, "broken", `{"url": `)
	if _, err := (store.ConnectConfig{Context: "broken"}).Options(); err == nil {
		t.Error("malformed context accepted")
	}
	// An explicit certificate without its key is refused.
	if _, err := (store.ConnectConfig{TLSCert: "/tmp/x.pem"}).Options(); err == nil {
		t.Error("certificate without key accepted")
	}
}

func TestConnectTokenAndDefault(t *testing.T) {
	// Not parallel: t.Setenv.
	cfgHome := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfgHome)
	writeContext(t, cfgHome, "tok", `{"token": "t0k"}`)
	o := applyOptions(t, store.ConnectConfig{Context: "tok"})
	if o.Token != "t0k" || !reflect.DeepEqual(o.Servers, []string{nats.DefaultURL}) {
		t.Errorf("token %q servers %v", o.Token, o.Servers)
	}
}

func TestConnectToServerThroughContext(t *testing.T) {
	// Not parallel: t.Setenv.
	e, _, _ := storetest.Start(t)
	cfgHome := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfgHome)
	writeContext(t, cfgHome, "local", `{"url": "`+e.ClientURL()+`"}`)
	nc, err := store.Connect(store.ConnectConfig{Context: "local"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !nc.IsConnected() || nc.ConnectedUrl() != e.ClientURL() {
		t.Errorf("connected %v to %q, want %q", nc.IsConnected(), nc.ConnectedUrl(), e.ClientURL())
	}
}

// Every fault of the configuration itself (a file missing or malformed)
// is ErrBadConfig, so that a command can say it is the command line's
// (exit 2), not the deployment's; its text names the file.
func TestOptionsBadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a creds file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		cfg  store.ConnectConfig
		name string
	}{
		{store.ConnectConfig{Creds: missing}, missing},
		{store.ConnectConfig{Creds: garbage}, garbage},
		{store.ConnectConfig{NKeySeed: missing}, missing},
		{store.ConnectConfig{Context: filepath.Join(dir, "missing.json")}, "missing.json"},
		{store.ConnectConfig{Context: writeContext(t, dir, "c", `{"creds":"`+missing+`"}`)}, missing},
		{store.ConnectConfig{TLSCA: missing}, missing},
		{store.ConnectConfig{TLSCA: garbage}, garbage},
		{store.ConnectConfig{TLSCert: garbage, TLSKey: garbage}, ""},
		{store.ConnectConfig{TLSCert: garbage}, ""},
	} {
		_, err := c.cfg.Options()
		if !errors.Is(err, store.ErrBadConfig) || !strings.Contains(fmt.Sprint(err), c.name) {
			t.Errorf("%+v: %v, want store.ErrBadConfig naming %q", c.cfg, err, c.name)
		}
		if _, cerr := store.Connect(c.cfg); !errors.Is(cerr, store.ErrBadConfig) {
			t.Errorf("Connect %+v: %v, want store.ErrBadConfig", c.cfg, cerr)
		}
	}
}
