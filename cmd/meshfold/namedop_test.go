package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/rollout"
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
	d, e, ctx, js := aliceMesh(t)
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
	// Before the stream stores named operators' events (auth
	// enable-named), alice's pause is refused, saying why.
	if code, out := cli("operator-alice", "pause", "ace", "--new"); code != exitError || !strings.Contains(out, "does not store named operators' events yet") {
		t.Fatalf("alice's pause before enable-named: exit %d\n%s", code, out)
	}
	if code, out := enableNamed(t, ctx, d, e.ClientURL()); code != 0 {
		t.Fatalf("auth enable-named: exit %d\n%s", code, out)
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
	// Every operator verb, the gate too (fresh13 G1: alice's gate and
	// ungate were refused as "not the operator whose credentials
	// published the event (alice)").
	for _, verb := range []string{"gate", "ungate"} {
		if code, out := cli("operator-alice", verb, "ace", "db", "--new", "--reason", "a DBA's yes first"); code != 0 {
			t.Fatalf("%s with alice's creds: exit %d\n%s", verb, code, out)
		}
		m, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindGate)
		if err != nil {
			t.Fatal(err)
		}
		if g, ok := m.Event.Payload.(*events.Gate); !ok || g.By != "alice" || g.Lift != (verb == "ungate") || m.Subject != cfg.Subjects().Named("ace", events.KindGate, "alice") {
			t.Errorf("alice's %s: %s %+v %v", verb, m.Subject, m.Event.Payload, m.Event.Err)
		}
	}
	if code, out := cli("operator", "resume", "ace"); code != exitUsage || !strings.Contains(out, `required flag(s) "by"`) {
		t.Errorf("resume with the shared operator's creds, no --by: exit %d\n%s", code, out)
	}
	if code, out := cli("operator", "resume", "ace", "--by", "carol"); code != 0 {
		t.Errorf("resume by carol with the shared creds: exit %d\n%s", code, out)
	}
	// The audit tells alice's checked name from carol's self-declared
	// one (a fresh user's finding M3): in the line and in -o json.
	code, out := cli("operator", "audit", "ace")
	if code != 0 || !strings.Contains(out, "pause   by alice (checked): disk swap") || !strings.Contains(out, "resume  by carol\n") {
		t.Errorf("audit ace: exit %d, want alice's pause checked and carol's resume not\n%s", code, out)
	}
	code, out = cli("operator", "audit", "ace", "-o", "json")
	var entries []struct {
		Kind      events.Kind `json:"kind"`
		ByChecked bool        `json:"by_checked"`
	}
	// Alice's pause, gate and ungate on her subject; carol's resume on the
	// plain one.
	want := []struct {
		kind    events.Kind
		checked bool
	}{{events.KindPause, true}, {events.KindGate, true}, {events.KindGate, true}, {events.KindResume, false}}
	ok := code == 0 && json.Unmarshal([]byte(out), &entries) == nil && len(entries) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = entries[i].Kind == want[i].kind && entries[i].ByChecked == want[i].checked
	}
	if !ok {
		t.Errorf("audit ace -o json: exit %d, want by_checked on alice's pause and gates only: %+v\n%s", code, entries, out)
	}
}

// aliceMesh starts a secured embedded server whose auth directory has a
// named operator, alice, and returns the directory, the server, the
// test's context and a JetStream client of the reconciler user.
func aliceMesh(t *testing.T) (*auth.Dir, *embedded.Server, context.Context, jetstream.JetStream) {
	t.Helper()
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
	return d, e, testCtx(t), connectAs(t, d, e, "reconciler")
}

// connectAs is a JetStream client of user's creds in d, closed at the
// test's end.
func connectAs(t *testing.T, d *auth.Dir, e *embedded.Server, user string) jetstream.JetStream {
	t.Helper()
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{e.ClientURL()}, Creds: d.CredsPath(user)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// enableNamed runs auth enable-named against the server at url, with a
// state service of this build answering as the reconciler.
func enableNamed(t *testing.T, ctx context.Context, d *auth.Dir, url string) (int, string) {
	t.Helper()
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{url}, Creds: d.CredsPath("reconciler")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc, err := engine.AddStateService(nc, func(string) (*reconcile.State, bool) { return nil, false }, engine.StateServiceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	var out bytes.Buffer
	code := run(ctx, []string{"auth", "enable-named", "--dir", d.Path(), "-s", url, "--log-level", "warn"}, nil, &out, &out)
	return code, out.String()
}

// The first named operator's step on the stream (auth add-operator): it
// issues the creds whatever the reconcilers run, but adds the stream's
// named subjects only when every reconciler's state service says its
// build folds them. None answering, or one of an older build (a state
// service without the named_operators metadata), leaves the stream as it
// is (exit 1, saying so); a reconciler of this build lets it add them,
// once.
func TestAddOperatorUpgradesTheStreamLast(t *testing.T) {
	t.Parallel()
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
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
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Subjects
	}
	before := subjects()
	cli := func(args ...string) (int, string) {
		var out bytes.Buffer
		code := run(ctx, append(args, "--dir", d.Path(), "-s", e.ClientURL(), "--log-level", "warn"), nil, &out, &out)
		return code, out.String()
	}

	// No reconciler answers: alice is issued, the stream left alone.
	code, out := cli("auth", "add-operator", "alice")
	if code != exitError || !strings.Contains(out, "operator-alice issued") || !strings.Contains(out, "no reconciler's state service answered") {
		t.Fatalf("add-operator with no reconciler: exit %d\n%s", code, out)
	}
	if d2, err := auth.Open(d.Path()); err != nil {
		t.Fatal(err)
	} else if _, err := d2.User("operator-alice"); err != nil {
		t.Errorf("operator-alice not issued: %v", err)
	}
	// A reconciler of the build before: its state service has no
	// named_operators metadata.
	old, err := micro.AddService(nc, micro.Config{Name: events.StateServiceName, Version: events.StateServiceVersion, Metadata: map[string]string{"prefix": "mesh"}})
	if err != nil {
		t.Fatal(err)
	}
	code, out = cli("auth", "enable-named")
	if code != exitError || !strings.Contains(out, "1 of 1 reconcilers run an older build") || !strings.Contains(out, "an older build: folds no named") {
		t.Fatalf("enable-named beside an older reconciler: exit %d\n%s", code, out)
	}
	if got := subjects(); !slices.Equal(got, before) {
		t.Fatalf("the refused steps changed the stream's subjects: %v, was %v", got, before)
	}
	_ = old.Stop()

	// Every reconciler upgraded: the step adds the patterns, once.
	if code, out := enableNamed(t, ctx, d, e.ClientURL()); code != 0 || !strings.Contains(out, "added 17 subjects") {
		t.Fatalf("enable-named beside this build's reconciler: exit %d\n%s", code, out)
	}
	if got, want := len(subjects()), len(before)+17; got != want {
		t.Errorf("after enable-named the stream captures %d subjects, want %d", got, want)
	}
	if code, out := cli("auth", "add-operator", "bob"); code != 0 || !strings.Contains(out, "stores named operators' events already") {
		t.Errorf("add-operator bob on a stream that stores them: exit %d\n%s", code, out)
	}
}

// Alice's creds acting as bob, verb by verb: refused with the reason,
// exit 2, nothing published. Where the event's subject carries the name
// (gate, ungate, approve: the node's operator kinds; the rollout verbs:
// the fleets' named subjects) the reason is the server's rule; where the
// server cannot check it (apply's start, sealed secrets' keys) meshfold
// refuses it and says that the server does not check it. The shared operator's creds still need
// --by on each.
func TestNamedOperatorIsNobodyElse(t *testing.T) {
	t.Parallel()
	d, e, ctx, js := aliceMesh(t)
	stream, _, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if code, out := enableNamed(t, ctx, d, e.ClientURL()); code != 0 {
		t.Fatalf("auth enable-named: exit %d\n%s", code, out)
	}
	fleetFile := writeFleet(t, fleetYAML)
	cli := func(creds string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(ctx, append(args, "-s", e.ClientURL(), "--creds", d.CredsPath(creds), "--log-level", "warn"), strings.NewReader("s3cret"), &out, &errb)
		return code, out.String() + errb.String()
	}
	const (
		server  = "the server lets them act only as alice"
		cliOnly = "the server does not check the name"
	)
	for _, c := range []struct {
		args []string
		why  string
	}{
		{[]string{"gate", "ace", "db", "--new"}, server},
		{[]string{"ungate", "ace", "db", "--new"}, server},
		{[]string{"approve", "ace", "db", "img:2", "--new"}, server},
		{[]string{"rollout", "pause", "web"}, server},
		{[]string{"rollout", "resume", "web"}, server},
		{[]string{"rollout", "promote", "web"}, server},
		{[]string{"rollout", "abort", "web"}, server},
		{[]string{"rollout", "revert", "web"}, server},
		{[]string{"apply", "-f", fleetFile}, cliOnly},
		{[]string{"apply", "-f", fleetFile, "--dry-run"}, cliOnly},
		{[]string{"secret", "put", "ace", "db", "/etc/db/pass"}, cliOnly},
		{[]string{"secret", "rm", "ace", "db", "/etc/db/pass"}, cliOnly},
	} {
		name := strings.Join(c.args[:2], " ")
		code, out := cli("operator-alice", append(c.args, "--by", "bob")...)
		if code != exitUsage || !strings.Contains(out, `--by "bob": these creds are operator alice's`) || !strings.Contains(out, c.why) {
			t.Errorf("%s --by bob with alice's creds: exit %d, want %d saying %q\n%s", name, code, exitUsage, c.why, out)
		}
		if slices.Contains(c.args, "--dry-run") {
			continue // a dry run needs no --by
		}
		if code, out := cli("operator", c.args...); code != exitUsage || !strings.Contains(out, `required flag(s) "by"`) {
			t.Errorf("%s with the shared operator's creds, no --by: exit %d, want %d\n%s", name, code, exitUsage, out)
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("the refused verbs published: the stream holds %d messages", info.State.Msgs)
	}
	if _, err := js.KeyValue(ctx, store.DefaultStreamName+store.SecretsBucketSuffix); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("the refused secret verbs made or found the secrets bucket: %v", err)
	}
}

// A named operator's rollout verbs go on its named subject
// (<prefix>.rollout.<fleet>.<verb>.alice), the only one alice's creds may
// publish a verb on: the rollout's history names alice because the
// server checked it. alice's creds publishing by hand, on her own
// subject, a verb whose payload names bob: stored, and folded as
// rejected (the rollout stays paused by alice). The shared operator's
// verb stays plain and self-declared.
func TestNamedOperatorRolloutVerbs(t *testing.T) {
	t.Parallel()
	d, e, ctx, js := aliceMesh(t)
	connect := func(user string) jetstream.JetStream { return connectAs(t, d, e, user) }
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	subj := cfg.Subjects()
	cli := func(creds string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, append(args, "-s", e.ClientURL(), "--creds", d.CredsPath(creds), "--log-level", "warn"), nil, &out, &errb)
		return code, out.String(), errb.String()
	}
	status := func() rollout.View {
		t.Helper()
		code, out, errs := cli("operator-alice", "rollout", "status", "web", "-o", "json")
		var v rollout.View
		if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("rollout status: exit %d\n%s%s", code, out, errs)
		}
		return v
	}
	if code, out, errs := cli("operator-alice", "apply", "-f", writeFleet(t, fleetYAML), "--new", "--wait", "0"); code != 0 {
		t.Fatalf("apply with alice's creds: exit %d\n%s%s", code, out, errs)
	}
	if start, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", "start")); err != nil || !strings.Contains(string(start.Data), `"by":"alice"`) {
		t.Fatalf("apply's start: %v %s", err, start.Data)
	}

	// Before the stream stores named rollout verbs: refused, saying why.
	if code, out, errs := cli("operator-alice", "rollout", "pause", "web"); code != exitError || !strings.Contains(errs, "does not store named operators' rollout verbs yet") {
		t.Fatalf("alice's rollout pause before enable-named: exit %d\n%s%s", code, out, errs)
	}
	if code, out := enableNamed(t, ctx, d, e.ClientURL()); code != 0 || !strings.Contains(out, "added 17 subjects") {
		t.Fatalf("auth enable-named: exit %d\n%s", code, out)
	}
	if code, out, errs := cli("operator-alice", "rollout", "pause", "web", "--by", "bob"); code != exitUsage || !strings.Contains(errs, "the server lets them act only as alice") {
		t.Errorf("alice's rollout pause --by bob: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli("operator-alice", "rollout", "pause", "web", "--reason", "db migrates"); code != 0 {
		t.Fatalf("alice's rollout pause: exit %d\n%s%s", code, out, errs)
	}
	m, err := stream.GetLastMsgForSubject(ctx, subj.NamedRollout("web", "pause", "alice"))
	if err != nil {
		t.Fatalf("alice's pause on her named subject: %v", err)
	}
	if v := status(); v.Paused == nil || v.Paused.By != "alice" || !v.Paused.Checked {
		t.Fatalf("after alice's pause #%d the rollout is paused by %+v, want alice, checked", m.Sequence, v.Paused)
	}
	if code, out, errs := cli("operator", "rollout", "status", "web"); code != 0 || !strings.Contains(out, "by alice (checked): db migrates") {
		t.Errorf("rollout status: exit %d, want the pause by alice (checked)\n%s%s", code, out, errs)
	}

	// alice's creds, by hand: a resume naming bob on her own subject is
	// stored (the server checks the subject, not the payload) and
	// folded as rejected; on bob's subject the server refuses it.
	ajs := connect("operator-alice")
	forged, err := json.Marshal(rollout.Stamp(rollout.NewOperator(rollout.KindResume, status().Rollout, "bob", ""), time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ajs.Publish(ctx, subj.NamedRollout("web", "resume", "alice"), forged); err != nil {
		t.Fatal(err)
	}
	if v := status(); v.Paused == nil || v.Paused.By != "alice" {
		t.Errorf("a resume naming bob on alice's subject was taken: paused %+v", v.Paused)
	}
	for _, s := range []string{subj.NamedRollout("web", "resume", "bob"), subj.Rollout("web", "resume")} {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := connect("operator-alice").Publish(pctx, s, forged) // a violation closes the connection
		cancel()
		if _, got := stream.GetLastMsgForSubject(ctx, s); err == nil || !errors.Is(got, jetstream.ErrMsgNotFound) {
			t.Errorf("alice's creds publishing a resume on %s: %v, stored: %v", s, err, got)
		}
	}

	// The shared operator's resume: plain, by as given.
	if code, out, errs := cli("operator", "rollout", "resume", "web", "--by", "carol"); code != 0 {
		t.Fatalf("the shared operator's resume: exit %d\n%s%s", code, out, errs)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", "resume")); err != nil {
		t.Errorf("the shared operator's resume on the plain subject: %v", err)
	}
	if v := status(); v.Paused != nil {
		t.Errorf("after carol's resume: paused %+v", v.Paused)
	}
}

// A stream whose step the build before named rollout verbs took (the
// partitions' named patterns only) gains the rollouts' pattern from
// enable-named only once every reconciler says named_rollouts: beside a
// state service of that build (named_operators, no named_rollouts) the
// stream is left as it is, exit 1; beside this build's, the one pattern
// is added.
func TestEnableNamedAddsRolloutsAfterThePreviousBuildsStep(t *testing.T) {
	t.Parallel()
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
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
	// The previous build's step: the partitions' patterns alone.
	upd := stream.CachedInfo().Config
	upd.Subjects = append(upd.Subjects, cfg.Subjects().NamedInput()...)
	if _, err := js.UpdateStream(ctx, upd); err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Subjects
	}
	before := subjects()
	previous, err := micro.AddService(nc, micro.Config{Name: events.StateServiceName, Version: events.StateServiceVersion,
		Metadata: map[string]string{"prefix": "mesh", events.MetaNamedOperators: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code := run(ctx, []string{"auth", "enable-named", "--dir", d.Path(), "-s", e.ClientURL(), "--log-level", "warn"}, nil, &out, &out)
	if code != exitError || !strings.Contains(out.String(), "folds no named operator's rollout verb") || !strings.Contains(out.String(), "1 of 1 reconcilers run an older build") {
		t.Fatalf("enable-named beside the previous build's reconciler: exit %d\n%s", code, out.String())
	}
	if got := subjects(); !slices.Equal(got, before) {
		t.Fatalf("the refused step changed the stream's subjects: %v, was %v", got, before)
	}
	_ = previous.Stop()
	if code, out := enableNamed(t, ctx, d, e.ClientURL()); code != 0 || !strings.Contains(out, "added 1 subject (mesh.rollout.*.*.*)") {
		t.Fatalf("enable-named beside this build's reconciler: exit %d\n%s", code, out)
	}
}
