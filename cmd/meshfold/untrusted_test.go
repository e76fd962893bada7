package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// TestUntrustedProvisionerSaid: a provisioner whose --trust names another
// key than the reconciler's (a stale trust file after a key rotation)
// refuses every plan and knock; poke, state, fleet and fleet -o json say
// that, naming the reconciler's key and the fix, instead of asking
// whether a provisioner runs (a fresh user's finding G6: they asked
// "is `meshfold provision ace …` running for ace?" while it ran). Once
// it is restarted with the right trust, the poke is taken and nothing is
// said any more.
//
// Not parallel: it sets audit.KnockGrace, which every state and fleet
// run of the package's parallel tests reads.
func TestUntrustedProvisionerSaid(t *testing.T) {
	m := startMesh(t)
	trust := m.serveSigned(t)
	_, stale := testSigner(t) // a trust file naming another key
	rt, err := store.ReadTrustFile(trust)
	if err != nil {
		t.Fatal(err)
	}
	key := rt.Keys()[0] // the reconciler's
	grace := audit.KnockGrace
	audit.KnockGrace = 0 // state and fleet: a knock unanswered at once
	t.Cleanup(func() { audit.KnockGrace = grace })
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: exit %d %s", code, errOut)
	}
	waitComposed(t, m, "ace")

	provision := func(trust string) (stop func() int, logs *noteBuffer) {
		ctx, cancel := context.WithCancel(testCtx(t))
		logs = newNoteBuffer()
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"provision", "ace", "--from", t.TempDir(), "--account", "prov", "--trust", trust, "-s", m.e.ClientURL()}, nil, logs, logs)
		}()
		var code *int
		stop = func() int {
			if code == nil {
				cancel()
				c := <-done
				code = &c
			}
			return *code
		}
		t.Cleanup(func() { stop() })
		return stop, logs
	}
	stop, logs := provision(stale)
	logs.waitText(testCtx(t), t, "provision", "recorded for fleet, state and poke")

	said := []string{"its provisioner refuses the node's plans and knocks", "is signed by key " + key + ", which this provisioner does not trust",
		"if it is the reconciler's, add it to --trust (MESHFOLD_TRUST)"}
	check := func(what, text string, also ...string) {
		t.Helper()
		t.Logf("%s:\n%s", what, text)
		for _, s := range append(also, said...) {
			if !strings.Contains(strings.Join(strings.Fields(text), " "), s) {
				t.Errorf("%s does not say %q:\n%s", what, s, text)
			}
		}
		if strings.Contains(text, "running for ace?") || strings.Contains(text, "no-provisioner") {
			t.Errorf("%s asks whether a provisioner runs:\n%s", what, text)
		}
	}
	out, errOut, code := m.cli(t, "poke", "ace", "--by", "alice", "--wait", "2s")
	if code != 0 {
		t.Fatalf("poke: exit %d %q %q", code, out, errOut)
	}
	check("poke", errOut, "warning: poke ace: no provisioner took knock #")
	out, errOut, code = m.cli(t, "state", "ace")
	if code != 0 {
		t.Fatalf("state: exit %d %s", code, errOut)
	}
	check("state", out, "ace untrusted: ")
	out, errOut, code = m.cli(t, "fleet")
	if code != 0 {
		t.Fatalf("fleet: exit %d %s", code, errOut)
	}
	check("fleet", out, "ace untrusted: ", "source")
	// fleet -o json, once ace's snapshot holds the poke's knock (the
	// unanswered-knock check runs then): the provisioner's record, and
	// no unanswered knock.
	row := waitfor.Value(t, 20*time.Second, "fleet -o json: ace's row with its knock", func() (audit.FleetRow, bool) {
		out, _, code := m.cli(t, "fleet", "-o", "json")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r audit.FleetRow
			if code == 0 && json.Unmarshal([]byte(line), &r) == nil && r.Node == "ace" && r.LastKnockCause > 0 {
				return r, true
			}
		}
		return audit.FleetRow{}, false
	})
	if !slices.Contains(row.Attention, "source") || len(row.Sources) != 1 || row.Sources[0].State != audit.Untrusted ||
		!strings.Contains(row.Sources[0].Why, key) || row.Sources[0].Signer != key {
		t.Errorf("fleet -o json: ace's row %+v; want its one source problem untrusted, naming %s", row, key)
	}
	if code := stop(); code != 0 {
		t.Fatalf("provision exited %d:\n%s", code, logs.String())
	}

	// Restarted with the right trust: it deletes the record on start,
	// takes the next poke's knock, and nothing says untrusted.
	stop, logs = provision(trust)
	logs.waitText(testCtx(t), t, "provision", "plans and knocks trusted again")
	out, errOut, code = m.cli(t, "poke", "ace", "--by", "alice", "--wait", "1m")
	if code != 0 || !strings.Contains(errOut, "poke ace: its provisioner took knock #") || strings.Contains(errOut, "warning") {
		t.Errorf("poke with the right trust: exit %d %q %q", code, out, errOut)
	}
	for _, verb := range [][]string{{"state", "ace"}, {"fleet"}} {
		if out, errOut, code := m.cli(t, verb...); code != 0 || strings.Contains(out, "untrusted") {
			t.Errorf("%s with the right trust: exit %d:\n%s%s", verb[0], code, out, errOut)
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("provision exited %d:\n%s", code, logs.String())
	}
}
