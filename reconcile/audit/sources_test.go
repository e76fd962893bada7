package audit_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// A shadowed file is filled: its line says the sealed secret is
// shadowed and why, not that the file is not filled (a fresh user's
// finding F7); an unfilled file's line is as before.
func TestSourcesTextShadowed(t *testing.T) {
	now := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	got := audit.SourcesText("ace", []audit.SourceProblem{
		{Module: "app", Path: "/run/app/token", State: audit.Shadowed, Why: "filled from dir /srv/x, tried before sealed", Since: now.Add(-3 * time.Second)},
		{Module: "app", Path: "/run/app/key", State: "missing", Why: "dir /srv/x: no file", Since: now.Add(-time.Minute)},
	}, now)
	// One line a file, each starting with "source" (a long one wraps).
	lines := strings.Split(strings.Join(strings.Fields(got), " "), "source ")[1:]
	if len(lines) != 2 || !strings.Contains(lines[0], "ace app /run/app/token sealed secret shadowed since 3s ago") ||
		strings.Contains(lines[0], "not filled") || !strings.Contains(lines[0], "filled from dir /srv/x") ||
		!strings.Contains(lines[1], "ace app /run/app/key not filled: missing since 1m") {
		t.Fatalf("text:\n%s", got)
	}
}

// The header above the source lines says "not filled" only while no file
// among them is shadowed (a shadowed file is filled, from another source).
func TestSourcesHeader(t *testing.T) {
	missing := audit.SourceProblem{Module: "app", Path: "/run/app/key", State: "missing"}
	shadowed := audit.SourceProblem{Module: "app", Path: "/run/app/token", State: audit.Shadowed}
	for _, c := range []struct {
		ps   []audit.SourceProblem
		want string
	}{
		{[]audit.SourceProblem{missing}, "not filled, as the provisioner reports it:\n"},
		{[]audit.SourceProblem{missing, shadowed}, "not filled, or filled from a source that shadows a put, as the provisioner reports it:\n"},
		{[]audit.SourceProblem{shadowed}, "not filled, or filled from a source that shadows a put, as the provisioner reports it:\n"},
	} {
		if got := audit.SourcesHeader(c.ps); got != c.want {
			t.Errorf("SourcesHeader(%v) = %q, want %q", c.ps, got, c.want)
		}
	}
}

// A why longer than a fleet line keeps is cut between words, with "…",
// its length and where it is whole, in fleet's lines (the table, the
// console's fleet rows); `meshfold state` (SourcesText) prints it whole.
// events.ErrorText cut it at byte counts: "(the --from or…7:54Z is not
// what" (a fresh user's finding L4, this why as their provisioner wrote
// it).
func TestFleetSourcesTextCutsBetweenWords(t *testing.T) {
	now := time.Date(2026, 12, 4, 15, 38, 0, 0, time.UTC)
	why := "filled from dir /tmp/fixview-repro/w/secrets, tried before sealed (the --from order); the sealed secret put by " +
		"alice-the-operator-on-call at 2026-12-04T15:37:54Z is not what the node holds: give --from sealed before dir " +
		"/tmp/fixview-repro/w/secrets, or remove the file from it"
	short := "exec vault-fill: helper exit status 3"
	rows := []audit.FleetRow{{Node: "ace", Sources: []audit.SourceProblem{
		{Module: "app", Path: "/run/app/token", State: audit.Shadowed, Why: why, Since: now.Add(-3 * time.Second)},
		{Module: "app", Path: "/run/app/key", State: "failed", Why: short, Since: now.Add(-time.Minute)},
	}}}
	words := strings.Fields(why)
	fleet := strings.Join(strings.Fields(audit.FleetSourcesText(rows, now)), " ")
	_, cut, _ := strings.Cut(fleet, "shadowed since 3s ago: ")
	cut, rest, ok := strings.Cut(cut, fmt.Sprintf(" (%d bytes; whole in 'meshfold state ace')", len(why)))
	head, tail, two := strings.Cut(cut, " … ")
	if !ok || !two || !strings.Contains(rest, "not filled: failed since 1m ago: "+short) {
		t.Fatalf("fleet's lines: the long why not cut with … and its length, or the short one not whole:\n%s", fleet)
	}
	hw, tw := strings.Fields(head), strings.Fields(tail)
	if len(hw) == 0 || len(tw) == 0 || !slices.Equal(hw, words[:len(hw)]) || !slices.Equal(tw, words[len(words)-len(tw):]) ||
		len(hw)+len(tw) >= len(words) {
		t.Errorf("the why is not cut between words: head %q, tail %q of\n%s", head, tail, why)
	}
	if len(head)+len(tail) > 200 {
		t.Errorf("the cut why keeps %d bytes, more than 200", len(head)+len(tail))
	}
	state := strings.Join(strings.Fields(audit.SourcesText("ace", rows[0].Sources, now)), " ")
	if !strings.Contains(state, "shadowed since 3s ago: "+why+" source ace app /run/app/key") || strings.Contains(state, "…") {
		t.Errorf("state's lines: the why not whole:\n%s", state)
	}
	// A control character is never printed raw: the why is quoted.
	rows[0].Sources = []audit.SourceProblem{{Module: "app", Path: "/run/app/key", State: "failed", Why: "helper said \x1b[31m" + why, Since: now}}
	for _, got := range []string{audit.FleetSourcesText(rows, now), audit.SourcesText("ace", rows[0].Sources, now)} {
		if strings.Contains(got, "\x1b") || !strings.Contains(got, `helper said \x1b[31m`) {
			t.Errorf("a why with an escape:\n%q", got)
		}
	}
}

// A file not filled now that a provisioner filled before says when it
// was last filled and why no newer content came, never "not filled" (a
// fresh user's finding U10: "not filled: missing" after 'secret rm' read
// as a file missing on the node), nor that the node keeps it, only that
// the node has not reported it gone (fresh6 M4: "kept as last filled" of
// a file a re-image had removed). One never filled still says "not
// filled"; the header says both.
// A file the node's agent reported gone (reconcile.View.Missing) is not
// said last filled only: the provisioners' record says what they last
// had the node write, the have what the node holds (provfix); one gone
// at the agent's start (a reboot, a re-image) says so.
func TestSourcesTextGoneFromNode(t *testing.T) {
	now := time.Date(2026, 12, 4, 15, 46, 0, 0, time.UTC)
	last := time.Date(2026, 12, 4, 15, 40, 1, 0, time.UTC)
	ps := []audit.SourceProblem{
		{Module: "app", Path: "/run/app/token", State: "missing", Why: "dir /srv/x: no file", Since: now.Add(-6 * time.Second), LastFilled: last},
		{Module: "app", Path: "/run/app/ca", State: "missing", Why: "dir /srv/x: no file", Since: now.Add(-time.Minute), LastFilled: last},
		{Module: "app", Path: "/run/app/tls", State: "missing", Why: "dir /srv/x: no file", Since: now.Add(-time.Minute), LastFilled: last},
	}
	marked := audit.MarkGone(ps, []reconcile.MissingFile{{Module: "app", Path: "/run/app/token", Seq: 41, Time: now},
		{Module: "app", Path: "/run/app/tls", Seq: 42, Time: now, AtStart: true}})
	if ps[0].Gone != 0 {
		t.Fatal("MarkGone changed its argument")
	}
	got := strings.Join(strings.Fields(audit.SourcesText("fox", marked, now)), " ")
	for _, want := range []string{
		"fox app /run/app/token gone from the node (reported at #41; last filled at 2026-12-04T15:40:01.000Z); no source gives it again: missing since 6s ago",
		"fox app /run/app/tls gone from the node at its agent's start (reported at #42; last filled at 2026-12-04T15:40:01.000Z); no source gives it again: missing since 1m ago",
		"fox app /run/app/ca last filled at 2026-12-04T15:40:01.000Z (the node has not reported it gone)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "token last filled at") {
		t.Errorf("a file the node reported gone is said kept:\n%s", got)
	}
	if h := audit.SourcesHeader(marked[:1]); strings.Contains(h, "last filled") {
		t.Errorf("header of a gone file alone says kept: %q", h)
	}
	if same := audit.MarkGone(ps, nil); &same[0] != &ps[0] {
		t.Error("MarkGone with nothing missing copied ps")
	}
}

func TestSourcesTextKeptAsLastFilled(t *testing.T) {
	now := time.Date(2026, 12, 4, 15, 46, 0, 0, time.UTC)
	last := time.Date(2026, 12, 4, 15, 40, 1, 0, time.UTC)
	ps := []audit.SourceProblem{
		{Module: "app", Path: "/run/app/token", State: "missing", Why: "sealed: removed by you at 2026-12-04T15:45:37Z", Since: now.Add(-6 * time.Second), LastFilled: last},
		{Module: "app", Path: "/run/app/ca", State: "sealed-to-other-key", Why: "sealed: sealed to another key", Since: now.Add(-time.Minute), LastFilled: last},
		{Module: "app", Path: "/run/app/tls", State: "refused", Why: "wrong-account: the node refuses writes from nbody", Since: now.Add(-time.Minute), LastFilled: last},
		{Module: "app", Path: "/run/app/key", State: "missing", Why: "dir /srv/x: no file", Since: now.Add(-time.Minute)},
	}
	raw := audit.SourcesText("fox", ps, now)
	got := strings.Join(strings.Fields(raw), " ")
	// One line a file, each starting with "source" (a long one wraps,
	// its rest indented).
	var lines []string
	for _, l := range strings.Split(raw, "\n") {
		if rest, ok := strings.CutPrefix(l, "source"); ok {
			lines = append(lines, strings.Join(strings.Fields(rest), " "))
		} else if len(lines) > 0 {
			lines[len(lines)-1] += " " + strings.Join(strings.Fields(l), " ")
		}
	}
	for i, want := range []string{
		"fox app /run/app/token last filled at 2026-12-04T15:40:01.000Z (the node has not reported it gone); no source gives a newer one: missing since 6s ago: sealed: removed by you",
		"fox app /run/app/ca last filled at 2026-12-04T15:40:01.000Z (the node has not reported it gone); no source gives a newer one: sealed-to-other-key since 1m ago",
		"fox app /run/app/tls last filled at 2026-12-04T15:40:01.000Z (the node has not reported it gone); a newer one is not written: refused since 1m ago",
		"fox app /run/app/key not filled: missing since 1m ago",
	} {
		if len(lines) != 4 || !strings.Contains(lines[i], want) {
			t.Errorf("line %d does not say %q:\n%s", i, want, got)
		}
	}
	if strings.Count(got, "not filled") != 1 || strings.Contains(got, "kept") {
		t.Errorf("a kept file said not filled:\n%s", got)
	}
	fleet := strings.Join(strings.Fields(audit.FleetSourcesText([]audit.FleetRow{{Node: "fox", Sources: ps[:1]}}, now)), " ")
	if !strings.Contains(fleet, "last filled at 2026-12-04T15:40:01.000Z (the node has not reported it gone)") ||
		strings.Contains(fleet, "not filled") || strings.Contains(fleet, "kept") {
		t.Errorf("fleet's line:\n%s", fleet)
	}
	if h := audit.SourcesHeader(ps); h != "not filled, or not filled again since last filled, as the provisioner reports it:\n" {
		t.Errorf("header %q", h)
	}
}
