package main

import (
	"context"
	"errors"
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
// did. So does a request these credentials may not make (the controller
// role may not ask the state service, nor read the snapshot bucket:
// store/auth; the violation ends the ask, not the verb, askRefused), or
// that nothing answers: the verb goes on as it would with no state
// service, and says so once, in one line on stderr. A node unknown to
// the state is its answer, and says nothing.
func (a *app) stateKnows(ctx context.Context, r *query.Reader, node string) (reconcile.View, bool) {
	var st query.NodeState
	before, denied, err := a.askState(ctx, func(ctx context.Context) (err error) {
		st, err = r.State(ctx, node)
		return err
	})
	if before != "" {
		return reconcile.View{}, false // refused before, and said
	}
	a.deniedMu.Lock()
	said := a.askSaid
	a.askSaid = a.askSaid || err != nil && denied != ""
	a.deniedMu.Unlock()
	if err == nil {
		return st.View, true
	}
	switch {
	case ctx.Err() != nil || errors.Is(err, query.ErrUnknownNode):
	case denied != "":
		if !said {
			fmt.Fprintf(a.stderr, "meshfold: note: these credentials may not ask the reconciler's state (%s): %s is taken as a node it does not know, as with no state service\n", denied, node)
		}
	default:
		fmt.Fprintf(a.stderr, "meshfold: note: the reconciler's state did not answer for %s (%v): taken as a node it does not know\n", node, err)
	}
	return reconcile.View{}, false
}

// askState runs ask, a request to the reconciler's state service, under
// the connection's refusal watch: a permission violation meanwhile
// cancels ask's context (askRefused), ending that ask, not the verb.
// before is the subject an earlier ask's refusal named, and then ask is
// not run again; denied is the subject refused when this ask ran ("" when
// none was).
func (a *app) askState(ctx context.Context, ask func(context.Context) error) (before, denied string, err error) {
	a.deniedMu.Lock()
	before = a.askDenied
	a.deniedMu.Unlock()
	if before != "" {
		return before, "", nil
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.deniedMu.Lock()
	a.asking = cancel
	a.deniedMu.Unlock()
	err = ask(actx)
	a.deniedMu.Lock()
	a.asking = nil
	denied = a.askDenied
	a.deniedMu.Unlock()
	return "", denied, err
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
