package main

import (
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// approve and revoke check BUILD as want does (a fresh user's finding:
// they took any string): a build of no build's form is refused with exit
// 2 whatever the flags, a sha256: build the builds bucket lacks with exit
// 1 naming the nearest stored unless --allow-missing-build; nothing is
// published when refused; a stored build and another runtime's build
// pass.
func TestApproveRevokeCheckTheBuild(t *testing.T) {
	t.Parallel()
	m := applyMesh(t) // ace, bob, cat with a want each
	stored := pushExe(t, m, "web", "one")
	missing := "sha256:" + strings.Repeat("ab", 32)
	count := func() int { return nodeEvents(t, m, "ace") }
	before := count()
	for _, verb := range []string{"approve", "revoke"} {
		for _, c := range []struct {
			build string
			flags []string
			code  int
			says  []string
		}{
			{"garbage", nil, exitUsage, []string{"no build's form", "garbage"}},
			{"garbage", []string{"--allow-missing-build"}, exitUsage, []string{"no build's form"}},
			{"sha256:1234", nil, exitUsage, []string{"no build's form"}},
			{missing, nil, exitError, []string{"could not fetch", "--allow-missing-build", "the newest stored"}},
		} {
			args := append([]string{verb, "ace", "web", c.build, "--by", "alice"}, c.flags...)
			out, errs, code := m.cli(t, args...)
			if code != c.code || out != "" {
				t.Errorf("%v: exit %d (want %d), stdout %q, stderr %q", args, code, c.code, out, errs)
			}
			for _, s := range c.says {
				if !strings.Contains(errs, s) {
					t.Errorf("%v: stderr does not say %q: %s", args, s, errs)
				}
			}
			if verb == "revoke" && c.code == exitError && !strings.Contains(errs, "removed since") {
				t.Errorf("%v: does not say how to revoke the approval of a removed build: %s", args, errs)
			}
		}
	}
	if n := count(); n != before {
		t.Fatalf("refused approvals and revokes stored %d events", n-before)
	}
	for _, args := range [][]string{
		{"approve", "ace", "web", stored, "--by", "alice"},
		{"approve", "ace", "nats", "img:2.10", "--by", "alice", "--ahead"}, // ace's want names web alone
		{"approve", "ace", "web", missing, "--by", "alice", "--allow-missing-build"},
		{"revoke", "ace", "web", missing, "--by", "alice", "--allow-missing-build"},
		{"revoke", "ace", "web", stored, "--by", "alice"},
	} {
		if out, errs, code := m.cli(t, args...); code != 0 || !strings.Contains(out, "stream sequence") {
			t.Errorf("%v: exit %d, %q %q", args, code, out, errs)
		}
	}
}

// The short build every message prints ("sha256:" and 12 hex digits,
// with or without its "…") names the one stored build it begins in
// approve, revoke and build rm: the event holds the whole build, a note
// says which; a prefix of no stored build, or of several, is refused
// (exit 2) and nothing is published (a fresh user's finding L14).
func TestBuildPrefixNamesTheStoredBuild(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	stored := pushExe(t, m, "web", "one")
	short := stored[:len("sha256:")+12]
	for _, build := range []string{short, short + "…", stored[:len(stored)-1]} {
		for _, verb := range []string{"approve", "revoke"} {
			out, errs, code := m.cli(t, verb, "ace", "web", build, "--by", "alice")
			if code != 0 || !strings.Contains(out, "stream sequence") || !strings.Contains(errs, "is "+stored+", the one stored build it begins") {
				t.Fatalf("%s %s: exit %d, %q %q", verb, build, code, out, errs)
			}
			kind := events.KindApprove
			if verb == "revoke" {
				kind = events.KindRevoke
			}
			msg, err := store.LastMsg(testCtx(t), store.Leader(m.js, m.cfg.Name), m.cfg.Subjects(), "ace", kind)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			switch p := msg.Event.Payload.(type) {
			case *events.Approve:
				got = p.Build
			case *events.Revoke:
				got = p.Build
			}
			if got != stored {
				t.Errorf("%s %s stored build %q, want the whole %s", verb, build, got, stored)
			}
		}
	}
	before := nodeEvents(t, m, "ace")
	other := "sha256:" + strings.Repeat("0", 12)
	if strings.HasPrefix(stored, other) {
		other = "sha256:" + strings.Repeat("1", 12)
	}
	for _, args := range [][]string{{"approve", "ace", "web", other, "--by", "alice"}, {"revoke", "ace", "web", other, "--by", "alice"}, {"build", "rm", other}} {
		if out, errs, code := m.cli(t, args...); code != exitUsage || !strings.Contains(errs, "no stored build begins with it") {
			t.Errorf("%v: exit %d (want 2), %q %q", args, code, out, errs)
		}
	}
	if n := nodeEvents(t, m, "ace"); n != before {
		t.Fatalf("refused prefixes stored %d events", n-before)
	}
	// build rm by the short form: the whole build is removed (no want
	// or have names it).
	if out, errs, code := m.cli(t, "build", "rm", short); code != 0 || !strings.Contains(errs, "is "+stored) {
		t.Errorf("build rm %s: exit %d, %q %q", short, code, out, errs)
	}
}
