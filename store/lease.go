package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/meshfold/meshfold/events"
)

// Node leases.
const (
	// NodeLeaseBucketSuffix is appended to the stream name to name the
	// bucket of node agents' leases: MESH → MESH_NODES.
	NodeLeaseBucketSuffix = "_NODES"
	// DefaultNodeLeaseTTL is the TTL of a new node lease bucket: the
	// longest the next agent of a node waits after its predecessor died
	// without releasing its lease.
	DefaultNodeLeaseTTL = 5 * time.Second
)

// ErrLeaseHeld: another live process holds the lease. The error is a
// [*HeldError] naming the holder.
var ErrLeaseHeld = errors.New("held by another live process")

// Holder says who holds a lease; it is the lease key's value (JSON), for
// people reading the bucket (`nats kv get MESH_NODES ace`) and for the
// error a second claimant gets.
type Holder struct {
	// Role and Name say what holds it: "node" and the node's name, or
	// "reconciler" and the stream's.
	Role  string    `json:"role"`
	Name  string    `json:"name"`
	Host  string    `json:"host"`
	PID   int       `json:"pid"`
	Since time.Time `json:"since"`
	// Token is random per claim: it tells a holder its own key from a
	// successor's.
	Token string `json:"token"`
	// Boot, PIDNS and Start say which process PID is: the host's boot
	// id (/proc/sys/kernel/random/boot_id), its pid namespace
	// (/proc/self/ns/pid) and the process's start time in clock ticks
	// since boot (/proc/<pid>/stat field 22). Empty where /proc does not
	// tell (not Linux): such a holder is never proven dead, see
	// [AcquireLease].
	Boot  string `json:"boot,omitempty"`
	PIDNS string `json:"pid_ns,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// Trusts are the reconciler public keys a node agent trusts, current
	// and retired, as it read them when it started (empty: it verifies
	// no plan, or an older agent): the reconciler copies them into the
	// agent's up event ([events.Agent].Trusts).
	Trusts []string `json:"trusts,omitempty"`
	// FeedLost, when not zero, is since when the holder reads no event
	// of its feed (a node agent's plans: store.FollowNode lost its
	// consumer and has not made another yet): the agent lives, but
	// follows no plan. The holder's renewals write it ([Lease.SetFeedLost]);
	// `fleet` and `state` show it as the need "feed-lost" (a fresh user's
	// finding M8: 272 of 300 agents followed no plan while `fleet` said
	// "nothing 301"). Absent from older agents' leases (never lost, as
	// far as they tell); older readers ignore it.
	FeedLost time.Time `json:"feed_lost,omitzero"`
}

// NewHolder returns a Holder for this process: its host name, pid and
// process identity (boot id, pid namespace, start time), now, and a
// fresh token.
func NewHolder(role, name string) Holder {
	h := Holder{Role: role, Name: name, Host: hostname(), PID: os.Getpid(), Since: time.Now().UTC().Truncate(time.Millisecond), Token: nuid.Next()}
	identify(&h)
	return h
}

// hostname is os.Hostname, "unknown" when it fails.
func hostname() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "unknown"
	}
	return host
}

// HeldError is the error of a claim on a lease another live process
// holds. It matches [ErrLeaseHeld].
type HeldError struct {
	// Key is the lease's key; Holder its holder as last read.
	Key    string
	Holder Holder
	// Bucket is the lease bucket; Foreign, when not "", the key's value
	// (cut short) that is no meshfold lease at all (foreignHolder).
	Bucket  string
	Foreign string
}

func (e *HeldError) Error() string {
	if e.Foreign != "" {
		return fmt.Sprintf("the lease key %s of %s holds a value that is no meshfold process's lease (%s: written by another tool?), and something renews it; "+
			"delete it ('nats kv del %s %s') and start again", e.Key, e.Bucket, e.Foreign, e.Bucket, e.Key)
	}
	return fmt.Sprintf("%s %s is %s: host %s, pid %d, since %s", e.Holder.Role, e.Holder.Name, ErrLeaseHeld,
		e.Holder.Host, e.Holder.PID, e.Holder.Since.Format(time.RFC3339))
}

// readHolder reads a lease key's value: its holder, and foreign "" when
// the value is a meshfold lease holder's; otherwise (a stray 'nats kv
// put', another tool's value) foreign is the value, quoted and cut short,
// for messages (a fresh user's finding V5: "  is held by another live
// process: host , pid 0, since 0001-01-01…"). Every holder meshfold
// writes names its role.
func readHolder(value []byte) (h Holder, foreign string) {
	if err := json.Unmarshal(value, &h); err == nil && h.Role != "" {
		return h, ""
	}
	v := string(value)
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return Holder{}, strconv.Quote(v)
}

func (e *HeldError) Unwrap() error { return ErrLeaseHeld }

// ProvisionerLeaseSuffix ends the key of a node's provisioner client's
// lease in the node lease bucket: <node>.provisioner (a second token, so
// no node name is one, and a node agent's grant of the key <node> does
// not reach it).
const ProvisionerLeaseSuffix = ".provisioner"

// ProvisionerLeaseKey returns the key of node's provisioner lease in the
// node lease bucket: "ace.provisioner".
func ProvisionerLeaseKey(node string) string { return node + ProvisionerLeaseSuffix }

// NodeLeasePulseKey is the key of the node lease bucket that each
// reconciler's agent liveness watch writes every TTL/4, as an agent
// renews its lease: a write the bucket did not store on time says that
// no agent's renewal was stored either, and the leases that expired
// meanwhile are judged after a grace (DESIGN.md §11 "Liveness"; see
// docs/architecture.md, "Agent liveness across a stall of the bucket").
// It is no node's name ([LeaseOf] says not ok), and its value names the
// reconciler instance that wrote it last.
const NodeLeasePulseKey = "_pulse"

// LeaseOf tells whose a key of the node lease bucket is: the node and
// events.KindAgent for a node agent's (the key is the node's name),
// events.KindProv for its provisioner's ([ProvisionerLeaseKey]); ok is
// false for any other key.
func LeaseOf(key string) (node string, kind events.Kind, ok bool) {
	if n, found := strings.CutSuffix(key, ProvisionerLeaseSuffix); found {
		return n, events.KindProv, events.ValidName(n)
	}
	return key, events.KindAgent, events.ValidName(key)
}

// LeaseKey is the key of node's lease of kind (events.KindAgent or
// events.KindProv) in the node lease bucket: [LeaseOf]'s inverse.
func LeaseKey(node string, kind events.Kind) string {
	if kind == events.KindProv {
		return ProvisionerLeaseKey(node)
	}
	return node
}

// OpenNodeLeases opens the node lease bucket of streamCfg's stream
// (<stream>_NODES), creating it when missing: file storage, history 1,
// TTL [DefaultNodeLeaseTTL], the stream's replica count. An existing
// bucket is opened as it is (its TTL wins).
//
// Errors: the bucket's lookup or creation failing; a bucket without a TTL.
func OpenNodeLeases(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig) (jetstream.KeyValue, error) {
	cfg := streamCfg.WithDefaults()
	return openLeaseBucket(ctx, js, cfg.Name+NodeLeaseBucketSuffix,
		"meshfold node agents of stream "+cfg.Name+": one lease per node, keyed by its name", DefaultNodeLeaseTTL, cfg.Replicas)
}

func openLeaseBucket(ctx context.Context, js jetstream.JetStream, bucket, desc string, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	kv, err := openKV(ctx, js, true, jetstream.KeyValueConfig{Bucket: bucket, Description: desc, History: 1,
		TTL: ttl, Storage: jetstream.FileStorage, Replicas: replicas})
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	return LeaseBucket(kv, js.Conn()), nil
}

// connBucket is a lease bucket with the connection it asks through: a
// jetstream.KeyValue does not expose its own, and a claim's or renewal's
// write the server denies needs it to be told at once (see [LeaseBucket]).
type connBucket struct {
	jetstream.KeyValue
	nc *nats.Conn
}

// LeaseBucket returns kv, a bucket nc opened, as a lease bucket whose
// claims and renewals ([AcquireLease]) end at once when the server's
// permissions deny their write of the key ("$KV.<bucket>.<key>"): NATS
// answers a denied publish with no reply, and a claim took the silence
// for an election and asked again until its bound (30 s) instead of
// saying the denial. The claim then fails with a [*DeniedError]
// (matching [ErrPermissionDenied] and nats.ErrPermissionViolation); a
// lease held is lost at once when a renewal is denied ([Lease.Lost],
// [Lease.Err]), and a release so denied fails with the denial. A bucket
// not passed through it (or nc nil) is asked unguarded, as before.
// [OpenNodeLeases]' bucket is one already, and so is every lease bucket
// the engine opens.
func LeaseBucket(kv jetstream.KeyValue, nc *nats.Conn) jetstream.KeyValue {
	if nc == nil {
		return kv
	}
	if c, ok := kv.(*connBucket); ok {
		kv = c.KeyValue
	}
	return &connBucket{KeyValue: kv, nc: nc}
}

// connOf returns the connection of a bucket of [LeaseBucket], else nil.
func connOf(kv jetstream.KeyValue) *nats.Conn {
	if c, ok := kv.(*connBucket); ok {
		return c.nc
	}
	return nil
}

// heldLogged maps a lease key to the token of the holder this process
// last said it waited for, at info: a standby that claims again and again
// (a group member, a rollout controller's supervisor every few seconds)
// says so once per holder, then at debug (a fresh user's finding: 289
// such lines in 18 minutes).
var heldLogged sync.Map

// Lease is a key of a KV bucket with a TTL, held by one process: created
// only when absent, renewed every TTL/4 at the revision it holds (compare
// and swap), deleted at that revision on [Lease.Release]. A holder that
// dies stops renewing, and the key expires after the bucket's TTL.
type Lease struct {
	kv     jetstream.KeyValue
	nc     *nats.Conn // kv's, when known ([LeaseBucket]): its writes' denials end them
	key    string
	ttl    time.Duration
	holder Holder
	value  []byte
	log    *slog.Logger

	stop      chan struct{}
	done      chan struct{}
	lost      chan struct{}
	reclaimed chan struct{}
	stopOnce  sync.Once

	mu      sync.Mutex
	rev     uint64
	err     error        // why the lease was lost
	note    string       // SetOutageNote's
	cause   func() error // SetOutageCause's
	outFull bool         // the outage under way is a server that cannot store (ErrStorageFull), not an unreachable one

	out outage // the renewals' (only renew's goroutine)
	// renewedAt is when the key was last written by this holder (its
	// claim, a renewal answered); only renew's goroutine after the claim.
	renewedAt time.Time
}

// SetFeedLost sets the holder's [Holder.FeedLost] (the zero time: its
// feed reads) and makes its next renewal, within a quarter of the TTL,
// write it. A renewal writes the new value in the same update as ever:
// a reconciler's liveness watch takes a value of the same token as its
// holder's, not as a new claim.
func (l *Lease) SetFeedLost(since time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !since.IsZero() {
		since = since.UTC().Truncate(time.Millisecond)
	}
	if l.holder.FeedLost.Equal(since) {
		return
	}
	h := l.holder
	h.FeedLost = since
	v, err := json.Marshal(h)
	if err != nil {
		return // a Holder always marshals
	}
	// Only the field: the token, read without the lock, never changes.
	l.holder.FeedLost, l.value = since, v
}

// valueNow returns the value the holder writes now.
func (l *Lease) valueNow() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value
}

// SetOutageNote sets what the holder's outage lines add after "NATS
// unreachable since T; " (the node agent: that its modules keep
// running).
func (l *Lease) SetOutageNote(note string) {
	l.mu.Lock()
	l.note = note
	l.mu.Unlock()
}

// SetOutageCause sets what the holder's outage lines name as the cause
// (attribute "cause"), asked each time one is said: the renewal's own
// error is that of the bucket's request ("context deadline exceeded"),
// while the connection's reconnect attempts hold the reason, such as a
// TLS handshake the server's expired certificate fails (a fresh user's
// finding F4). See [ReconnectError]. A nil answer adds nothing.
func (l *Lease) SetOutageCause(cause func() error) {
	l.mu.Lock()
	l.cause = cause
	l.mu.Unlock()
}

// ReconnectError is why nc's reconnect attempts fail, while it is not
// connected: the error of its last attempt that reached a server (a TLS
// handshake, the server's refusal of the credentials), or nil when the
// last attempt reached none (nothing listens: that is all there is to
// say) or nc is connected.
func ReconnectError(nc *nats.Conn) error {
	if nc == nil || nc.IsConnected() || nc.IsClosed() {
		return nil
	}
	return nc.LastError()
}

// outageReminder is how often a renewal that still fails is said again.
const outageReminder = time.Minute

// outage follows a lease's renewals that do not reach the server, so
// that an outage is said once when it starts, again at most every
// outageReminder, and once when it ends: each failed renewal said "lease
// not renewed; retrying", 13 lines in 16 s of a NATS outage (a fresh
// user's finding U24). The failures between go to the debug level.
type outage struct {
	since, said time.Time // zero: no outage
	cause       string    // the cause last said, digits removed (causeKind)
}

type outageSay int

const (
	outageQuiet  outageSay = iota // a failure within the reminder
	outageStarts                  // the first failure
	outageLasts                   // a reminder
	outageEnds                    // a renewal after failures
	outageNone                    // a renewal, no outage
)

func (o *outage) fail(now time.Time) outageSay {
	switch {
	case o.since.IsZero():
		o.since, o.said = now, now
		return outageStarts
	case now.Sub(o.said) >= outageReminder:
		o.said = now
		return outageLasts
	}
	return outageQuiet
}

func (o *outage) renewed() (time.Time, outageSay) {
	since := o.since
	if since.IsZero() {
		return since, outageNone
	}
	*o = outage{}
	return since, outageEnds
}

// unrenewed says a renewal that failed with err as the outage stands.
func (l *Lease) unrenewed(err error) {
	now := time.Now()
	err = StorageFullError(err)
	full := errors.Is(err, ErrStorageFull)
	l.mu.Lock()
	note, causef := l.note, l.cause
	l.mu.Unlock()
	if note != "" {
		note = "; " + note
	}
	say := l.out.fail(now)
	attrs := []any{"key", l.key, "err", err}
	// The cause is asked at each failure: one that appears or changes
	// within the minute is said at once, as a reminder (the server came
	// back after the outage started, with a certificate that fails the
	// handshake), not a minute later.
	if causef != nil && !full {
		if c := causef(); c != nil {
			attrs = append(attrs, "cause", c)
			if kind := causeKind(c); kind != l.out.cause {
				l.out.cause = kind
				if say == outageQuiet {
					l.out.said, say = now, outageLasts
				}
			}
		}
	}
	switch say {
	case outageStarts:
		l.mu.Lock()
		l.outFull = full
		l.mu.Unlock()
		if full { // NATS answers: it cannot store
			l.log.Warn(fmt.Sprintf("the server cannot store since %s%s (lease not renewed; retrying every %s, said again each minute)",
				now.Format(time.TimeOnly), note, l.ttl/4), "key", l.key, "err", err)
			return
		}
		l.log.Warn(fmt.Sprintf("NATS unreachable since %s%s (lease not renewed; retrying every %s, said again each minute)",
			now.Format(time.TimeOnly), note, l.ttl/4), attrs...)
	case outageLasts:
		if full {
			l.log.Warn(fmt.Sprintf("the server still cannot store since %s%s (lease not renewed for %s)",
				l.out.since.Format(time.TimeOnly), note, now.Sub(l.out.since).Round(time.Second)), "key", l.key, "err", err)
			return
		}
		l.log.Warn(fmt.Sprintf("NATS still unreachable since %s%s (lease not renewed for %s)",
			l.out.since.Format(time.TimeOnly), note, now.Sub(l.out.since).Round(time.Second)), attrs...)
	default:
		l.log.Debug("lease not renewed; retrying", "key", l.key, "err", err)
	}
}

// causeKind is err's text without its digits: the same cause again
// (another port, another "current time") is not said again.
func causeKind(err error) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, err.Error())
}

// renewedNow ends the outage a renewal that reached the server ends. It
// reports whether the outage may have outlived the key: no renewal was
// stored for the TTL (the last one stored came at most TTL/4 before the
// outage's first failure), so a watcher of the bucket may have read the
// key gone and recorded the holder down, although this renewal found it
// (a fresh user's finding, G1: after a quorum loss the leader that kept
// the key stored the renewal as a plain one, and a down judged from a
// replica that had aged the key out stood until the agent's next have).
func (l *Lease) renewedNow() (outlived bool) {
	l.renewedAt = time.Now()
	since, say := l.out.renewed()
	if say != outageEnds {
		return false
	}
	outlived = time.Since(since)+l.ttl/4 >= l.ttl
	l.mu.Lock()
	full := l.outFull
	l.mu.Unlock()
	if full {
		l.log.Info(fmt.Sprintf("the server stores again, after %s unable to since %s",
			time.Since(since).Round(time.Second), since.Format(time.TimeOnly)), "key", l.key)
		return outlived
	}
	l.log.Info(fmt.Sprintf("NATS reachable again, after %s unreachable since %s",
		time.Since(since).Round(time.Second), since.Format(time.TimeOnly)), "key", l.key)
	return outlived
}

// nudgeReclaimed delivers on [Lease.Reclaimed], unless one not taken yet
// says it already.
func (l *Lease) nudgeReclaimed() {
	select {
	case l.reclaimed <- struct{}{}:
	default:
	}
}

// AcquireLease claims key in kv for holder. A key whose holder is
// provably dead is taken at once (compare and swap at the revision
// read): one recorded on this host (same host name, boot id and pid
// namespace) by a process that is gone, a zombie, or whose pid now
// names another process (another start time), as after a kill -9 and a
// restart. Otherwise, when another process holds the key, it watches
// it (a direct get every TTL/20, at least 50 ms, at most 250 ms): if
// the holder renews it, that holder is alive and the claim fails with a
// [*HeldError]; if the key expires (its holder died) or is released,
// the claim takes it. A live holder renews every TTL/4 and a dead one's
// key expires within the TTL, so a claim waits at most about the TTL;
// one that sees neither within twice the TTL and a second fails with a
// [*HeldError] too. A holder on another host or boot, or one whose
// process identity is unknown, is never taken before its key expires.
// The lease is then renewed until [Lease.Release]; see [Lease.Lost].
//
// Errors: a [*HeldError] (matching [ErrLeaseHeld]); ctx's error; the
// bucket's errors (no TTL, unreachable); a [*DeniedError] at once when
// the server denies the key's write or read to these credentials and kv
// carries its connection ([LeaseBucket], [OpenNodeLeases]), else the
// unanswered ask's after the claim's ride-out.
func AcquireLease(ctx context.Context, kv jetstream.KeyValue, key string, holder Holder, log *slog.Logger) (*Lease, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", key, err)
	}
	return AcquireLeaseTTL(ctx, kv, st.TTL(), key, holder, log)
}

// AcquireLeaseTTL is [AcquireLease] for a caller that read the bucket's
// TTL already (ttl, from its status): the status is not asked for again,
// a round trip of a reconciler's start (issue 27).
func AcquireLeaseTTL(ctx context.Context, kv jetstream.KeyValue, ttl time.Duration, key string, holder Holder, log *slog.Logger) (*Lease, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("lease bucket %s has no TTL: a dead holder's lease would never expire", kv.Bucket())
	}
	value, err := json.Marshal(holder)
	if err != nil {
		return nil, err
	}
	l := &Lease{kv: kv, nc: connOf(kv), key: key, ttl: ttl, holder: holder, value: value, log: log,
		stop: make(chan struct{}), done: make(chan struct{}), lost: make(chan struct{}), reclaimed: make(chan struct{}, 1)}
	if err := l.claim(ctx); err != nil {
		return nil, err
	}
	l.renewedAt = time.Now()
	go l.renew()
	return l, nil
}

// restamp sets the holder's Since to now and its value to match: a
// claim that waited for another holder's key says when it took the
// lease, not when it began to wait (a fresh user's finding: a rollout
// controller's lease said "since" 6 s before its holder took it, and
// before the previous holder's kill).
func (l *Lease) restamp() {
	l.holder.Since = time.Now().UTC().Truncate(time.Millisecond)
	if value, err := json.Marshal(l.holder); err == nil {
		l.value = value
	}
}

// claim creates the key, waiting for a dead holder's key to expire.
//
// A write or read that goes unanswered ([Unanswered]: a server stalled,
// the bucket's leader killed and its successor not yet elected) is asked
// again, each attempt bounded by 1 s doubling to 5 s (at most the TTL),
// until an answer comes or claimRideOut has passed without one: one
// unanswered create ended a claim (a reconciler's HoldStream, under a
// server's 5 s stall). The fencing is unchanged: the lease is believed
// held only once a write of ours was answered stored. A create asked
// again after one stored but unanswered is answered "exists" with our
// own token in the key: that key is written again at its revision (a
// compare and swap, which also restarts its TTL) before the claim
// returns, so a claim is never believed from a read of a key that may be
// about to expire, nor from a write that may not have been stored.
func (l *Lease) claim(ctx context.Context) error {
	poll := min(max(l.ttl/20, 50*time.Millisecond), 250*time.Millisecond)
	var (
		first   uint64 // the revision of the other holder's key when first seen
		other   Holder
		waiting time.Time
		// unanswered is when the asks began going unanswered (zero while
		// they are answered); attempt bounds the next write or read.
		unanswered time.Time
		attempt    = askAttemptFirst
	)
	// again reports whether err, an unanswered ask's, is asked again
	// (after the pause): within claimRideOut of the first unanswered
	// one. An answer resets it.
	again := func(err error) bool {
		if err == nil || !Unanswered(err) {
			unanswered, attempt = time.Time{}, askAttemptFirst
			return false
		}
		if unanswered.IsZero() {
			unanswered = time.Now()
		}
		NoteWait(ctx, err)
		attempt = min(2*attempt, askAttemptMost)
		return time.Since(unanswered) < claimRideOut
	}
	pause := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
			return nil
		}
	}
	// stalled is when the claim's writes began going unanswered (or
	// refused for lack of room), said is when that was last logged. A
	// claim of a dead holder's key whose write the server never answers
	// (a file store that failed a write answers none: a full data
	// directory) asks again for as long as it takes, each create answered
	// "exists" at once: an agent started then waited 11 minutes with
	// nothing in its log but "lease held: waiting" (a fresh user's
	// finding G1). It says why it waits, at once and each minute.
	var stalled, said time.Time
	noteWrite := func(err error) {
		if err == nil || !Unanswered(err) {
			return
		}
		now := time.Now()
		if stalled.IsZero() {
			stalled = now
		}
		if !said.IsZero() && now.Sub(said) < claimSayEvery {
			return
		}
		said = now
		why := "the server did not answer it (a server that cannot store: a full data directory? see its log; or one too busy)"
		if errors.Is(err, ErrStorageFull) {
			why = "the server cannot store: its data directory is full (or its storage limit reached)"
		}
		l.log.Warn(fmt.Sprintf("lease %s not claimed yet: its write has not been stored since %s: %s; asking again until it is, said again each minute",
			l.key, stalled.Format("15:04:05"), why), "key", l.key, "waited", now.Sub(stalled).Round(time.Second), "err", err)
	}
	for {
		if !waiting.IsZero() {
			l.restamp() // the claim, not the wait, begins the holding
		}
		rev, err := l.put(ctx, 0, attempt)
		noteWrite(err)
		if err == nil {
			l.rev = rev
			if first != 0 {
				l.log.Info("lease taken over from a holder that stopped renewing it", "key", l.key,
					"waited", time.Since(waiting).Round(time.Millisecond), "previous_host", other.Host, "previous_pid", other.PID)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if again(err) {
			// Stored or not, unknown: ask again; an "exists" then is read.
			if err := pause(); err != nil {
				return err
			}
			continue
		}
		// A create that lost a race with a fresh delete (the key's
		// previous holder releasing it) comes back from a replicated
		// bucket as the server's raw 10164, not as ErrKeyExists: the key
		// changed under it, so read it again, as after ErrKeyExists.
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(ServerError(err), ErrConflict) {
			return fmt.Errorf("lease %s: %w", l.key, err)
		}
		gctx, cancel := context.WithTimeout(ctx, min(attempt, l.ttl))
		gctx, release := l.guard(gctx)
		e, err := l.kv.Get(gctx, l.key)
		if d := askDenied(gctx); err != nil && d != nil {
			err = d
		}
		release()
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			continue // expired or released since: claim it
		case err != nil && ctx.Err() == nil && again(err):
			if err := pause(); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("lease %s: %w", l.key, err)
		}
		h, foreign := readHolder(e.Value())
		ours := foreign == "" && h.Token == l.holder.Token
		switch {
		case ours, provablyDead(h):
			// Ours: our own create, stored, whose answer was lost. It
			// is held once written again at its revision: stored as it
			// was read, with its TTL restarted.
			if !ours {
				l.restamp()
			}
			rev, err := l.put(ctx, e.Revision(), attempt)
			noteWrite(err)
			switch {
			case err == nil:
				l.rev = rev
				if ours {
					l.log.Info("lease claimed by a create whose answer was lost, written again", "key", l.key)
				} else {
					l.log.Info("lease taken at once from a holder that died on this host", "key", l.key,
						"previous_pid", h.PID, "previous_since", h.Since)
				}
				return nil
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists),
				errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(ServerError(err), ErrConflict):
				continue // changed since it was read: read it again
			case again(err):
				if err := pause(); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("lease %s: %w", l.key, err)
		case first == 0 && foreign != "":
			// No process of ours holds it; a value put once expires with
			// the bucket's TTL, as a dead holder's does.
			first, waiting = e.Revision(), time.Now()
			l.log.Warn("lease key holds a value that is no meshfold lease (written by another tool?): waiting for its expiry",
				"bucket", l.kv.Bucket(), "key", l.key, "value", foreign, "ttl", l.ttl)
		case first == 0:
			first, other, waiting = e.Revision(), h, time.Now()
			level := slog.LevelInfo
			if prev, ok := heldLogged.Swap(l.key, h.Token); ok && prev == h.Token {
				level = slog.LevelDebug // a standby asking again: said once per holder
			}
			l.log.Log(ctx, level, "lease held: waiting for a renewal (alive) or its expiry (dead)", "key", l.key, "ttl", l.ttl,
				"host", h.Host, "pid", h.PID, "since", h.Since)
		case e.Revision() != first:
			return &HeldError{Key: l.key, Holder: h, Bucket: l.kv.Bucket(), Foreign: foreign} // renewed: its holder is alive
		case time.Since(waiting) > 2*l.ttl+time.Second:
			return &HeldError{Key: l.key, Holder: h, Bucket: l.kv.Bucket(), Foreign: foreign} // neither renewed nor expired: do not take it
		}
		if err := pause(); err != nil {
			return err
		}
	}
}

// claimRideOut bounds how long a claim asks again writes and reads that
// go unanswered, from the first such without an answer since: an
// election after a kill -9 (up to ~10 s) or a server's stall is waited
// out; a server gone for good ends the claim with the last error (its
// caller's retry, if any, asks again later).
const claimRideOut = DefaultRideOut

// claimSayEvery is how often a claim whose writes are not stored says
// so again.
const claimSayEvery = time.Minute

// put writes the lease's value: a create when rev is 0, else an update
// at rev (the key of a dead holder, or our own create's). The write is
// bounded by bound (at most the TTL) and outlives a stop: one stored by
// the server but cancelled before its reply would leave a key no one
// releases, for the next claimant to wait out and a watcher never to see
// deleted. A write that succeeds after ctx ended is given back (deleted
// at its revision) and ctx's error returned.
func (l *Lease) put(ctx context.Context, rev uint64, bound time.Duration) (uint64, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(bound, l.ttl))
	cctx, release := l.guard(cctx)
	var (
		next uint64
		err  error
	)
	if rev == 0 {
		next, err = l.kv.Create(cctx, l.key, l.valueNow())
	} else {
		next, err = l.kv.Update(cctx, l.key, l.valueNow(), rev)
	}
	if err != nil {
		if d := askDenied(cctx); d != nil {
			err = d // not stored: the server dropped it
		}
	}
	release()
	cancel()
	if err == nil && ctx.Err() != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
		defer cancel()
		if err := l.kv.Delete(dctx, l.key, jetstream.LastRevision(next)); err != nil {
			l.log.Warn("lease claimed as the claim stopped, and not given back; it expires after its TTL", "key", l.key, "ttl", l.ttl, "err", err)
		}
		return 0, ctx.Err()
	}
	return next, err
}

// guard returns ctx cancelled with the server's permission error as
// soon as a request of l.nc on the lease's key is denied ([GuardDenied]):
// its write ("$KV.<bucket>.<key>", under a JetStream domain's prefix too)
// or its direct get (that subject after "$JS.API.DIRECT.GET.KV_<bucket>."),
// and its release. Without l.nc, ctx as it is.
func (l *Lease) guard(ctx context.Context) (context.Context, func()) {
	subject := "$KV." + l.kv.Bucket() + "." + l.key
	return watchDenials(l.nc).guard(ctx, func(s string) bool {
		return s == subject || strings.HasSuffix(s, "."+subject)
	})
}

// renew renews the lease every TTL/4 until Release or its loss.
//
// The lease's key stays under its connection's denial watch ([LeaseBucket])
// for as long as it is renewed, not only during each renewal: a renewal
// the server's permissions deny (the credentials' permissions changed
// under the holder) ends the lease at once, with the [*DeniedError] as its
// Err, whenever the denial is reported, after the renewal's own deadline
// too (the connection's error callback can come late on a loaded
// machine). Before, a denied renewal timed out at TTL/4, was said as "NATS
// unreachable", and was asked again for ever after the key had expired.
func (l *Lease) renew() {
	defer close(l.done)
	watched, release := l.guard(context.Background())
	defer release()
	t := time.NewTicker(l.ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-watched.Done():
			l.lose(fmt.Errorf("lease %s: %w", l.key, askDenied(watched)))
			return
		case <-t.C:
		}
		select {
		case <-l.stop:
			// A tick and the stop both ready (a renewal that took a
			// whole tick: the server gone): select chose the tick half
			// the time, and Release waited a renewal more, each time.
			return
		default:
		}
		if err := l.renewOnce(watched); err != nil {
			l.lose(err)
			return
		}
	}
}

// lose ends the lease with err: [Lease.Lost] is closed and [Lease.Err]
// says err. Only renew's goroutine.
func (l *Lease) lose(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
	close(l.lost)
}

// renewOnce renews the lease once, under watched (renew's denial watch).
// A failure to reach the server is only logged (the next tick tries
// again); the error returned means the key is another holder's now (a
// [*HeldError]), or that the server denied the renewal (a [*DeniedError]).
//
// Release ends a renewal under way (its ctx): one the server stored
// unanswered leaves rev behind, which Release reads past.
func (l *Lease) renewOnce(watched context.Context) (rerr error) {
	ctx, cancel := context.WithTimeout(watched, l.ttl/4)
	defer cancel()
	defer func() {
		// Whatever step the denial ended (the update, the read or the
		// create after it), it ends the lease.
		if d := askDenied(ctx); d != nil {
			rerr = fmt.Errorf("lease %s: %w", l.key, d)
		}
	}()
	go func() {
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	// unrenewed says a failure to reach the server, not a denial (which
	// the deferred check returns).
	unrenewed := func(err error) {
		if askDenied(ctx) == nil {
			l.unrenewed(err)
		}
	}
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	next, err := l.kv.Update(ctx, l.key, l.valueNow(), rev)
	if err == nil {
		l.setRev(next)
		if l.renewedNow() {
			l.nudgeReclaimed() // as a re-claim: see renewedNow
		}
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return nil // released
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
		unrenewed(err)
		return nil
	}
	// Not at our revision: expired while we could not renew it, or
	// taken by a successor.
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		next, err := l.kv.Create(ctx, l.key, l.valueNow())
		if err == nil {
			unrenewedFor := time.Since(l.renewedAt)
			l.renewedNow()
			l.saidReclaimed(unrenewedFor)
			l.setRev(next)
			l.nudgeReclaimed()
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			unrenewed(err)
			return nil
		}
		e, err = l.kv.Get(ctx, l.key)
		if err != nil {
			unrenewed(err)
			return nil
		}
	case err != nil:
		unrenewed(err)
		return nil
	}
	h, foreign := readHolder(e.Value())
	if foreign != "" {
		// Not a successor: no process of ours wrote it (a stray 'nats kv
		// put'), so the holder is still this one, which writes its lease
		// back over it rather than stop (a fresh user's finding V5: the
		// agent stopped, "lease taken by another agent").
		next, err := l.kv.Update(ctx, l.key, l.valueNow(), e.Revision())
		if err != nil {
			if askDenied(ctx) == nil {
				l.log.Warn("lease not renewed; retrying", "key", l.key, "err", err)
			}
			return nil
		}
		l.log.Warn("the lease key held a value that is no meshfold lease (written by another tool?): the lease is written back over it",
			"bucket", l.kv.Bucket(), "key", l.key, "value", foreign)
		l.setRev(next)
		return nil
	}
	if h.Token == l.holder.Token {
		l.setRev(e.Revision()) // our own renewal, whose reply was lost
		if l.renewedNow() {
			l.nudgeReclaimed()
		}
		return nil
	}
	return &HeldError{Key: l.key, Holder: h, Bucket: l.kv.Bucket()}
}

// saidReclaimed says that the lease expired and this holder claimed it
// again, its key unrenewed for d (since its last renewal answered).
// The key was gone for about d - TTL: while that is shorter than the TTL,
// no other holder can have taken it and let it expire again meanwhile
// (one that took it would hold it still, and the claim would have found
// it), so the lapse is only the bucket's or the connection's outage: a
// NATS election after a server's kill -9 (4–10 s here) outlasts a 5 s
// node lease, and every agent's lease expired in it. That is said at
// INFO (a fresh user's finding m3: ten WARNs a kill, none of them
// anything to act on; a reconciler gives the lease's holder a grace
// before it records it down). A key gone for a TTL or longer is said at
// WARN: another holder could have held the key meanwhile (a second
// process of the same name), and a watcher may have recorded this one
// down.
func (l *Lease) saidReclaimed(d time.Duration) {
	gone := max(d-l.ttl, 0)
	attrs := []any{"key", l.key, "unrenewed_for", d.Round(time.Millisecond), "ttl", l.ttl}
	if gone < l.ttl {
		l.log.Info("lease expired while NATS did not answer its renewals (a leader election, or the server away) and was claimed again; "+
			"it was gone for less than its TTL, so no other holder took it meanwhile", attrs...)
		return
	}
	l.log.Warn(fmt.Sprintf("lease expired before it was renewed and was claimed again after %s gone (longer than its TTL): "+
		"another holder could have held it meanwhile, and a watcher may have recorded this one down", gone.Round(100*time.Millisecond)), attrs...)
}

func (l *Lease) setRev(rev uint64) {
	l.mu.Lock()
	l.rev = rev
	l.mu.Unlock()
}

// TTL returns the lease's TTL (the bucket's).
func (l *Lease) TTL() time.Duration { return l.ttl }

// Lost is closed when another process has taken the key (this one could
// not renew it within the TTL, and a successor claimed it), or when the
// server's permissions denied a renewal (the holder's credentials lost
// the key: the key expires after its TTL, and nothing this holder asks
// again can keep it); [Lease.Err] then says which. A holder stops at
// once: see docs/architecture.md, "A denied renewal ends the lease".
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Reclaimed delivers once each time the lease expired before it was
// renewed (no renewal reached the bucket for its TTL: the server or the
// bucket's leader away) and was claimed again, by this holder, with the
// same token, and each time a renewal ends an outage of renewals that
// lasted the TTL (the key kept by the bucket's leader, aged out by a
// replica a watcher read); one not taken yet stands for later ones. A
// watcher of the bucket may have recorded the holder's death meanwhile
// (DESIGN.md §11).
func (l *Lease) Reclaimed() <-chan struct{} { return l.reclaimed }

// Err returns why the lease was lost, nil while held: a [*HeldError]
// naming the key's new holder (matching [ErrLeaseHeld]), or an error
// wrapping the [*DeniedError] of a renewal the server denied (matching
// [ErrPermissionDenied] and nats.ErrPermissionViolation), for a bucket of
// [LeaseBucket].
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Abandon stops renewing and deletes nothing: the key expires after the
// TTL. For a holder whose server is gone, where a delete would wait out
// its deadline unanswered. Release after it deletes nothing either.
func (l *Lease) Abandon() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
}

// Release stops renewing and deletes the key at the revision held, so
// the next claimant takes it at once instead of after the TTL. Calling it
// twice, or after the lease was lost, deletes nothing more.
//
// Errors: the delete's (the key then expires after the TTL); a
// [*DeniedError] at once when the server denies it (a bucket of
// [LeaseBucket]).
func (l *Lease) Release(ctx context.Context) error {
	first := false
	l.stopOnce.Do(func() { close(l.stop); first = true })
	<-l.done
	if !first || l.Err() != nil {
		return nil
	}
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	// A delete the server denies ends at once, with the denial, not at
	// ctx's end.
	ctx, release := l.guard(ctx)
	defer release()
	denied := func(err error) error {
		if d := askDenied(ctx); d != nil {
			return d
		}
		return err
	}
	// Not at the revision held: a renewal the server stored but whose
	// reply came after its deadline left rev behind. The key is still
	// ours if it holds our token (read again: a replica answering a
	// direct get may lag by a revision); a successor's is left alone.
	for attempt := 0; ; attempt++ {
		err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
		if err == nil {
			return nil
		}
		if attempt == 3 || !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("release lease %s: %w", l.key, denied(err))
		}
		e, err := l.kv.Get(ctx, l.key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return nil // expired already
		case err != nil:
			return fmt.Errorf("release lease %s: %w", l.key, denied(err))
		}
		var h Holder
		_ = json.Unmarshal(e.Value(), &h)
		if h.Token != l.holder.Token {
			return nil
		}
		rev = e.Revision()
	}
}

// LeaseAge reads the lease key of the node lease bucket of streamCfg's
// stream, without creating the bucket: held is false when nobody holds
// it (the key expired or was released, or the bucket does not exist);
// else holder is its value, age how long ago (against now) its holder
// last renewed it (the server's time of its newest revision), and ttl
// the bucket's TTL. A live holder renews every TTL/4, so an age above
// TTL/2 is a holder that may be down (killed: its key expires only at
// the TTL). The one read of a lease's age: 'secret put' says so.
//
// Errors: the bucket's lookup (other than not found) or the key's read.
func LeaseAge(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig, key string, now time.Time) (held bool, holder Holder, age, ttl time.Duration, err error) {
	kv, err := js.KeyValue(ctx, streamCfg.WithDefaults().Name+NodeLeaseBucketSuffix)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, holder, 0, 0, nil
	}
	if err != nil {
		return false, holder, 0, 0, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return false, holder, 0, 0, err
	}
	ttl = st.TTL()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, holder, 0, ttl, nil
	}
	if err != nil {
		return false, holder, 0, ttl, err
	}
	_ = json.Unmarshal(e.Value(), &holder)
	return true, holder, max(now.Sub(e.Created()), 0), ttl, nil
}

// feedLostGets is how many leases [FeedsLost] reads at once.
const feedLostGets = 16

// FeedsLost returns, of the node agents whose lease the node lease
// bucket of streamCfg's stream holds now, since when each whose plan feed
// is lost has read no plan ([Holder.FeedLost]): `fleet` and `state` show
// them as needing an operator. The bucket's keys are read with one
// stream info (its subjects), their values a direct get each,
// feedLostGets at a time, which the operator's and the console's users
// may do (no consumer: they may not create one on the bucket). of, when
// not nil, limits the read to those nodes. No bucket is none; a lease of
// an older agent never says its feed lost.
//
// Errors: the bucket's lookup (other than not found), its info's, a
// get's (other than a key gone meanwhile).
func FeedsLost(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig, of []string) (map[string]time.Time, error) {
	name := streamCfg.WithDefaults().Name + NodeLeaseBucketSuffix
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[string]time.Time{}, nil
	}
	if err != nil {
		return nil, err
	}
	keys := of
	if keys == nil {
		s, err := js.Stream(ctx, "KV_"+name)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter("$KV."+name+".>"))
		if err != nil {
			return nil, fmt.Errorf("lease bucket %s: %w", name, err)
		}
		for subj := range info.State.Subjects {
			key := strings.TrimPrefix(subj, "$KV."+name+".")
			if _, kind, ok := LeaseOf(key); ok && kind == events.KindAgent {
				keys = append(keys, key)
			}
		}
	}
	var (
		mu    sync.Mutex
		out   = map[string]time.Time{}
		first error
		wg    sync.WaitGroup
		next  = make(chan string)
	)
	for range min(feedLostGets, len(keys)) {
		wg.Go(func() {
			for key := range next {
				e, err := kv.Get(ctx, key)
				var h Holder
				if err == nil {
					_ = json.Unmarshal(e.Value(), &h)
				}
				mu.Lock()
				switch {
				case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
				case err != nil:
					if first == nil {
						first = fmt.Errorf("lease %s: %w", key, err)
					}
				case !h.FeedLost.IsZero() && h.Token != "":
					out[key] = h.FeedLost
				}
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		select {
		case next <- k:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return out, first
}
