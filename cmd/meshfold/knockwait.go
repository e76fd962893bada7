package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

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
// and what to check: a provisioner that is not running, or, when no knock
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
	var missing []string
	for _, n := range nodes {
		if d, ok := took[n]; ok {
			ans := answers[n]
			fmt.Fprintf(a.stderr, "poke %s: its provisioner took knock #%d in %s\n", n, ans.Knock, d.Round(time.Millisecond))
			continue
		}
		missing = append(missing, n)
	}
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
		if files, err := query.PlanDeclaresFiles(ctx, stream, scfg.Subjects(), n); err == nil && !files {
			// Nothing to fill: no provisioner is needed (a poke knocks
			// every node all the same).
			fmt.Fprintf(a.stderr, "poke %s: no provisioner answered within %s; none is needed: its newest plan declares no file to fill\n", n, wait)
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
	for len(took) < len(pokes) {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
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
