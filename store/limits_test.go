package store_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// largest builds the largest state DESIGN.md §10's limits allow, by
// folding a history that fills every record to its bound with values of
// the greatest length: a plan of MaxModules rows of MaxFilesPerModule
// files (half held, carrying the files of what runs, half composed), four
// such plans unsettled and MaxDroppedPlans dropped, the accepting and
// filled records, the owed items, the last knock, the approvals, the
// waivers, the gates and the have all at their bounds. It returns the state and the
// largest plan it emitted.
func largest(t *testing.T) (*reconcile.State, *events.Plan) {
	t.Helper()
	st := reconcile.NewState("ace")
	var seq uint64
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var biggest *events.Plan
	var biggestLen int
	var fold func(p events.Payload) uint64
	fold = func(p events.Payload) uint64 {
		seq++
		if events.HeaderOf(p).V == 0 {
			events.Stamp(p, at)
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("event %d (%s) is not valid: %v", seq, p.Kind(), err)
		}
		self := seq
		if w, ok := p.(*events.Want); ok {
			if b, _ := events.Encode(w); len(b) > largestWant {
				largestWant = len(b)
			}
		}
		for _, e := range st.Fold(events.Event{Seq: seq, Node: "ace", Kind: p.Kind(), Payload: p, Time: at}) {
			if err := e.Payload.Validate(); err != nil {
				t.Fatalf("effect %s is not valid: %v", e.ID(), err)
			}
			if pl, ok := e.Payload.(*events.Plan); ok {
				if b, _ := events.Encode(pl); len(b) > biggestLen {
					biggest, biggestLen = pl, len(b)
				}
				fold(pl) // the reconciler reads its own plans
			}
		}
		if err := st.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		return self
	}
	pad := func(s string, n int) string { return s + strings.Repeat("x", n-len(s)) }
	name := func(i int) string { return pad(fmt.Sprintf("m%02d-", i), events.MaxName) }
	build := func(gen, i int) string { return pad(fmt.Sprintf("sha256:%d-%02d-", gen, i), events.MaxBuild) }
	account := func(i int) string { return pad(fmt.Sprintf("u%02d", i), events.MaxAccount) }
	path := func(gen, i, j int) string { return pad(fmt.Sprintf("/g%d/m%02d/f%d/", gen, i, j), events.MaxPath) }
	files := func(gen, i int) []events.File {
		var fs []events.File
		for j := range events.MaxFilesPerModule {
			fs = append(fs, events.File{Path: path(gen, i, j), Mode: "0600"})
		}
		return fs
	}
	half := events.MaxModules / 2
	if half*events.MaxFilesPerModule > events.MaxFilesPerWant {
		t.Fatalf("half the modules with all their files exceed MaxFilesPerWant: adjust this builder")
	}
	// want makes modules [0, half) composed with files of generation
	// gen, the others requiring an approval nobody gave (held) unless
	// composed is true for them as well.
	want := func(gen int, heldLow bool) *events.Want {
		w := &events.Want{Modules: []events.WantModule{}}
		for i := range events.MaxModules {
			m := events.WantModule{Name: name(i), Build: build(gen, i), RunsAs: account(i), Provisioner: i == 0}
			low := i < half
			switch {
			case low && heldLow, !low && !heldLow:
				m.RequiresApproval = true
			default:
				m.Files = files(gen, i)
			}
			w.Modules = append(w.Modules, m)
		}
		return w
	}
	settle := func(plan uint64) { fold(&events.Settle{Module: name(1), Op: events.OpApply, Plan: plan}) }
	// Generation 0: the low half composed with its files. Before it
	// settles, every one of its files is refused (no account yet): its
	// settle knocks them all at once, the largest knock.
	fold(want(0, false))
	for i := range reconcile.MaxOwed {
		m, j := i/events.MaxFilesPerModule, i%events.MaxFilesPerModule
		fold(&events.Refusal{Module: name(m), Path: path(0, m, j), Reason: events.ReasonNoAccount, Plan: 0, Writer: account(0)})
	}
	settle(st.NewestPlan)
	if st.LastKnock == nil || len(st.LastKnock.Owed) != reconcile.MaxOwed {
		t.Fatalf("the knock at the first settle does not carry %d items: %+v", reconcile.MaxOwed, st.LastKnock)
	}
	// Generation 1: the low half held (carrying its files), the high half
	// composed with theirs: every row has MaxFilesPerModule files. The
	// high half's gates, set by generation 0's want, an operator lifts
	// (a want without the flag does not).
	for i := half; i < events.MaxModules; i++ {
		fold(&events.Gate{Module: name(i), Lift: true, By: "ops"})
	}
	fold(want(1, true))
	settle(st.NewestPlan)
	// Four more such plans, never settled, and as many again as the
	// dropped plans' sequences keep, and one: each drops a plan read (the
	// second oldest) past MaxUnsettled, whose sequence State.Dropped keeps.
	for gen := 2; gen < 2+reconcile.MaxUnsettled+reconcile.MaxDroppedPlans+1; gen++ {
		fold(want(gen, true))
	}
	// The have, at its bound, every runtime field at its longest (DESIGN.md
	// §8, §11: an exit of MaxExit bytes, a since, the longest health).
	h := &events.Have{}
	since := time.Date(2026, 1, 2, 3, 4, 5, 123_000_000, time.UTC)
	for i := range events.MaxHaveModules {
		h.Modules = append(h.Modules, events.HaveModule{Name: pad(fmt.Sprintf("h%02d-", i), events.MaxName), Build: build(9, i),
			State: events.Running, Account: account(i), Restarts: 1 << 30, FillRestarts: 1 << 30, Exit: strings.Repeat("x", events.MaxExit),
			Since: &since, Health: events.Unhealthy})
	}
	fold(h)
	// Each module crashed after running reconcile.FlapRestarts times (the
	// crash records at their bound), and the agent down at its longest.
	for range reconcile.FlapRestarts {
		for i := range h.Modules {
			h.Modules[i].Restarts++
		}
		fold(&events.Have{Modules: slices.Clone(h.Modules)})
	}
	fold(&events.Agent{State: events.AgentDown, Claim: strings.Repeat("c", events.MaxClaim), Host: strings.Repeat("h", events.MaxHost),
		PID: 1 << 30, Why: events.WhyReplaced})
	// The provisioner's record too (one, as the agent's).
	fold(&events.Prov{Agent: events.Agent{State: events.AgentDown, Claim: strings.Repeat("c", events.MaxClaim), Host: strings.Repeat("h", events.MaxHost),
		PID: 1 << 30, Why: events.WhyReplaced}})
	// The ack, its by at its longest (one record, whatever the count).
	fold(&events.Ack{By: pad("ack-", events.MaxBy)})
	// Approvals at their bound.
	for i := range reconcile.MaxApprovals {
		fold(&events.Approve{Module: name(i % events.MaxModules), Build: build(100+i, i), By: pad(fmt.Sprintf("op%d-", i), events.MaxBy)})
	}
	// Filled marks at their bound, of files the unsettled plans of
	// generations 2 and 3 declare (any file's mark counts alike: a mark
	// is dropped only past the cap, docs/design.md §4, "The caps").
	for gen := 2; gen < 4; gen++ {
		for i := half; i < events.MaxModules; i++ {
			for j := range events.MaxFilesPerModule {
				fold(&events.Filled{Module: name(i), Path: path(gen, i, j), Plan: st.Settled.Seq, Digest: strings.Repeat("d", events.MaxDigest)})
			}
		}
	}
	if 2*(events.MaxModules-half)*events.MaxFilesPerModule != reconcile.MaxFilled {
		t.Fatalf("the filled marks do not reach MaxFilled: adjust this builder")
	}
	// Failed applies at their bound, each error at its longest once
	// encoded ("<" is six bytes in JSON); owed items' errors likewise below.
	for i := range reconcile.MaxFailed + 5 {
		m := pad(fmt.Sprintf("f%02d-", i), events.MaxName)
		if i == 0 {
			m = "" // the whole plan refused
		}
		fold(&events.Settle{Module: m, Op: events.OpFailed, Plan: st.NewestPlan, Error: strings.Repeat("<", events.MaxText)})
	}
	// Owed items at their bound, never due: paths no plan declares.
	for i := range reconcile.MaxOwed + 10 {
		fold(&events.Refusal{Module: name(i % events.MaxModules), Path: path(8, i, i), Reason: events.ReasonUndeclared,
			Plan: st.Settled.Seq, Writer: pad(fmt.Sprintf("v%03d", i), events.MaxAccount), Error: strings.Repeat("<", events.MaxText)})
	}
	// A pause, its by and reason at their longest (one record, whatever
	// the count of pauses).
	fold(&events.Pause{By: pad("pause-", events.MaxBy), Reason: strings.Repeat("<", events.MaxText)})
	// Waivers at their bound, of files nothing owes (a waive pays its
	// file's items).
	for i := range reconcile.MaxWaivers + 5 {
		fold(&events.Waive{Module: name(i % events.MaxModules), Path: path(9, i, i), By: pad(fmt.Sprintf("w%d-", i), events.MaxBy)})
	}
	// Gates at their bound, each an operator's with its by at its
	// longest (a want's gate keeps no by); the ones past it mark the
	// gates full, naming as many modules not kept as it keeps, the
	// first one's by with them (State.GatesFull).
	for i := range reconcile.MaxGates + events.MaxModules + 5 {
		fold(&events.Gate{Module: pad(fmt.Sprintf("g%03d-", i), events.MaxName), By: pad(fmt.Sprintf("g%d-", i), events.MaxBy)})
	}
	switch {
	case len(st.Gates) != reconcile.MaxGates || st.GatesFull == nil || len(st.GatesFull.Modules) != events.MaxModules:
		t.Fatalf("%d gates, want %d; gates full %+v", len(st.Gates), reconcile.MaxGates, st.GatesFull)
	case len(st.Waivers) != reconcile.MaxWaivers || st.Paused == nil:
		t.Fatalf("%d waivers, want %d; paused %v", len(st.Waivers), reconcile.MaxWaivers, st.Paused)
	case len(st.Unsettled) != reconcile.MaxUnsettled || len(st.Dropped) != reconcile.MaxDroppedPlans:
		t.Fatalf("%d unsettled plans, %d dropped ones, want %d and %d", len(st.Unsettled), len(st.Dropped), reconcile.MaxUnsettled, reconcile.MaxDroppedPlans)
	case len(st.Accepting) != reconcile.MaxAccepting:
		t.Fatalf("%d accepting records, want %d", len(st.Accepting), reconcile.MaxAccepting)
	case len(st.Filled) != reconcile.MaxFilled:
		t.Fatalf("%d filled marks, want %d", len(st.Filled), reconcile.MaxFilled)
	case len(st.Owed) != reconcile.MaxOwed:
		t.Fatalf("%d owed items, want %d", len(st.Owed), reconcile.MaxOwed)
	case len(st.Approvals) != reconcile.MaxApprovals:
		t.Fatalf("%d approvals, want %d", len(st.Approvals), reconcile.MaxApprovals)
	case len(st.Failed) != reconcile.MaxFailed:
		t.Fatalf("%d failed applies, want %d", len(st.Failed), reconcile.MaxFailed)
	case len(st.Crashes) != events.MaxHaveModules || len(st.Crashes[0].Times) != reconcile.FlapRestarts:
		t.Fatalf("%d modules' crash records, want %d of %d", len(st.Crashes), events.MaxHaveModules, reconcile.FlapRestarts)
	case len(st.Have.HealthSince) != events.MaxHaveModules || st.Agent == nil || st.Ack == nil || st.Provisioner == nil:
		t.Fatalf("health since of %d modules, agent %v, ack %v, provisioner %v", len(st.Have.HealthSince), st.Agent, st.Ack, st.Provisioner)
	}
	for _, p := range st.Unsettled {
		if n := countFiles(p.Modules); n != events.MaxModules*events.MaxFilesPerModule {
			t.Fatalf("unsettled plan %d declares %d files, want %d", p.Seq, n, events.MaxModules*events.MaxFilesPerModule)
		}
	}
	return st, biggest
}

// largestWant is the encoded size of the largest want largest folded.
var largestWant int

func countFiles(rows []events.PlanModule) int {
	n := 0
	for _, r := range rows {
		n += len(r.Files)
	}
	return n
}

// TestLargestFits is DESIGN.md §10: the largest valid want's plan and the
// largest valid state's snapshot are published under the server's
// default max_payload, with room to spare: the plan under an eighth of
// it, the snapshot under three quarters (the rest is for fields a newer
// schema adds).
func TestLargestFits(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	st, plan := largest(t)
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	max := nc.MaxPayload()
	if max != 1<<20 {
		t.Fatalf("the test server's max_payload is %d, not the default 1 MiB", max)
	}
	planBytes, err := events.Encode(plan)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("largest want: %d bytes; largest plan: %d bytes (%d rows, %d files); largest state's snapshot: %d bytes; max_payload %d",
		largestWant, len(planBytes), len(plan.Modules), countFiles(plan.Modules), len(snap), max)
	if int64(len(planBytes)) > max/8 || int64(len(snap)) > max*3/4 {
		t.Fatalf("plan %d bytes, snapshot %d bytes: too close to max_payload %d", len(planBytes), len(snap), max)
	}
	if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, "ace", plan); err != nil {
		t.Fatalf("publish the largest plan: %v", err)
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := snaps.PutNode(ctx, events.Partition("ace", cfg.Partitions), "ace", snap); err != nil {
		t.Fatalf("put the largest snapshot: %v", err)
	}
	if _, err := reconcile.UnmarshalState(snap); err != nil {
		t.Fatalf("the largest snapshot does not load: %v", err)
	}
}
