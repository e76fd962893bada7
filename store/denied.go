package store

import (
	"context"
	"errors"
	"regexp"
	"sync"

	"github.com/nats-io/nats.go"
)

// A publish the server's permissions deny is dropped and reported to the
// connection asynchronously (its error handler, "Permissions Violation for
// Publish to ..."); a JetStream publish waits for an acknowledgement that
// will never come, until its timeout. denials hands those reports to the
// publishes waiting on their subject, so that [Publisher.Append] fails at
// once with the permission error.
type denials struct {
	mu      sync.Mutex
	waiters map[string]map[chan error]struct{}
}

// denialsOf holds the denials of every open connection a Publisher or a
// guard uses, installed once per connection in front of its own error
// handler. An entry is deleted when its connection closes (its closed
// handler, chained in front of the connection's own), and, should that
// handler have been replaced since, by the next install's sweep: the map
// holds the open connections, never every connection a long-running
// process ever made (each entry keeps its *nats.Conn reachable).
var denialsOf sync.Map // *nats.Conn → *denials

var deniedPublish = regexp.MustCompile(`Publish to "([^"]+)"`)

// watchDenials returns nc's denials, installing them on first use. A
// closed nc's are not kept (nothing is published on it any more).
func watchDenials(nc *nats.Conn) *denials {
	if nc == nil {
		return nil
	}
	if d, ok := denialsOf.Load(nc); ok {
		return d.(*denials)
	}
	d := &denials{waiters: map[string]map[chan error]struct{}{}}
	if nc.IsClosed() {
		return d
	}
	sweepDenials()
	if old, loaded := denialsOf.LoadOrStore(nc, d); loaded {
		return old.(*denials)
	}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		d.note(err)
		if prev != nil {
			prev(c, sub, err)
		}
	})
	prevClosed := nc.ClosedHandler()
	nc.SetClosedHandler(func(c *nats.Conn) {
		denialsOf.CompareAndDelete(c, d)
		if prevClosed != nil {
			prevClosed(c)
		}
	})
	if nc.IsClosed() {
		// Closed while the handler was set: it may not run.
		denialsOf.CompareAndDelete(nc, d)
	}
	return d
}

// sweepDenials deletes the entries of connections that are closed: those
// whose closed handler (watchDenials) was replaced after it was set.
func sweepDenials() {
	denialsOf.Range(func(k, v any) bool {
		if k.(*nats.Conn).IsClosed() {
			denialsOf.CompareAndDelete(k, v)
		}
		return true
	})
}

// note passes a publish permission violation to the waiters of its
// subject.
func (d *denials) note(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := deniedPublish.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for ch := range d.waiters[m[1]] {
		select {
		case ch <- err:
		default:
		}
	}
}

// GuardDenied returns a context that is cancelled with the server's
// permission error (matching nats.ErrPermissionViolation, see
// context.Cause) as soon as a publish of nc to subject is denied, and
// its release: a JetStream request on subject (a key-value put on
// "$KV.<bucket>.<key>") then fails at once with the denial, not at its
// timeout with nothing said of why.
func GuardDenied(ctx context.Context, nc *nats.Conn, subject string) (context.Context, func()) {
	return watchDenials(nc).guard(ctx, subject)
}

// guard returns a context that is cancelled with the permission error
// when a publish to subject is denied, and its release.
func (d *denials) guard(ctx context.Context, subject string) (context.Context, func()) {
	if d == nil {
		return ctx, func() {}
	}
	ch := make(chan error, 1)
	d.mu.Lock()
	if d.waiters[subject] == nil {
		d.waiters[subject] = map[chan error]struct{}{}
	}
	d.waiters[subject][ch] = struct{}{}
	d.mu.Unlock()
	gctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case err := <-ch:
			cancel(err)
		case <-done:
		}
	}()
	return gctx, func() {
		close(done)
		cancel(nil)
		d.mu.Lock()
		delete(d.waiters[subject], ch)
		if len(d.waiters[subject]) == 0 {
			delete(d.waiters, subject)
		}
		d.mu.Unlock()
	}
}
