package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// TestAck: `meshfold ack NODE --by NAME` against a live reconciler (issue
// 25). A node's journal error flags it in fleet; once acked it is counted
// on fleet's 'acked' line (who, through which sequence) and no longer under
// the node's needs; state shows the ack, audit who acked what when; a
// warning stored after the ack flags the node again. An unknown node is
// refused unless --new; --upto 0 is a usage error.
func TestAck(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	m.serveReconciler(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, errOut, code := m.cli(t, "want", "warned", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: exit %d %s", code, errOut)
	}
	// A settle naming a plan that does not exist yet: the reconciler
	// journals it at level error.
	badSettle := func() {
		t.Helper()
		if _, err := pub.Append(ctx, "warned", events.Stamp(&events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 9999}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	badSettle()
	row := func(want func(audit.FleetRow) bool) audit.FleetRow {
		t.Helper()
		return waitfor.Value(t, 20*time.Second, "warned's fleet row", func() (audit.FleetRow, bool) {
			out, _, code := m.cli(t, "fleet", "-o", "json")
			if code != 0 {
				return audit.FleetRow{}, false
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var r audit.FleetRow
				if json.Unmarshal([]byte(line), &r) == nil && r.Node == "warned" && want(r) {
					return r, true
				}
			}
			return audit.FleetRow{}, false
		})
	}
	r := row(func(r audit.FleetRow) bool { return r.Warnings == 1 })
	if !strings.Contains(strings.Join(r.Attention, " "), "journal") {
		t.Fatalf("the journal error does not flag warned: %+v", r.Attention)
	}

	out, errOut, code := m.cli(t, "ack", "warned", "--by", "alice", "--reason", "read it")
	if code != 0 || !strings.Contains(out, "ack warned: stream sequence") || !strings.Contains(errOut, "acknowledged") {
		t.Fatalf("ack: exit %d\n%s\n%s", code, out, errOut)
	}
	ackSeq, err := strconv.ParseUint(regexp.MustCompile(`sequence (\d+)`).FindStringSubmatch(out)[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	r = row(func(r audit.FleetRow) bool { return r.Ack != nil })
	if r.Warnings != 0 || r.AckedWarnings != 1 || r.Ack.By != "alice" || r.Ack.Upto != ackSeq || r.Ack.Seq != ackSeq ||
		strings.Contains(strings.Join(r.Attention, " "), "journal") {
		t.Errorf("after the ack: warnings %d, acked %d, ack %+v, needs %v", r.Warnings, r.AckedWarnings, r.Ack, r.Attention)
	}
	out, _, _ = m.cli(t, "fleet")
	wantAcked := "acked     warned 1 journal warning through #" + strconv.FormatUint(ackSeq, 10) + " acknowledged by alice"
	if !strings.Contains(out, wantAcked) || strings.Contains(out, " warnings\n") {
		t.Errorf("fleet does not show the acked warning apart:\n%s", out)
	}
	out, _, _ = m.cli(t, "state", "warned")
	if !strings.Contains(out, "acked     journal warnings through #"+strconv.FormatUint(ackSeq, 10)+" acknowledged by alice") {
		t.Errorf("state does not show the ack:\n%s", out)
	}
	out, _, _ = m.cli(t, "audit", "warned")
	if !regexp.MustCompile(`(?m)^\s*` + strconv.FormatUint(ackSeq, 10) + ` \S+ ack\s+journal warnings through #\d+ acknowledged by alice: read it`).MatchString(out) {
		t.Errorf("audit does not say who acked what when:\n%s", out)
	}

	// An ack that would change nothing says so and publishes nothing:
	// every warning is acked, and --upto below the ack in force.
	for _, args := range [][]string{{"--upto", "1"}, {}} {
		out, errOut, code := m.cli(t, append([]string{"ack", "warned", "--by", "alice"}, args...)...)
		if code != 0 || out != "" || !strings.Contains(errOut, "already acknowledged through #"+strconv.FormatUint(ackSeq, 10)+" (by alice") ||
			!strings.Contains(errOut, "nothing published") {
			t.Errorf("ack %v after the ack: exit %d\n%s\n%s", args, code, out, errOut)
		}
	}

	// A later warning flags the node again; the acked one stays apart.
	badSettle()
	r = row(func(r audit.FleetRow) bool { return r.Warnings == 1 })
	if r.AckedWarnings != 1 || !strings.Contains(strings.Join(r.Attention, " "), "journal") {
		t.Errorf("a warning after the ack: acked %d, needs %v", r.AckedWarnings, r.Attention)
	}

	// No node from a typo; --upto 0 is no sequence.
	if _, errOut, code := m.cli(t, "ack", "warnde", "--by", "alice"); code != exitUsage || !strings.Contains(errOut, "--new") {
		t.Errorf("ack of an unknown node: exit %d %s", code, errOut)
	}
	if _, errOut, code := m.cli(t, "ack", "warned", "--by", "alice", "--upto", "0"); code != exitUsage || !strings.Contains(errOut, "--upto 0") {
		t.Errorf("--upto 0: exit %d %s", code, errOut)
	}
	if _, errOut, code := m.cli(t, "ack", "fresh", "--by", "alice", "--new"); code != 0 {
		t.Errorf("ack --new: exit %d %s", code, errOut)
	}
	// A node with no warning: nothing to ack, unless forced.
	if out, errOut, code := m.cli(t, "ack", "fresh", "--by", "alice"); code != 0 || out != "" || !strings.Contains(errOut, "it has no journal warning to acknowledge") {
		t.Errorf("ack of a node with no warning: exit %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := m.cli(t, "ack", "fresh", "--by", "alice", "--force"); code != 0 || !strings.Contains(out, "ack fresh: stream sequence") {
		t.Errorf("ack --force: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := m.cli(t, "ack", "warned"); code != exitUsage || !strings.Contains(errOut, "by") {
		t.Errorf("ack without --by: exit %d %s", code, errOut)
	}
}
