package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// A fresh user's finding: a provisioner client killed with kill -9 went
// unnoticed. fleet and state kept showing the "no file" it had last
// reported after the file existed, and nobody was told that no
// provisioner answered knocks. Now `meshfold provision` holds the node's
// provisioner lease and the reconciler records its end: killed by pid
// with SIGKILL, fleet -o json says provisioner-down within two lease
// TTLs (and the status it left is stale), fleet and state say "no
// provisioner answered since"; a second provisioner of the node is
// refused while the first lives; a restarted one fills the file and
// answers the knock that waited, with no poke.
func TestProvisionerKilledIsSeen(t *testing.T) {
	// Not parallel: it times the down report against the lease TTL.
	if testing.Short() {
		t.Skip("kills processes: not in -short")
	}
	m := startMesh(t)
	trust := m.serveSigned(t)
	dir := t.TempDir()
	root, secrets := filepath.Join(dir, "root"), filepath.Join(dir, "secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	startMeshfold(t, "node", "ace", "--runtime", "record", "--root", root, "--state-dir", filepath.Join(dir, "state"),
		"-s", m.e.ClientURL(), "--trust", trust)
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: exit %d %s", code, errOut)
	}
	provision := func() *meshfoldProcess {
		return startMeshfold(t, "provision", "ace", "--from", secrets, "--account", "prov", "--trust", trust,
			"-s", m.e.ClientURL(), "--log-level", "info")
	}
	row := func(what string, want func(audit.FleetRow) bool) audit.FleetRow {
		t.Helper()
		return waitfor.Value(t, time.Minute, what, func() (audit.FleetRow, bool) {
			out, _, code := m.cli(t, "fleet", "-o", "json", "--warnings", "0")
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var r audit.FleetRow
				if code == 0 && json.Unmarshal([]byte(line), &r) == nil && r.Node == "ace" && want(r) {
					return r, true
				}
			}
			return audit.FleetRow{}, false
		})
	}
	const path = "/run/mesh-build-go/broker.creds"
	first := provision()
	row("fleet: the missing file reported by a live provisioner", func(r audit.FleetRow) bool {
		return r.ProvisionerDown == nil && len(r.Sources) == 1 && r.Sources[0].State == "missing" && !r.Sources[0].Stale
	})

	// One provisioner speaks for a node.
	second := provision()
	if code := second.wait(t, testCtx(t)); code != exitError {
		t.Fatalf("a second provisioner exited %d, want %d:\n%s", code, exitError, second.stderr.String())
	}
	if msg := second.stderr.String(); !strings.Contains(msg, "provisioner ace is held by another live process") ||
		!strings.Contains(msg, "pid "+strconv.Itoa(first.cmd.Process.Pid)) {
		t.Errorf("the second provisioner's error does not name the first:\n%s", msg)
	}

	if err := first.cmd.Process.Kill(); err != nil { // SIGKILL, by pid
		t.Fatal(err)
	}
	killed := time.Now()
	<-first.done
	file := filepath.Join(secrets, "mesh-build-go", path)
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("broker credential"), 0o600); err != nil {
		t.Fatal(err)
	}
	down := row("fleet: ace's provisioner down", func(r audit.FleetRow) bool {
		return r.ProvisionerDown != nil && slices.Contains(r.Attention, "provisioner-down")
	})
	took := time.Since(killed)
	t.Logf("kill -9 of the provisioner → provisioner-down in fleet -o json: %s (lease TTL %s)", took.Round(time.Millisecond), store.DefaultNodeLeaseTTL)
	if took > 2*store.DefaultNodeLeaseTTL+5*time.Second {
		t.Errorf("provisioner-down took %s after the kill, want within two lease TTLs (%s) and the snapshot's lag", took, 2*store.DefaultNodeLeaseTTL)
	}
	if d := down.ProvisionerDown; d.Why != events.WhyExpired || d.PID != first.cmd.Process.Pid {
		t.Errorf("the down says %+v, want expired, pid %d", d, first.cmd.Process.Pid)
	}
	if len(down.Sources) != 1 || !down.Sources[0].Stale {
		t.Errorf("the gone provisioner's report is not marked stale: %+v", down.Sources)
	}
	flat := func(s string) string { return strings.Join(strings.Fields(s), " ") } // lines wrap at 100 columns
	if out, errOut, code := m.cli(t, "fleet"); code != 0 || !strings.Contains(flat(out), "ace no provisioner answered since") ||
		!strings.Contains(out, "provisioner-down") || !strings.Contains(flat(out), "(as its provisioner, now down, last saw it)") {
		t.Errorf("fleet: exit %d:\n%s%s", code, out, errOut)
	}
	if out, errOut, code := m.cli(t, "state", "ace"); code != 0 || !strings.Contains(flat(out), "prov DOWN since") ||
		!strings.Contains(flat(out), "no knock is answered") {
		t.Errorf("state: exit %d:\n%s%s", code, out, errOut)
	}
	// A knock while nobody answers it: it waits for the next provisioner.
	if _, errOut, code := m.cli(t, "poke", "ace", "--by", "alice", "--wait", "0"); code != 0 {
		t.Fatalf("poke: exit %d %s", code, errOut)
	}
	poked := row("fleet: the poke's knock", func(r audit.FleetRow) bool { return r.LastKnockCause > 0 })

	provision()
	row("fleet: ace's provisioner up, its file filled and the knock answered", func(r audit.FleetRow) bool {
		return r.ProvisionerDown == nil && len(r.Sources) == 0 && r.LastKnockCause >= poked.LastKnockCause && len(r.Attention) == 0
	})
	if got, err := os.ReadFile(filepath.Join(root, path)); err != nil || string(got) != "broker credential" {
		t.Errorf("the restarted provisioner did not fill %s: %v", path, err)
	}
	out, errs, code := m.cli(t, "audit", "ace")
	if code != 0 {
		t.Fatalf("audit: %d %s", code, errs)
	}
	var provLines []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[2] == string(events.KindProv) {
			provLines = append(provLines, l)
		}
	}
	if len(provLines) != 3 || !strings.Contains(provLines[0], "up: lease claimed") ||
		!strings.Contains(provLines[1], "DOWN: lease expired") || !strings.Contains(provLines[2], "up: lease claimed") {
		t.Errorf("audit's prov lines: want up, down (expired), up:\n%s", strings.Join(provLines, "\n"))
	}
}
