package main

import (
	"context"
	"fmt"
	"time"

	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
)

// stateKnows returns node's view and true when the reconciler's state
// holds it (query.Reader.State: live, else the stored snapshot): asked
// by the verbs' existence checks when the stream holds no event (or no
// want) of node. With serve --max-age a quiet node's events age out of
// the stream while the reconciler's state keeps it, and `fleet` and
// `state` list it: such a node is no mistyped name (a fresh user's
// finding U28). Any error reads as unknown: the check then refuses as it
// did.
func stateKnows(ctx context.Context, r *query.Reader, node string) (reconcile.View, bool) {
	st, err := r.State(ctx, node)
	if err != nil {
		return reconcile.View{}, false
	}
	return st.View, true
}

// agedOutText says that node's history aged out of the stream, where the
// stream begins, and what the reconciler's state holds of it (v).
func agedOutText(ctx context.Context, r *query.Reader, node string, v reconcile.View) string {
	where := "the stream holds no event of it"
	if first, at, err := r.StreamBegins(ctx); err == nil && first > 1 {
		when := "it holds no event now"
		if !at.IsZero() {
			when = at.UTC().Format(time.RFC3339)
		}
		where = fmt.Sprintf("%s's history before #%d is gone (--max-age): the stream begins at #%d (%s)", node, first, first, when)
	}
	return fmt.Sprintf("%s; the reconciler's state holds it (want #%d, plan last emitted #%d, last settled #%d): 'meshfold state %s' shows it",
		where, v.Want, v.EmittedPlan, v.SettledPlan, node)
}
