package auth_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// A named operator's credentials publish operator events only on the
// named subjects that end in its own name: alice's creds publishing an
// approval that names bob is refused by the server (the subject's
// name, on bob's subject, and the plain subject the shared operator
// uses alike), so the `by` a reader takes from a named subject is one the
// server checked. The shared operator and a node cannot publish on a
// named subject either. Revoking alice leaves bob's creds working.
func TestNamedOperatorsActOnlyAsThemselves(t *testing.T) {
	s := startSecured(t)
	for _, name := range []string{"alice", "bob"} {
		if _, err := s.dir.AddOperator(name); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testCtx(t)
	_, rjs := s.mustConnect(t, "reconciler")
	_, cfg, err := store.EnsureStream(ctx, rjs, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// The administrator's step (auth enable-named), as the reconciler:
	// the only role that may update the stream.
	if _, err := store.CaptureNamed(ctx, rjs, store.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	subj := cfg.Subjects()
	approve := func(by string) []byte {
		b, err := events.Encode(events.Stamp(&events.Approve{Module: "nats", Build: "img:1", By: by}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	publish := func(subject string, data []byte) action {
		return func(ctx context.Context, c *cell) error {
			_, err := c.js.Publish(ctx, subject, data)
			return err
		}
	}
	for _, tc := range []struct {
		user, what, subject, by, want string
	}{
		{"operator-alice", "approval as alice", subj.Named("ace", events.KindApprove, "alice"), "alice", "ok"},
		{"operator-alice", "pause as alice", subj.Named("ace", events.KindPause, "alice"), "alice", "ok"},
		{"operator-alice", "approval as bob", subj.Named("ace", events.KindApprove, "bob"), "bob", "-"},
		{"operator-alice", "approval on the plain subject", subj.Event("ace", events.KindApprove), "bob", "-"},
		{"operator-alice", "approval stored as is", subj.Stored("ace", events.KindApprove), "bob", "-"},
		{"operator-alice", "want", subj.Event("ace", events.KindWant), "", "-"},
		{"operator-bob", "approval as bob", subj.Named("ace", events.KindApprove, "bob"), "bob", "ok"},
		{"operator", "approval as alice", subj.Named("ace", events.KindApprove, "alice"), "alice", "-"},
		{"operator", "approval, self-declared", subj.Event("ace", events.KindApprove), "carol", "ok"},
		{"node-ace", "approval as alice", subj.Named("ace", events.KindApprove, "alice"), "alice", "-"},
		// The fleets' rollout verbs (a named operator's on its named
		// subjects only), and apply's start, plain for every operator.
		{"operator-alice", "rollout pause as alice", subj.NamedRollout("web", "pause", "alice"), "alice", "ok"},
		{"operator-alice", "rollout revert as alice", subj.NamedRollout("web", "revert", "alice"), "alice", "ok"},
		{"operator-alice", "rollout pause as bob", subj.NamedRollout("web", "pause", "bob"), "bob", "-"},
		{"operator-alice", "rollout pause on the plain subject", subj.Rollout("web", "pause"), "bob", "-"},
		{"operator-alice", "rollout promote on the plain subject", subj.Rollout("web", "promote"), "bob", "-"},
		{"operator-alice", "rollout start (apply)", subj.Rollout("web", "start"), "alice", "ok"},
		{"operator-alice", "rollout tick as alice", subj.NamedRollout("web", "tick", "alice"), "alice", "-"},
		{"operator", "rollout pause as alice", subj.NamedRollout("web", "pause", "alice"), "alice", "-"},
		{"operator", "rollout pause, self-declared", subj.Rollout("web", "pause"), "carol", "ok"},
		{"controller", "rollout pause as alice", subj.NamedRollout("web", "pause", "alice"), "alice", "-"},
	} {
		got, err := run(s, cfg, tc.user, publish(tc.subject, approve(tc.by)))
		if err != nil {
			t.Fatalf("%s: %s: %v", tc.user, tc.what, err)
		}
		if got != tc.want {
			t.Errorf("%s publishing %s on %s: %s, want %s", tc.user, tc.what, tc.subject, got, tc.want)
		}
	}

	// The reader's by: the newest approval of ace, of both forms, is
	// carol's, self-declared on the plain subject (after bob's named
	// one); then alice's own subject with a payload naming bob, newer,
	// is an invalid event, never bob's approval.
	stream, err := rjs.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := store.LastMsg(ctx, stream, subj, "ace", events.KindApprove)
	if err != nil {
		t.Fatal(err)
	}
	if ap, ok := m.Event.Payload.(*events.Approve); !ok || ap.By != "carol" || m.Subject != subj.Stored("ace", events.KindApprove) {
		t.Errorf("newest approval of ace: %s %+v", m.Subject, m.Event.Payload)
	}
	if got, err := run(s, cfg, "operator-alice", publish(subj.Named("ace", events.KindApprove, "alice"), approve("bob"))); err != nil || got != "ok" {
		t.Fatalf("alice's subject, bob's name in the payload: %s %v", got, err)
	}
	m, err = store.LastMsg(ctx, stream, subj, "ace", events.KindApprove)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(m.Event.Err, events.ErrNotPublisher) {
		t.Errorf("alice's approval naming bob in its payload: %v, want ErrNotPublisher", m.Event.Err)
	}

	// The CLI's publisher as alice: on her subject; a payload naming bob
	// is refused before anything is published.
	_, ajs := s.mustConnect(t, "operator-alice")
	pub := store.NewPublisher(ajs, subj).As("alice")
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Poke{By: "alice"}, time.Now())); err != nil {
		t.Errorf("alice's poke through Publisher.As: %v", err)
	}
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Poke{By: "bob"}, time.Now())); !errors.Is(err, events.ErrNotPublisher) {
		t.Errorf("a poke by bob through alice's publisher: %v, want ErrNotPublisher", err)
	}

	// Revoking alice: her creds are refused, bob's still connect.
	sys, err := s.connect(auth.SystemUser)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	must(t, s.dir.Revoke("operator-alice"))
	if rep, err := s.dir.Push(ctx, sys); err != nil || !rep.Applied() {
		t.Fatalf("push: %+v %v", rep, err)
	}
	if nc, err := s.connect("operator-alice"); err == nil || !isAuthError(err) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("revoked operator-alice: %v, want an authorization violation", err)
	}
	if got, err := run(s, cfg, "operator-bob", publish(subj.Named("ace", events.KindRetire, "bob"),
		mustEncode(t, events.Stamp(&events.Retire{By: "bob"}, time.Now())))); err != nil || got != "ok" {
		t.Errorf("operator-bob after alice's revocation: %s %v", got, err)
	}
}

// AddOperator refuses "read" (operator-read is the console's user), a
// bad name, and a second issue of a valid user.
func TestAddOperatorRefuses(t *testing.T) {
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddOperator("read"); !errors.Is(err, auth.ErrReservedName) {
		t.Errorf("read: %v, want ErrReservedName", err)
	}
	if _, err := d.AddOperator("Al ice"); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("a bad name: %v, want ErrInvalid", err)
	}
	u, err := d.AddOperator("alice")
	if err != nil || u.Name != "operator-alice" || u.Operator != "alice" || u.Role != auth.RoleOperator {
		t.Fatalf("alice: %+v %v", u, err)
	}
	if _, err := d.AddOperator("alice"); !errors.Is(err, auth.ErrUserExists) {
		t.Errorf("alice again: %v, want ErrUserExists", err)
	}
	if got := auth.OperatorOf("operator-alice"); got != "alice" {
		t.Errorf("OperatorOf(operator-alice) = %q", got)
	}
	for _, user := range []string{"operator", "operator-read", "node-ace", "operator-"} {
		if got := auth.OperatorOf(user); got != "" {
			t.Errorf("OperatorOf(%s) = %q, want none", user, got)
		}
	}
}

func mustEncode(t *testing.T, p events.Payload) []byte {
	t.Helper()
	b, err := events.Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
