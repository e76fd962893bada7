package main

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
)

// storeAskTimeout bounds the ask of explainUnanswered and of fleet's
// store line: the state service answers from memory.
const storeAskTimeout = 2 * time.Second

// explainUnanswered returns err, a write or an ask the stream left
// unanswered until the command's bound, as the store's refusal when serve
// says its store takes no write: a file store that failed a write ("no
// space left on device") answers no later one, and the client had only
// "the stream did not answer within 30s (a server too busy …)" to say (a
// fresh user's finding G1). It asks serve's state service once, on a
// connection of its own (the command's is closed), within
// storeAskTimeout; any other error, or no answer, leaves err as it is.
func (a *app) explainUnanswered(ctx context.Context, err error) error {
	if !unanswered(err) || errors.Is(err, store.ErrStorageFull) {
		return err
	}
	nc, derr := a.conn.dial("meshfold-store-status", a)
	if derr != nil {
		return err
	}
	defer nc.Close()
	st, serr := query.RequestStoreStatus(context.WithoutCancel(ctx), nc, a.stream.prefix, storeAskTimeout)
	if serr != nil {
		return err
	}
	if full := st.Err(err, time.Now()); full != nil {
		return full
	}
	return err
}

// unanswered reports whether err is a wait for the stream's answer that
// ran out: the ride-outs' "did not answer within" (timeouts only, not an
// answer saying there is no leader), a request's timeout, a deadline.
func unanswered(err error) bool {
	if err == nil {
		return false
	}
	var nl *store.NoLeaderError
	if errors.As(err, &nl) {
		return !nl.NoLeader
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
