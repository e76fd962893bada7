package node

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

// claimOf is the claim a's lease holds.
func claimOf(a *agentT) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.claimed
}

// An agent restarted after its node's /run was emptied (a reboot), its
// modules running on, reports the declared file gone at its first look
// at once, marked gone at its start and naming its claim: nothing else
// makes a have then (its check is off here, and its first have went out
// before its plan settled). Every filled names the claim of the agent
// that wrote it.
func TestHaveReportsFilesGoneAtStart(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	rt, err := NewDirRuntime(filepath.Join(dir, "records"))
	if err != nil {
		t.Fatal(err)
	}
	noCheck := func(c *Config) { c.CheckFiles = -1 }
	const path = "/run/app/token"
	app := events.PlanModule{Name: "app", Build: "a:1", RunsAs: "ua", Files: []events.File{{Path: path, Mode: "0600"}}}

	a1 := e.startAgentIn(t, "ace", root, state, rt, noCheck)
	p := e.publishPlan(t, "ace", "prov", app)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
	if r, _ := e.fill(t, "ace", "app", path, "prov", []byte(secret)); !r.OK {
		t.Fatalf("fill: %+v", r)
	}
	f1 := e.waitEvent(t, "ace", events.KindFilled, func(store.Msg) bool { return true })
	if got, want := f1.Event.Payload.(*events.Filled).Claim, claimOf(a1); got == "" || got != want {
		t.Fatalf("the filled names the claim %q, the agent holds %q", got, want)
	}

	a1.stop()
	if err := os.RemoveAll(filepath.Join(root, "run")); err != nil {
		t.Fatal(err)
	}
	last := f1.Event.Seq
	a2 := e.startAgentIn(t, "ace", root, state, rt, noCheck)
	// The first agent's own start report (the file not filled yet at its
	// first settle) may be stored after the fill on a loaded machine:
	// the new agent's is the one naming another claim.
	old := claimOf(a1)
	h := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
		h := m.Event.Payload.(*events.Have)
		return m.Event.Seq > last && len(h.Missing) > 0 && h.Started != old
	}).Event.Payload.(*events.Have)
	if want := []events.MissingFile{{Module: "app", Path: path, AtStart: true}}; !slices.Equal(h.Missing, want) {
		t.Fatalf("the new agent's have reports %+v, want %+v", h.Missing, want)
	}
	if h.Started == "" || h.Started != claimOf(a2) {
		t.Fatalf("the have names the claim %q, the new agent holds %q", h.Started, claimOf(a2))
	}
	if r, _ := e.fill(t, "ace", "app", path, "prov", []byte(secret)); !r.OK {
		t.Fatalf("refill: %+v", r)
	}
	f2 := e.waitEvent(t, "ace", events.KindFilled, func(m store.Msg) bool { return m.Event.Seq > last })
	if got := f2.Event.Payload.(*events.Filled).Claim; got != claimOf(a2) {
		t.Fatalf("the refill names the claim %q, the new agent holds %q", got, claimOf(a2))
	}
	// Once the have that reported it is stored (the agent learns so from
	// its ack, a moment after the stream stores it), it is reported no
	// more.
	waitfor.Until(t, wait, "the agent reporting nothing missing after the refill", func() bool { return len(a2.missingFiles(nil)) == 0 })
}
