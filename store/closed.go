package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrConnClosed: a NATS connection closed for good (its user revoked or
// expired, a server that refused it again after a reconnect). nats.go
// will not reconnect it, so a long-running role stops with this error and
// its service manager starts it again.
var ErrConnClosed = errors.New("NATS connection closed for good")

// WhileConnected runs run with a context that ends when ctx does or when
// nc closes for good, whichever is first, and returns run's error; when
// nc closed for good, it returns [ErrConnClosed] wrapping the
// connection's last error instead, whatever run returned. It chains nc's
// closed handler (the one set before is still called).
//
// When run fails while nc is reconnecting, the failure may be the lost
// connection's (a request unanswered across a revoked user's disconnect)
// and nc's close for good still to come: nats.go gives a refused user up
// only after its second refused reconnect, seconds later. WhileConnected
// then waits for nc to reconnect or close, at most [closeWait], and a
// close is reported as such, not as the request's "context deadline
// exceeded" (a revoked `reconcile --group` said "watch lease bucket:
// context deadline exceeded" under load).
func WhileConnected(ctx context.Context, nc *nats.Conn, run func(context.Context) error) error {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(context.Canceled)
	closed := func(c *nats.Conn) { cancel(closedErr(c)) }
	prev := nc.ClosedHandler()
	nc.SetClosedHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		closed(c)
	})
	if nc.IsClosed() { // closed before the handler was in place
		closed(nc)
	}
	err := run(ctx)
	// nats.go marks a connection closed before it runs the closed
	// handler, so run may return (a consumer failing on the closed
	// connection) before the handler has ended ctx: nc is asked too.
	if cerr := context.Cause(ctx); ctx.Err() != nil && errors.Is(cerr, ErrConnClosed) {
		return cerr
	}
	if err != nil && parent.Err() == nil {
		awaitFate(parent, nc, closeWait)
	}
	if nc.IsClosed() {
		return closedErr(nc)
	}
	return err
}

// closeWait bounds how long a failed run waits for its reconnecting
// connection's fate (WhileConnected): nats.go closes a connection after
// the same auth error refused it twice, a reconnect wait (2 s and up to
// 2 s of jitter) apart, each attempt within connectTimeout.
const closeWait = 2*(reconnectWait+reconnectJitterTLS) + connectTimeout

// awaitFate waits, while nc is disconnected or reconnecting, until it is
// connected again or closed, d passes or ctx ends.
func awaitFate(ctx context.Context, nc *nats.Conn, d time.Duration) {
	ch := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(ch)
	if st := nc.Status(); st != nats.RECONNECTING && st != nats.DISCONNECTED {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// closedErr is ErrConnClosed with c's last error, if any.
func closedErr(c *nats.Conn) error {
	err := c.LastError()
	switch {
	case err == nil:
		return ErrConnClosed
	case authRefused(err):
		// The server's words alone ("nats: Authorization Violation")
		// are not those 'auth revoke' is documented with (a fresh user's
		// finding V10): say what they mean for the process.
		return fmt.Errorf("%w: its credentials were revoked or are not accepted (%w)", ErrConnClosed, err)
	}
	return fmt.Errorf("%w: %w", ErrConnClosed, err)
}

// authRefused reports whether err is the server refusing the
// connection's user: an authorization violation (what a revoked user's
// reconnect gets), its authentication revoked or expired.
func authRefused(err error) bool {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAuthExpired) {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "authorization violation") || strings.Contains(msg, "authentication revoked") ||
		strings.Contains(msg, "authentication expired")
}
