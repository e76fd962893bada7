package store

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Resendable reports whether err, an asynchronous publish's answer or
// its send's refusal by the client, leaves the publish unanswered rather
// than refused: it may or may not be stored, and sending a copy again
// with the same message id (and expectation) is safe. [Unanswered]
// errors (disconnected, reconnecting, no responders, a 503, a timeout,
// jetstream.ErrAsyncPublishTimeout among them), the client's stall or
// reconnect-buffer refusal (jetstream.ErrTooManyStalledMsgs,
// nats.ErrReconnectBufExceeded), the server's "duplicate message id is
// in process" ([DuplicateInProcess]: the same message, sent before, is
// proposed and not yet stored) and its "cluster can not handle request"
// ([NotLeader]: the server no longer leads the stream, and stored
// nothing of it) are. The reconciler's effect publishes
// (engine's pubride) and the rollout controller's publishes ride these
// out by sending again; docs/architecture.md, "Effect publishes ride out
// the loss of the client's server".
func Resendable(err error) bool {
	return Unanswered(err) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || DuplicateInProcess(err) || NotLeader(err)
}

// errCodeNotLeader is nats-server's JSClusterNotLeaderErr (10009, a
// 500: "JetStream cluster can not handle request").
const errCodeNotLeader jetstream.ErrorCode = 10009

// NotLeader reports whether err is the server's answer that it does not
// lead the stream the publish is for (10009): it lost the leadership
// (a stepdown, an election) after the publish was routed to it. The
// server checks that before it proposes anything, so nothing of the
// publish is stored, and its copy, sent again with the same message id
// and expectation, goes to the new leader. nats-server v2.15.2 makes
// that answer but does not send it (its inbound loop drops the publish,
// which the client sees as no answer: a timeout); a server that sends
// it is answered as an unanswered publish is. docs/architecture.md, "A
// publish a deposed leader refuses is sent again".
func NotLeader(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNotLeader
}

// SendAgain decides, for the i-th of a run of asynchronous publishes in
// flight (ok and errc its answer's channels), when the oldest (i 0) went
// unanswered (timedOut: no answer within the caller's wait; else its
// answer was [Resendable]), whether to send it again. The oldest is. An
// answer arrived meanwhile is kept, returned on channels that give it
// again (a future gives it once), unless it is resendable too. One still
// awaited is sent again only when timedOut (the leader that had it is
// likely gone, and waiting for each in turn would take the caller's wait
// each); otherwise (the server's "in process", no responders for the
// oldest alone) its answer is left to come, not doubled.
func SendAgain(i int, timedOut bool, ok <-chan *jetstream.PubAck, errc <-chan error) (bool, <-chan *jetstream.PubAck, <-chan error) {
	if i == 0 {
		return true, ok, errc
	}
	select {
	case a := <-ok:
		c := make(chan *jetstream.PubAck, 1)
		c <- a
		return false, c, nil
	case err := <-errc:
		if Resendable(err) {
			return true, ok, errc
		}
		o, e := FailedSend(err)
		return false, o, e
	default:
		return timedOut, ok, errc
	}
}

// FailedSend returns the answer channels of a publish that failed at
// its send with err: the answer err, at once.
func FailedSend(err error) (<-chan *jetstream.PubAck, <-chan error) {
	errc := make(chan error, 1)
	errc <- err
	return nil, errc
}
