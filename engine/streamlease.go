package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// StreamLeaseKey is the key of the lease bucket (<stream>_LEASES) an
// ungrouped reconciler holds while it folds the whole stream.
const StreamLeaseKey = "stream"

// Why a reconciler may not start beside another.
var (
	// ErrBesideGroup: a reconciler group folds the stream, so an ungrouped
	// reconciler may not.
	ErrBesideGroup = errors.New("a reconciler group folds this stream")
	// ErrBesideUngrouped: an ungrouped reconciler folds the stream, so no
	// group member may (nor a second ungrouped one).
	ErrBesideUngrouped = errors.New("an ungrouped reconciler folds this stream")
)

// HoldStream claims the lease of an ungrouped reconciler (meshfold serve,
// meshfold reconcile without --group): the key "stream" of the lease bucket,
// created with TTL ttl when missing ([DefaultLeaseTTL] when 0; an existing
// bucket's TTL wins, as for [JoinGroup]). The lease is renewed until
// Release; run the reconciler only while it holds (see store.Lease.Lost).
// A key whose holder provably died on this host (a kill -9 and a restart)
// is taken at once; one whose holder may be alive elsewhere is waited
// for until it expires (at most the bucket's TTL), see store.AcquireLease.
//
// Errors: [ErrBesideUngrouped] wrapping a *store.HeldError naming the
// holder (host, pid, since) when another ungrouped reconciler runs;
// [ErrBesideGroup] naming the live members when a group runs; the
// bucket's errors; a ttl below a second.
func HoldStream(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, ttl time.Duration, log *slog.Logger) (*store.Lease, error) {
	cfg = cfg.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if ttl < minLeaseTTL {
		return nil, fmt.Errorf("lease TTL %s: at least %s", ttl, minLeaseTTL)
	}
	// The bucket's open (a create, on a fresh stream) rides out a slow
	// or lost answer as JoinGroup's does (retryTransient): ctx is the
	// reconciler's, without a deadline, and its one request waited the
	// client's default 5 s, which an R3 bucket's creation on a loaded
	// cluster outlasted (Serve ended: "lease bucket MESH_LEASES: context
	// deadline exceeded"). The claim below may wait for a holder: not
	// bounded.
	var (
		kv        jetstream.KeyValue
		bucketTTL time.Duration
	)
	err := retryTransientEach(ctx, startRetryFor, func(ctx context.Context) (err error) {
		kv, bucketTTL, err = openLeaseBucket(ctx, js, cfg, ttl, log)
		return err
	})
	if err != nil {
		return nil, err
	}
	l, err := store.AcquireLeaseTTL(ctx, kv, bucketTTL, StreamLeaseKey, store.NewHolder("reconciler", cfg.Name), log)
	if errors.Is(err, store.ErrLeaseHeld) {
		return nil, fmt.Errorf("%w (stream %s): %w", ErrBesideUngrouped, cfg.Name, err)
	}
	if err != nil {
		return nil, err
	}
	// Members join before they look at this key (Group.Run), and this
	// lease is held before members are listed: one of the two sees the
	// other.
	members, err := liveMembers(ctx, kv)
	if err == nil && len(members) > 0 {
		err = fmt.Errorf("%w (stream %s; live members %s): stop them, or run this one with --group",
			ErrBesideGroup, cfg.Name, strings.Join(members, ", "))
	}
	if err != nil {
		_ = l.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return l, nil
}

// liveMembers lists the group members in kv, as "<group>/<instance>":
// the keys of a watch of member.> up to its initial values' end. The
// watch's consumer is deleted without waiting for the answer
// (ListKeysFiltered waited for it: a round trip of every ungrouped
// start, issue 27).
func liveMembers(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := kv.Watch(wctx, "member.>", jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, fmt.Errorf("lease bucket: %w", err)
	}
	defer func() {
		go func() {
			_ = w.Stop()
			for range w.Updates() {
			}
		}()
	}()
	var out []string
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("lease bucket: member watch closed before its initial values were done")
			}
			if e == nil {
				slices.Sort(out)
				return out, nil
			}
			out = append(out, strings.Replace(strings.TrimPrefix(e.Key(), "member."), ".", "/", 1))
		case <-ctx.Done():
			return nil, fmt.Errorf("lease bucket: %w", ctx.Err())
		}
	}
}

// keepMember puts the member key every TTL/4 until the returned stop is
// called (stop waits for the last put).
func (g *Group) keepMember(ctx context.Context) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(g.renewEvery())
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if err := g.putMember(ctx); err != nil {
					g.log.Warn("membership not renewed while waiting for the stream lease", "err", err)
				}
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// checkUngrouped refuses to join while an ungrouped reconciler holds the
// stream: it claims the stream key (waiting out a dead holder's, as
// HoldStream does) and releases it at once.
func (g *Group) checkUngrouped(ctx context.Context) error {
	l, err := store.AcquireLease(ctx, g.kv, StreamLeaseKey, store.NewHolder("reconciler", g.cfg.Stream.Name), g.log)
	if errors.Is(err, store.ErrLeaseHeld) {
		return fmt.Errorf("%w (stream %s): stop it before starting a group: %w", ErrBesideUngrouped, g.cfg.Stream.Name, err)
	}
	if err != nil {
		return err
	}
	return l.Release(context.WithoutCancel(ctx))
}
