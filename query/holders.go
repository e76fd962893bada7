package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// Who holds what in the reconcilers' lease bucket (<stream>_LEASES,
// engine.Group's; the keys' names repeated here, as the read side links
// no engine: TestHoldersKeys keeps them equal).
const (
	// LeaseBucketSuffix names the bucket beside the stream: MESH →
	// MESH_LEASES (engine.LeaseBucketSuffix).
	LeaseBucketSuffix = "_LEASES"
	// streamLeaseKey is an ungrouped reconciler's lease of the whole
	// stream (engine.StreamLeaseKey); partitionLeaseKey a grouped one's
	// of partition p (lease.<p>); controllerLeaseKey a fleet's rollout
	// controller's (engine/rollouts.LeaseKeyPrefix).
	streamLeaseKey      = "stream"
	partitionKeyPrefix  = "lease."
	controllerKeyPrefix = "rollout."
)

// partitionRenewEvery is how often a grouped reconciler renews each of
// its partition leases: min(TTL/6, 1 s) (engine.Group's renewEvery). A
// lease one holds with the ordinary store.Lease (the stream's, a
// controller's) is renewed every TTL/4.
func partitionRenewEvery(ttl time.Duration) time.Duration { return min(ttl/6, time.Second) }

// LeaseHolder is one key of the lease bucket as a reader found it.
type LeaseHolder struct {
	Key string
	// Held: the key holds a lease (false: it expired, was released or
	// was never taken).
	Held bool
	// Who names the holder as its value does: "reconciler r1 of group
	// reconcilers", or "pid 22487 on vm" for a process lease.
	Who   string
	Since time.Time
	// Renewed is the server's time of the key's newest revision: its
	// holder's last renewal.
	Renewed time.Time
}

// leaseValue is what a lease key holds, as engine.Group (group,
// instance, since) or store.Holder (role, name, host, pid, since)
// writes it.
type leaseValue struct {
	Group    string    `json:"group"`
	Instance string    `json:"instance"`
	Role     string    `json:"role"`
	Host     string    `json:"host"`
	PID      int       `json:"pid"`
	Since    time.Time `json:"since"`
}

func (v leaseValue) who() string {
	switch {
	case v.Instance != "":
		return fmt.Sprintf("reconciler %s of group %s", v.Instance, v.Group)
	case v.PID > 0:
		return fmt.Sprintf("pid %d on %s", v.PID, v.Host)
	}
	return "an unnamed holder"
}

// Holders is who holds the stream's partitions, read from the lease
// bucket at one moment.
type Holders struct {
	// TTL is the bucket's: how long a lease lives unrenewed.
	TTL time.Duration
	// Stream is an ungrouped reconciler's lease of every partition;
	// Partitions each grouped one's, in partition order.
	Stream     LeaseHolder
	Partitions []LeaseHolder
}

// Holders reads who holds each of the stream's partitions (one direct
// get a key, all at once), and when each last renewed.
//
// Errors: an error wrapping jetstream.ErrBucketNotFound when no
// reconciler ever ran on the stream; one matching
// nats.ErrPermissionViolation, at once, for credentials issued before
// operators could read the bucket ([Unreadable] says both); the reads'
// errors.
func (r *Reader) Holders(ctx context.Context) (Holders, error) {
	kv, ttl, err := r.leases(ctx)
	if err != nil {
		return Holders{}, err
	}
	_, cfg, err := r.open(ctx)
	if err != nil {
		return Holders{}, err
	}
	n := cfg.Subjects().N()
	h := Holders{TTL: ttl, Partitions: make([]LeaseHolder, n)}
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for p := range n {
		wg.Go(func() { h.Partitions[p], errs[p] = readLease(ctx, kv, partitionKeyPrefix+strconv.Itoa(p)) })
	}
	wg.Go(func() { h.Stream, errs[n] = readLease(ctx, kv, streamLeaseKey) })
	wg.Wait()
	return h, errors.Join(errs...)
}

// ControllerHolder reads who holds fleet's rollout controller lease, and
// the bucket's TTL.
//
// Errors: as [Reader.Holders].
func (r *Reader) ControllerHolder(ctx context.Context, fleet string) (LeaseHolder, time.Duration, error) {
	kv, ttl, err := r.leases(ctx)
	if err != nil {
		return LeaseHolder{}, 0, err
	}
	h, err := readLease(ctx, kv, controllerKeyPrefix+fleet)
	return h, ttl, err
}

// leases opens the lease bucket, without creating it, and reads its TTL.
func (r *Reader) leases(ctx context.Context) (jetstream.KeyValue, time.Duration, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, 0, err
	}
	bucket := cfg.Name + LeaseBucketSuffix
	// Credentials issued before operators could read the bucket are
	// denied at once, not at the lookup's timeout.
	gctx, release := store.GuardDenied(ctx, r.nc, "$JS.API.STREAM.INFO.KV_"+bucket)
	defer release()
	kv, err := r.js.KeyValue(gctx, bucket)
	if cause := context.Cause(gctx); err != nil && errors.Is(cause, nats.ErrPermissionViolation) {
		err = cause
	}
	if err != nil {
		return nil, 0, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	return kv, st.TTL(), nil
}

func readLease(ctx context.Context, kv jetstream.KeyValue, key string) (LeaseHolder, error) {
	h := LeaseHolder{Key: key}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("lease %s: %w", key, err)
	}
	var v leaseValue
	_ = json.Unmarshal(e.Value(), &v) // a value no meshfold process wrote: held, by an unnamed holder
	h.Held, h.Who, h.Since, h.Renewed = true, v.who(), v.Since, e.Created()
	return h, nil
}

// Unheld says why no live reconciler folds partition p as of now, in
// one sentence, or "" when one does: its lease (or an ungrouped
// reconciler's of the whole stream) is held and was renewed within four
// of its renewal periods. A reconciler killed with -9 leaves its lease
// unrenewed until the TTL expires it and another member takes the
// partition over: that gap is what this names (a fresh user's finding
// M4: targets showed 'changing' with no plan and no reason for ~15 s).
func (h Holders) Unheld(p int, now time.Time) string {
	if h.Stream.Held {
		return h.Stream.stale(now, h.TTL, h.TTL/4, "the stream's reconciler")
	}
	if p < 0 || p >= len(h.Partitions) {
		return ""
	}
	l := h.Partitions[p]
	if !l.Held {
		return fmt.Sprintf("no reconciler holds partition %d (its lease expired or was released, and no member of a group has taken it yet; "+
			"one running takes it within a second or two: is a 'meshfold reconcile' or 'meshfold serve' running?)", p)
	}
	return l.stale(now, h.TTL, partitionRenewEvery(h.TTL), fmt.Sprintf("partition %d's reconciler", p))
}

// stale says that l, renewed every `every`, has missed four renewals,
// and when its TTL expires it; "" otherwise.
func (l LeaseHolder) stale(now time.Time, ttl, every time.Duration, what string) string {
	age := now.Sub(l.Renewed)
	if age <= 4*every {
		return ""
	}
	expires := l.Renewed.Add(ttl)
	s := fmt.Sprintf("%s, %s, has not renewed its lease since %s (%s ago): it is gone or stalled", what, l.Who,
		l.Renewed.UTC().Format("15:04:05.000Z"), age.Round(100*time.Millisecond))
	if expires.After(now) {
		return s + fmt.Sprintf("; another reconciler takes it over once the lease expires, at %s (the lease TTL, %s, after its last renewal)",
			expires.UTC().Format("15:04:05Z"), ttl)
	}
	return s + fmt.Sprintf("; its lease (TTL %s) should have expired at %s: a takeover is due now", ttl, expires.UTC().Format("15:04:05Z"))
}

// NoPlanYet says, in the WHY of each target of v given its new want
// (changing) with no plan of it yet whose partition no live reconciler
// folds ([Holders.Unheld]), why no plan comes: "no plan yet: partition 3's
// reconciler, reconciler r2 of group reconcilers, has not renewed its
// lease since …". It returns those targets' nodes, each with its line.
// The lease bucket is read only when some target has no plan; a target
// whose reconciler is live keeps its WHY (its plan is on its way).
//
// Errors: as [Reader.Holders] (v is then unchanged).
func (r *Reader) NoPlanYet(ctx context.Context, v *rollout.View, now time.Time) (map[string]string, error) {
	var waiting []int
	for i, t := range v.Targets {
		if t.Status == rollout.Changing && t.Published > 0 && t.Plan == 0 {
			waiting = append(waiting, i)
		}
	}
	if len(waiting) == 0 {
		return nil, nil
	}
	h, err := r.Holders(ctx)
	if err != nil {
		return nil, err
	}
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	subj := cfg.Subjects()
	out := map[string]string{}
	for _, i := range waiting {
		t := &v.Targets[i]
		why := h.Unheld(subj.Partition(t.Node), now)
		if why == "" {
			continue
		}
		line := fmt.Sprintf("no plan yet of its want #%d: %s", t.Published, why)
		out[t.Node] = line
		t.Why = strings.TrimPrefix(t.Why+"; "+line, "; ")
	}
	return out, nil
}

// Unreadable reports whether err, of [Reader.Holders],
// [Reader.ControllerHolder] or [Reader.NoPlanYet], says only that the
// lease bucket is not there to read (no reconciler ever ran) or that the
// credentials may not read it (issued before operators could): the views
// then say nothing of the leases, as before.
func Unreadable(err error) bool {
	return errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, nats.ErrPermissionViolation)
}
