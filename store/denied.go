package store

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A publish the server's permissions deny is dropped and reported to the
// connection asynchronously (its error handler, "Permissions Violation for
// Publish to ..."); a JetStream publish waits for an acknowledgement that
// will never come, until its timeout. denials hands those reports to the
// publishes waiting on their subject, so that [Publisher.Append] fails at
// once with the permission error.
type denials struct {
	mu sync.Mutex
	// waiters: each waiting guard's channel and which denied subjects
	// are its own.
	waiters map[chan error]func(subject string) bool
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
	d := &denials{waiters: map[chan error]func(string) bool{}}
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
	for ch, mine := range d.waiters {
		if !mine(m[1]) {
			continue
		}
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
	return watchDenials(nc).guard(ctx, subjectIs(subject))
}

// subjectIs reports a denial of subject, and of no other, as a guard's.
func subjectIs(subject string) func(string) bool {
	return func(s string) bool { return s == subject }
}

// guard returns a context that is cancelled with the permission error
// when a publish to a subject mine reports is denied, and its release.
func (d *denials) guard(ctx context.Context, mine func(subject string) bool) (context.Context, func()) {
	if d == nil {
		return ctx, func() {}
	}
	ch := make(chan error, 1)
	d.mu.Lock()
	d.waiters[ch] = mine
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
		delete(d.waiters, ch)
		d.mu.Unlock()
	}
}

// ErrPermissionDenied is what an ask made again while unanswered
// ([AskAgain], [FollowRidingOut], the bucket opens) matches with
// errors.Is when the server denied its request's subject: NATS answers
// a request the credentials may not publish with no reply at all (the
// client hears of it only through the connection's error handler), so
// without it a permissions mistake was asked again until the ask's bound
// (--timeout, else 30 s) rather than said at once. The error is a
// [*DeniedError], which also matches nats.ErrPermissionViolation.
var ErrPermissionDenied = errors.New("permission denied")

// DeniedError is a request the server denied: Subject is the subject the
// credentials may not publish to, Err the server's permission error.
type DeniedError struct {
	Subject string
	Err     error
}

func (e *DeniedError) Error() string {
	return "permission denied: these credentials may not publish to " + e.Subject + ": " + e.Err.Error()
}
func (e *DeniedError) Unwrap() error        { return e.Err }
func (e *DeniedError) Is(target error) bool { return target == ErrPermissionDenied }

// guardAsk returns a context cancelled with the permission error as soon
// as a JetStream API request of js's connection naming stream (a token
// after the "API" one: "$JS.API.CONSUMER.CREATE.<stream>.…",
// "$JS.API.STREAM.INFO.<stream>", a domain's "$JS.<domain>.API.…") is
// denied, and its release. A nil js is not guarded.
func guardAsk(ctx context.Context, js jetstream.JetStream, stream string) (context.Context, func()) {
	if js == nil || stream == "" {
		return ctx, func() {}
	}
	return watchDenials(js.Conn()).guard(ctx, func(subject string) bool {
		tokens := strings.Split(subject, ".")
		i := slices.Index(tokens, "API")
		return i >= 0 && slices.Contains(tokens[i+1:], stream)
	})
}

// Denial returns the [*DeniedError] of a context of [GuardDenied]
// (or of one derived from it) that a denial cancelled, else nil: what a
// request that failed under the guard reports instead of its
// context.Canceled.
func Denial(ctx context.Context) error { return askDenied(ctx) }

// askDenied returns the [*DeniedError] of a ctx of [guardAsk] cancelled
// by a denial, else nil.
func askDenied(ctx context.Context) error {
	cause := context.Cause(ctx)
	if cause == nil || !errors.Is(cause, nats.ErrPermissionViolation) {
		return nil
	}
	subject := ""
	if m := deniedPublish.FindStringSubmatch(cause.Error()); m != nil {
		subject = m[1]
	}
	return &DeniedError{Subject: subject, Err: cause}
}
