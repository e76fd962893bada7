package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/internal/atomicfile"
	"github.com/meshfold/meshfold/store"
)

// Sealed is the sealed-secrets source (DESIGN.md §12): the node's
// secrets in the bucket <stream>_SECRETS (store.OpenSecrets), each sealed
// to this provisioner's curve key, opened here and nowhere else. Create
// it with [NewSealed].
type Sealed struct {
	// Rotation: the key was created to replace the node's registered one
	// (`provision --new-key`), so registering over that one is expected
	// and logged at info; otherwise it is a warning (a tester's finding
	// G3).
	Rotation bool

	kv  jetstream.KeyValue
	key nkeys.KeyPair
	pub string
}

// NewSealed returns the sealed source over kv, opening with the curve key
// pair key (see [LoadCurveKey]).
func NewSealed(kv jetstream.KeyValue, key nkeys.KeyPair) (*Sealed, error) {
	pub, err := key.PublicKey()
	if err != nil {
		return nil, err
	}
	return &Sealed{kv: kv, key: key, pub: pub}, nil
}

func (s *Sealed) String() string { return "sealed" }

// PublicKey is the curve public key secrets must be sealed to.
func (s *Sealed) PublicKey() string { return s.pub }

// Content reads and opens node's secret for module's file path.
//
// Errors: [ErrNoSource] when none is stored; a [*RemovedError] when
// `secret rm` removed it (no later source is consulted); store.ErrSealedToOther,
// store.ErrCannotOpen (a secret that exists but does not open, or a
// record that does not decode: no later source is consulted either); the
// bucket's read failing, which keeps the later sources out too (it may
// hold a put: errSealedUnread).
func (s *Sealed) Content(ctx context.Context, node, module, path string) ([]byte, error) {
	content, _, err := s.read(ctx, node, module, path)
	return content, err
}

// sealedRead is which sealed secret a lookup read for a file: its
// revision in the bucket (a removal's too; 0: none stored or read) and
// its digest (the put's; "" for a removal).
type sealedRead struct {
	rev    uint64
	digest string
}

// read is [Sealed.Content], saying which secret it read.
func (s *Sealed) read(ctx context.Context, node, module, path string) ([]byte, sealedRead, error) {
	e, err := s.kv.Get(ctx, store.SecretKey(node, module, path))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, sealedRead{}, &NoSourceError{Where: "sealed " + store.SecretKey(node, module, path), Why: "no sealed secret"}
	}
	if err != nil {
		return nil, sealedRead{}, fmt.Errorf("sealed secret: %w: %w", errSealedUnread, err)
	}
	rd := sealedRead{rev: e.Revision()}
	rec, err := store.DecodeSealedSecret(e.Value())
	if err != nil {
		return nil, rd, err // store.ErrCannotOpen
	}
	if rec.Removed {
		return nil, rd, &RemovedError{Where: "sealed " + store.SecretKey(node, module, path), By: rec.By, At: rec.At}
	}
	rd.digest = rec.Digest
	content, err := rec.Open(s.key, node, module, path)
	return content, rd, err
}

// compare reads node's secret for module's file path and reports whether
// one is stored (a removal, a missing key or a failed read is not) and
// whether it opens to content; rec is the stored record (no content),
// rev its revision (0 when none was read).
func (s *Sealed) compare(ctx context.Context, node, module, path string, content []byte) (rec store.SealedSecret, rev uint64, same, stored bool) {
	e, err := s.kv.Get(ctx, store.SecretKey(node, module, path))
	if err != nil {
		return rec, 0, false, false
	}
	rev = e.Revision()
	rec, err = store.DecodeSealedSecret(e.Value())
	if err != nil || rec.Removed {
		return rec, rev, false, false
	}
	plain, err := rec.Open(s.key, node, module, path)
	if err != nil {
		return rec, rev, false, true
	}
	same = bytes.Equal(plain, content)
	clear(plain)
	return rec, rev, same, true
}

// Registration is what [Sealed.Register] found and did.
type Registration struct {
	// Changed: the key was put (none was registered, or another was).
	Changed bool
	// Replaced is the other public curve key the put replaced ("" when
	// none was registered, or this one was), and ReplacedAt when that
	// one was registered: a rotation's old key, or one registered with
	// this node's provisioner credential elsewhere (a tester's finding
	// G3), so the caller warns naming both.
	Replaced   string
	ReplacedAt time.Time
}

// Register publishes the public key under node's name in the bucket (a
// put only when it differs), so that `meshfold secret put` seals to it.
//
// Errors: the bucket's read or put.
func (s *Sealed) Register(ctx context.Context, node string) (Registration, error) {
	name := store.CurveKeyName(node)
	e, err := s.kv.Get(ctx, name)
	if err == nil && string(e.Value()) == s.pub {
		return Registration{}, nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return Registration{}, fmt.Errorf("read the registered key: %w", err)
	}
	var r Registration
	if err == nil && len(e.Value()) > 0 {
		r.Replaced, r.ReplacedAt = string(e.Value()), e.Created()
	}
	if _, err := s.kv.Put(ctx, name, []byte(s.pub)); err != nil {
		return Registration{}, fmt.Errorf("register the curve key: %w", err)
	}
	r.Changed = true
	return r, nil
}

// KeyFingerprint is how logs and hints name a public curve key: its
// first 12 characters, enough to tell two apart at a glance ("XA4B…").
// A public key is no secret; the fingerprint only keeps lines short.
func KeyFingerprint(pub string) string {
	if len(pub) > 12 {
		return pub[:12] + "…"
	}
	return pub
}

// watch calls changed with the module and path of every secret of node
// put or removed after the watch started, and keyChanged with the node's
// registered curve key ("" when deleted) and when it was written at every
// write of it, until ctx is done or the watch ends. ready is closed once
// the watch has started.
func (s *Sealed) watch(ctx context.Context, node string, ready chan<- struct{}, changed func(module, path string), keyChanged func(pub string, at time.Time)) error {
	w, err := s.kv.Watch(ctx, node+".>", jetstream.UpdatesOnly())
	close(ready)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			if e == nil {
				continue
			}
			if e.Key() == store.CurveKeyName(node) {
				pub := ""
				if e.Operation() == jetstream.KeyValuePut {
					pub = string(e.Value())
				}
				keyChanged(pub, e.Created())
				continue
			}
			if n, module, path, ok := store.ParseSecretKey(e.Key()); ok && n == node {
				changed(module, path)
			}
		}
	}
}

// ErrNotCurveSeed: a curve key file holds no curve seed.
var ErrNotCurveSeed = errors.New("not a curve seed")

// RegisteredKey returns the public curve key registered for node's
// provisioner in the secrets bucket kv and when it was registered (""
// when none is).
func RegisteredKey(ctx context.Context, kv jetstream.KeyValue, node string) (string, time.Time, error) {
	e, err := kv.Get(ctx, store.CurveKeyName(node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read the registered key: %w", err)
	}
	return string(e.Value()), e.Created(), nil
}

// LoadCurveKey returns the provisioner's curve key pair from the seed in
// file, creating it (mode 0600, its directory 0700, exclusively and
// whole, through internal/atomicfile) when missing.
//
// Errors: the file cannot be created or read; it is readable or writable
// by group or others; it holds no curve seed ([ErrNotCurveSeed]).
func LoadCurveKey(file string) (nkeys.KeyPair, error) {
	if _, err := os.Lstat(file); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
			return nil, fmt.Errorf("curve key: %w", err)
		}
		kp, err := nkeys.CreateCurveKeys()
		if err != nil {
			return nil, fmt.Errorf("curve key: %w", err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("curve key: %w", err)
		}
		err = atomicfile.Create(file, append(seed, '\n'), 0o600)
		if err == nil {
			return kp, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("curve key %s: %w", file, err)
		}
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("curve key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("curve key %s: mode %s: must not be accessible to group or others (chmod 0600)", file, fi.Mode().Perm())
	}
	seed, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("curve key: %w", err)
	}
	kp, err := nkeys.FromCurveSeed(bytes.TrimSpace(seed))
	if err != nil {
		return nil, fmt.Errorf("curve key %s: %w: %w", file, ErrNotCurveSeed, err)
	}
	return kp, nil
}

// watchSealed fills a declared file of the node as soon as its sealed
// secret is put or removed (DESIGN.md §12: no knock needed), restarting
// the watch with backoff when it ends, until ctx is done.
func (c *Client) watchSealed(ctx context.Context, s *Sealed, ready chan struct{}) {
	b := newBackoff()
	warned := "" // the foreign key last warned of: once per change
	keyChanged := func(pub string, at time.Time) {
		switch {
		case pub == s.pub:
			if warned != "" {
				c.log.Info("sealed secrets: this provisioner's curve key is registered again", "public_key", s.pub)
			}
			warned = ""
		case pub != warned:
			warned = pub
			// Someone registered another key for this node (or deleted
			// it): puts from now on are sealed to a key this provisioner
			// does not hold (a tester's finding G3: it said nothing).
			c.log.Warn("sealed secrets: the node's registered curve key is no longer this provisioner's: secrets put from now on are sealed to it, "+
				"and this provisioner cannot open them; if nobody rotated the key on purpose, check for a stolen provisioner credential "+
				"(restarting this provisioner registers its own key again)",
				"registered_key", KeyFingerprint(pub), "registered_at", at.UTC().Format(time.RFC3339), "public_key", s.pub)
		}
	}
	for ctx.Err() == nil {
		started := ready
		if started == nil {
			started = make(chan struct{})
		}
		ready = nil
		err := s.watch(ctx, c.cfg.Node, started, func(module, path string) { c.sealedChanged(ctx, module, path) }, keyChanged)
		if ctx.Err() != nil {
			return
		}
		d := b.NextBackOff()
		c.log.Warn("sealed secrets watch ended; restarting", "err", err, "in", d)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		// Whatever changed while no watch ran is filled by a pass.
		c.pass(ctx, 0)
	}
}

// sealedChanged fills one file whose sealed secret changed, when the
// newest plan this client filled declares it; a file not declared yet is
// filled when a plan declaring it settles.
func (c *Client) sealedChanged(ctx context.Context, module, path string) {
	c.fillMu.Lock()
	ref := FileRef{Module: module, Path: path}
	declared, r := c.declared.files[ref], Report{Plan: c.declared.plan}
	c.fillMu.Unlock()
	if !declared {
		c.log.Info("sealed secret changed for a file the plan does not declare: not filled", "module", module, "path", path)
		return
	}
	if err := c.fillFiles(ctx, &r, []FileRef{ref}, c.isDeclared); err != nil {
		return
	}
	msg := "sealed secret changed: filled"
	switch {
	case len(r.Filled)+len(r.Unchanged) == 0:
		msg = "sealed secret changed: not filled" // why was logged with the source's answer
	case len(r.Shadowed) > 0:
		msg = "sealed secret changed: shadowed by an earlier source (the node holds that source's content)"
	}
	c.log.Info(msg, "module", module, "path", path, "filled", len(r.Filled), "unchanged", len(r.Unchanged),
		"refused", len(r.Refused), "unfilled", len(r.Unfilled))
	c.onFill(0, r)
}
