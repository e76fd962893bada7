package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
)

// A named operator's creds (auth add-operator alice): pause publishes on
// alice's named subject with by alice, --by left out; --by bob is a usage
// error before anything is sent; the shared operator's creds still need
// --by (a fresh user's finding M5).
func TestNamedOperatorVerbs(t *testing.T) {
	t.Parallel()
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddOperator("alice"); err != nil {
		t.Fatal(err)
	}
	sa, err := d.ServerAuth()
	if err != nil {
		t.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Auth: sa})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	ctx := testCtx(t)
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{e.ClientURL()}, Creds: d.CredsPath("reconciler")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cli := func(creds string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(ctx, append(args, "-s", e.ClientURL(), "--creds", d.CredsPath(creds), "--log-level", "warn"), nil, &out, &errb)
		return code, out.String() + errb.String()
	}

	if code, out := cli("operator-alice", "pause", "ace", "--new", "--by", "bob"); code != exitUsage || !strings.Contains(out, "these creds are operator alice's") {
		t.Fatalf("pause --by bob with alice's creds: exit %d\n%s", code, out)
	}
	if _, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindPause); err == nil {
		t.Fatal("the refused pause was published")
	}
	if code, out := cli("operator-alice", "pause", "ace", "--new", "--reason", "disk swap"); code != 0 {
		t.Fatalf("pause with alice's creds: exit %d\n%s", code, out)
	}
	m, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindPause)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := m.Event.Payload.(*events.Pause); !ok || p.By != "alice" || m.Subject != cfg.Subjects().Named("ace", events.KindPause, "alice") {
		t.Errorf("alice's pause: %s %+v %v", m.Subject, m.Event.Payload, m.Event.Err)
	}
	if code, out := cli("operator", "resume", "ace"); code != exitUsage || !strings.Contains(out, `required flag(s) "by"`) {
		t.Errorf("resume with the shared operator's creds, no --by: exit %d\n%s", code, out)
	}
	if code, out := cli("operator", "resume", "ace", "--by", "carol"); code != 0 {
		t.Errorf("resume by carol with the shared creds: exit %d\n%s", code, out)
	}
}
