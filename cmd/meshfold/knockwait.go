package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// awaitKnockAnswers waits, at most wait, for the provisioner of each node
// of pokes (node → its poke's stream sequence) to take the knock the poke
// brings: its answer (store.KnockAnswer, in the fill status bucket) names
// a knock caused by the poke or later. It says on stderr, for each node,
// that its provisioner took it, or, after the wait, that none answered
// and what to check: a provisioner that is not running, one that runs
// and refuses the node's plans and knocks for their signer (its record,
// store.GetTrustStatus: the key, and what to do), or, when no knock
// answers the poke at all, a reconciler that is not. It never fails the
// command: the poke is stored either way, and a provisioner started later
// fills everything on start.
func (a *app) awaitKnockAnswers(ctx context.Context, pokes map[string]uint64, wait time.Duration) {
	start := time.Now()
	nc, err := a.conn.connect("meshfold-poke-wait", a)
	if err != nil {
		fmt.Fprintf(a.stderr, "note: whether the provisioners took the knocks could not be read: %v\n", err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		fmt.Fprintf(a.stderr, "note: whether the provisioners took the knocks could not be read: %v\n", err)
		return
	}
	// A node with no file to fill needs no provisioner: said at once,
	// not after the wait (a fresh user's finding: poke waited 5 s to say
	// so).
	pokes = maps.Clone(pokes)
	r, rerr := a.stream.reader(nc, query.Config{})
	held := func(ctx context.Context, node string) bool {
		if rerr != nil {
			return false
		}
		v, ok := a.stateKnows(ctx, r, node)
		return ok && v.Files > 0
	}
	for _, n := range slices.Sorted(maps.Keys(pokes)) {
		if files, err := declaresFiles(ctx, stream, scfg.Subjects(), n, held); err == nil && !files {
			fmt.Fprintf(a.stderr, "poke %s: no provisioner is needed: neither its newest plan nor its newest want declares a file to fill (the poke is stored)\n", n)
			delete(pokes, n)
		}
	}
	if len(pokes) == 0 {
		return
	}
	// A provisioner recorded down answers no knock until one starts
	// again: said at once, not after the wait (provisioner-down,
	// reconcile.View.ProvisionerDown, as fleet and state apply it).
	a.sayProvisionersDown(ctx, nc, pokes, start.Add(wait))
	if len(pokes) == 0 {
		return
	}
	answers := map[string]store.KnockAnswer{}
	took := map[string]time.Duration{}
	kv, err := store.OpenFillStatus(ctx, js, scfg, false)
	if err == nil {
		filter := "*.provisioner"
		if len(pokes) == 1 {
			for n := range pokes {
				filter = store.KnockAnswerKey(n)
			}
		}
		a.watchAnswers(ctx, kv, filter, pokes, answers, took, start, wait)
	} else if errors.Is(err, jetstream.ErrBucketNotFound) {
		// No bucket: no provisioner (nor reconciler) ever ran against
		// this stream; nothing to wait for.
		fmt.Fprintf(a.stderr, "warning: no provisioner has ever run against stream %s (it has no bucket %s): is `meshfold provision NODE …` running for each node poked?\n",
			scfg.Name, scfg.Name+store.FillStatusBucketSuffix)
		return
	} else {
		fmt.Fprintf(a.stderr, "note: whether the provisioners took the knocks could not be read: %v\n", err)
		return
	}
	nodes := make([]string, 0, len(pokes))
	for n := range pokes {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	missing := sayKnocksTaken(a.stderr, nodes, answers, took)
	const show = 10
	for i, n := range missing {
		if i == show {
			fmt.Fprintf(a.stderr, "warning: … and %d more nodes whose provisioner did not answer ('meshfold fleet' lists them: NEEDS source)\n", len(missing)-show)
			break
		}
		m, err := store.LastMsg(ctx, stream, scfg.Subjects(), n, events.KindKnock)
		k, _ := m.Event.Payload.(*events.Knock)
		if (err != nil && !errors.Is(err, store.ErrNoMessage)) || (err == nil && k == nil) {
			fmt.Fprintf(a.stderr, "warning: poke %s: no provisioner answered within %s, and the newest knock could not be read: %v\n", n, wait, err)
			continue
		}
		if k == nil || k.Cause < pokes[n] {
			fmt.Fprintf(a.stderr, "warning: poke %s: no knock answered poke #%d within %s; is the reconciler running (`meshfold serve` or `meshfold reconcile`)? It publishes the knock the provisioner fills on\n",
				n, pokes[n], wait)
			continue
		}
		if files, err := declaresFiles(ctx, stream, scfg.Subjects(), n, held); err == nil && !files {
			// Nothing to fill since the wait began (a want without
			// files composed meanwhile): no provisioner is needed.
			fmt.Fprintf(a.stderr, "poke %s: no provisioner answered within %s; none is needed: its newest plan declares no file to fill\n", n, wait)
			continue
		}
		if st, ok, err := store.GetTrustStatus(ctx, kv, n); err == nil && ok {
			// The provisioner runs, and refuses the knock for its
			// signer: asking whether one runs would send the operator
			// the wrong way (a fresh user's finding G6).
			fmt.Fprintf(a.stderr, "warning: poke %s: no provisioner took knock #%d within %s: its provisioner refuses the node's plans and knocks (since %s ago): %s\n",
				n, m.Event.Seq, wait, audit.Age(time.Since(st.Since)), events.ErrorText(st.Why))
			continue
		}
		var ans *audit.KnockAnswer
		if got, ok := answers[n]; ok {
			ans = &audit.KnockAnswer{Knock: got.Knock, At: got.At, Account: got.Account}
		}
		// The knock is as old as the wait: KnockUnanswered words it.
		p, _ := audit.KnockUnanswered(n, m.Event.Seq, k.Cause, m.Event.Time, ans, m.Event.Time.Add(wait+time.Nanosecond), wait)
		fmt.Fprintf(a.stderr, "warning: poke %s: %s\n", n, p.Why)
	}
}

// sayKnocksTaken says, for each of nodes (sorted) whose provisioner took
// the knock of its poke, that it did, and returns the others. took is
// when the command saw each answer, after the pokes: one wait for all of
// them, in which answers stored before the watch began are all seen at
// once, so it is no node's own time (a fresh user's finding m2: 'poke
// --all' printed the same "in 487ms" for every node). One node's line says
// "within" it; several nodes' lines say none, and one line after them
// says how many were taken within the longest.
func sayKnocksTaken(w io.Writer, nodes []string, answers map[string]store.KnockAnswer, took map[string]time.Duration) (missing []string) {
	var longest time.Duration
	taken := 0
	for _, n := range nodes {
		if d, ok := took[n]; ok {
			taken++
			longest = max(longest, d)
			continue
		}
		missing = append(missing, n)
	}
	for _, n := range nodes {
		if _, ok := took[n]; !ok {
			continue
		}
		if len(nodes) == 1 {
			fmt.Fprintf(w, "poke %s: its provisioner took knock #%d within %s of the poke\n", n, answers[n].Knock, longest.Round(time.Millisecond))
			continue
		}
		fmt.Fprintf(w, "poke %s: its provisioner took knock #%d\n", n, answers[n].Knock)
	}
	if len(nodes) > 1 && taken > 0 {
		fmt.Fprintf(w, "poke: %d of %d provisioners took their knocks, all within %s of the pokes (one wait for all: no figure of each)\n",
			taken, len(nodes), longest.Round(time.Millisecond))
	}
	return missing
}

// provDownAsked is how many poked nodes' views poke asks the reconciler
// for, to tell a provisioner recorded down; the others are waited for.
const provDownAsked = 64

// sayProvisionersDown asks the reconciler for the view of each node of
// pokes (provDownAsked at most, each by until) and, for each whose
// provisioner is recorded down (reconcile.View.ProvisionerDown: its
// lease ended and its plan declares a file), says so on stderr and takes
// it out of pokes: no provisioner will take the knock until one starts
// again. A reconciler that does not answer ends the asking; its nodes
// are waited for as before.
func (a *app) sayProvisionersDown(ctx context.Context, nc *nats.Conn, pokes map[string]uint64, until time.Time) {
	r, err := a.stream.reader(nc, query.Config{Timeout: time.Second})
	if err != nil {
		return
	}
	for i, n := range slices.Sorted(maps.Keys(pokes)) {
		if i == provDownAsked || !time.Now().Before(until) {
			return
		}
		v, err := r.LiveView(ctx, n)
		if err != nil {
			return // no reconciler answers: the wait says what it can
		}
		down := v.ProvisionerDown()
		if down == nil {
			continue
		}
		how := strings.TrimPrefix(audit.ProvSummary(&events.Prov{Agent: events.Agent{State: events.AgentDown, Why: down.Why, Host: down.Host, PID: down.PID}}), "DOWN: ")
		fmt.Fprintf(a.stderr, "warning: poke %s: provisioner-down: no provisioner answered since %s (%s ago, #%d): %s; the knock waits, and no file is filled, until `meshfold provision %s …` runs again (it fills everything on start; the poke is stored)\n",
			n, audit.FormatTime(down.Time), audit.Age(time.Since(down.Time)), down.Seq, how, n)
		delete(pokes, n)
	}
}

// declaresFiles reports whether node's newest plan or newest want
// declares a file for a provisioner to fill (two direct gets): a want
// not composed yet counts, so that a poke right after it still waits.
// When the stream holds neither (both aged out: --max-age), held says,
// from the reconciler's state.
//
// Errors: the gets', other than for no message.
func declaresFiles(ctx context.Context, stream store.LastGetter, subj events.Subjects, node string, held func(ctx context.Context, node string) bool) (bool, error) {
	files, err := query.PlanDeclaresFiles(ctx, stream, subj, node)
	if err != nil || files {
		return files, err
	}
	m, err := store.LastMsg(ctx, stream, subj, node, events.KindWant)
	if errors.Is(err, store.ErrNoMessage) {
		// Neither a want nor (then) a plan in the stream: with
		// --max-age both may have aged out, while the reconciler's
		// state still holds the plan that declares the files (a fresh
		// user's finding F8: poke said no file was declared).
		if _, perr := store.LastMsg(ctx, stream, subj, node, events.KindPlan); errors.Is(perr, store.ErrNoMessage) && held != nil {
			return held(ctx, node), nil
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("node %s: newest want: %w", node, err)
	}
	w, ok := m.Event.Payload.(*events.Want)
	return ok && slices.ContainsFunc(w.Modules, func(wm events.WantModule) bool { return len(wm.Files) > 0 }), nil
}

// stillWaiting is how long poke waits for the provisioners' answers
// before it says what it waits for (an answer usually comes in
// milliseconds: no word then).
var stillWaiting = 500 * time.Millisecond

// watchAnswers reads the knock answers of filter, as they are and as
// they change, into answers until every node of pokes has one caused by
// its poke or later (took says how long after start), or wait has
// passed since start, or ctx is done.
func (a *app) watchAnswers(ctx context.Context, kv jetstream.KeyValue, filter string, pokes map[string]uint64, answers map[string]store.KnockAnswer, took map[string]time.Duration, start time.Time, wait time.Duration) {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		fmt.Fprintf(a.stderr, "note: whether the provisioners took the knocks could not be read: %v\n", err)
		return
	}
	defer w.Stop()
	deadline := time.NewTimer(time.Until(start.Add(wait)))
	defer deadline.Stop()
	notice := time.NewTimer(min(stillWaiting, wait))
	defer notice.Stop()
	for len(took) < len(pokes) {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-notice.C:
			var left []string
			for _, n := range slices.Sorted(maps.Keys(pokes)) {
				if _, ok := took[n]; !ok {
					left = append(left, n)
				}
			}
			if len(left) > 0 {
				fmt.Fprintf(a.stderr, "poke: waiting (up to %s; --wait 0 does not) for the provisioner of %s to take the knock the poke brings\n", wait, nameList(left))
			}
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue // the values stored before the watch are read
			}
			var ans store.KnockAnswer
			if json.Unmarshal(e.Value(), &ans) != nil {
				continue
			}
			poke, ok := pokes[ans.Node]
			if !ok {
				continue
			}
			answers[ans.Node] = ans
			if _, done := took[ans.Node]; !done && ans.Cause >= poke {
				took[ans.Node] = time.Since(start)
			}
		}
	}
}
