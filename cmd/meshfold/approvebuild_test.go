package main

import (
	"strings"
	"testing"
)

// approve and revoke check BUILD as want does (a fresh user's finding:
// they took any string): a build of no build's form is refused with exit
// 2 whatever the flags, a sha256: build the builds bucket lacks with exit
// 1 naming the nearest stored unless --allow-missing-build; nothing is
// published when refused; a stored build and another runtime's build
// pass.
func TestApproveRevokeCheckTheBuild(t *testing.T) {
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
		{"approve", "ace", "nats", "img:2.10", "--by", "alice"},
		{"approve", "ace", "web", missing, "--by", "alice", "--allow-missing-build"},
		{"revoke", "ace", "web", missing, "--by", "alice", "--allow-missing-build"},
		{"revoke", "ace", "web", stored, "--by", "alice"},
	} {
		if out, errs, code := m.cli(t, args...); code != 0 || !strings.Contains(out, "stream sequence") {
			t.Errorf("%v: exit %d, %q %q", args, code, out, errs)
		}
	}
}
