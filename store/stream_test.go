package store_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEnsureStreamIdempotentAndPartitioned(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, js := storetest.Start(t)

	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	wantCfg := store.StreamConfig{Name: "MESH", Prefix: "mesh", Partitions: 16, Replicas: 1, Duplicates: 2 * time.Minute}
	if cfg != wantCfg {
		t.Errorf("effective config = %+v, want %+v", cfg, wantCfg)
	}
	info := stream.CachedInfo().Config
	if info.Storage != jetstream.FileStorage || !info.AllowDirect || info.Discard != jetstream.DiscardOld || info.MaxAge != 0 {
		t.Errorf("stream config: storage %v, allow direct %v, discard %v, max age %v", info.Storage, info.AllowDirect, info.Discard, info.MaxAge)
	}

	// Again: no error, same config, nothing recreated.
	pub := store.NewPublisher(js, cfg.Subjects())
	ack, err := pub.Append(ctx, "ace", want("b1"))
	if err != nil {
		t.Fatal(err)
	}
	stream2, cfg2, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	if cfg2 != cfg {
		t.Errorf("second EnsureStream config = %+v, want %+v", cfg2, cfg)
	}
	if last, _ := store.StreamLastSeq(ctx, stream2); last != ack.Seq {
		t.Errorf("after second EnsureStream last seq = %d, want %d (stream recreated?)", last, ack.Seq)
	}

	// Stored under the partition token.
	p := events.Partition("ace", 16)
	raw, err := stream.GetMsg(ctx, ack.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d.mesh.ace.want", p); raw.Subject != want {
		t.Errorf("stored subject = %q, want %q", raw.Subject, want)
	}

	// The fill subject is not captured: a plain publish on it reaches no
	// stream. A JetStream publish there gets no stream response.
	if _, err := js.Publish(ctx, "mesh.ace.fill", []byte("secret")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("publish on mesh.ace.fill: err = %v, want no stream response", err)
	}
	if err := nc.Publish("mesh.ace.fill", []byte("secret")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	si, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if si.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1 (the want only)", si.State.Msgs)
	}
	for subj := range si.State.Subjects {
		if strings.HasSuffix(subj, ".fill") {
			t.Errorf("stream captured %q", subj)
		}
	}
}

func TestEnsureStreamAdoptsAndRefuses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)

	if _, _, err := store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	// Partitions 0 adopts the stream's count.
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Partitions != 4 {
		t.Errorf("adopted partitions = %d, want 4", cfg.Partitions)
	}
	// A different count is refused, and the stream is left alone.
	_, _, err = store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 16})
	if !errors.Is(err, store.ErrIncompatibleStream) {
		t.Fatalf("EnsureStream with 16 partitions on a 4-partition stream: err = %v, want ErrIncompatibleStream", err)
	}
	if !strings.Contains(err.Error(), "partitions") {
		t.Errorf("error %q does not say the partitions differ", err)
	}
	// A different prefix is refused too.
	_, _, err = store.EnsureStream(ctx, js, store.StreamConfig{Prefix: "other"})
	if !errors.Is(err, store.ErrIncompatibleStream) || !strings.Contains(err.Error(), "subjects") {
		t.Errorf("EnsureStream with another prefix: err = %v, want ErrIncompatibleStream about subjects", err)
	}
	// Each names, for the caller's message, what to give instead.
	var ie *store.IncompatibleError
	if !errors.As(err, &ie) || ie.Stream != "MESH" || ie.Prefix != "mesh" || ie.Asked != "other" {
		t.Errorf("EnsureStream with another prefix: %#v, want the stream's prefix mesh", ie)
	}
	_, _, err = store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 16})
	if !errors.As(err, &ie) || ie.Prefix != "" || ie.Partitions != 4 || ie.AskedPartitions != 16 {
		t.Errorf("EnsureStream with 16 partitions: %#v, want the stream's 4", ie)
	}
	if _, _, err := store.OpenStream(ctx, js, store.StreamConfig{Prefix: "other"}); !errors.As(err, &ie) || ie.Prefix != "mesh" {
		t.Errorf("OpenStream with another prefix: %v, want the stream's prefix mesh", err)
	}
	// Allowed changes are applied.
	_, cfg, err = store.EnsureStream(ctx, js, store.StreamConfig{Duplicates: 5 * time.Minute, MaxAge: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "MESH")
	if err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.Duplicates != 5*time.Minute || got.MaxAge != 24*time.Hour || cfg.Duplicates != 5*time.Minute || cfg.MaxAge != 24*time.Hour {
		t.Errorf("after update: stream dup %v age %v, effective %+v", got.Duplicates, got.MaxAge, cfg)
	}
	if n, _ := partitionsOf(s); n != 4 {
		t.Errorf("partitions after update = %d, want 4", n)
	}
}

// A stream an older build made, capturing fewer kinds, gains the new
// ones (the operator kinds of DESIGN.md §9) and keeps its events.
func TestEnsureStreamAddsNewKinds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "MESH")
	if err != nil {
		t.Fatal(err)
	}
	old := s.CachedInfo().Config
	old.Subjects = slices.DeleteFunc(slices.Clone(old.Subjects), func(x string) bool { return strings.HasSuffix(x, ".pause") || strings.HasSuffix(x, ".retire") })
	if _, err := js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, cfg.Subjects().Event("ace", events.KindPause), []byte(`{}`)); err == nil {
		t.Fatal("the narrowed stream captures pause")
	}
	if _, _, err := store.EnsureStream(ctx, js, store.StreamConfig{}); err != nil {
		t.Fatalf("EnsureStream on an older stream: %v", err)
	}
	if _, err := js.Publish(ctx, cfg.Subjects().Event("ace", events.KindPause), []byte(`{}`)); err != nil {
		t.Fatalf("after EnsureStream the stream does not capture pause: %v", err)
	}
}

// A stream a newer build made captures a kind this build does not know
// (a rollback, or a group member not yet upgraded): it is adopted, and
// keeps that kind, so the newer agents' events are still stored.
func TestEnsureStreamKeepsNewerKinds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "MESH")
	if err != nil {
		t.Fatal(err)
	}
	newer := s.CachedInfo().Config
	future := cfg.Prefix + ".*.futurekind"
	if cfg.Prefix == "" {
		future = events.DefaultPrefix + ".*.futurekind"
	}
	// And one this build knows is missing: it is added beside the newer one.
	newer.Subjects = append(slices.DeleteFunc(slices.Clone(newer.Subjects), func(x string) bool { return strings.HasSuffix(x, ".pause") }), future)
	if _, err := js.UpdateStream(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.EnsureStream(ctx, js, store.StreamConfig{}); err != nil {
		t.Fatalf("EnsureStream on a newer build's stream: %v", err)
	}
	s, err = js.Stream(ctx, "MESH")
	if err != nil {
		t.Fatal(err)
	}
	subjects := s.CachedInfo().Config.Subjects
	if !slices.Contains(subjects, future) {
		t.Errorf("the newer kind's subject was dropped: %v", subjects)
	}
	if _, err := js.Publish(ctx, cfg.Subjects().Event("ace", events.KindPause), []byte(`{}`)); err != nil {
		t.Errorf("the missing kind was not added: %v", err)
	}
}

func partitionsOf(s jetstream.Stream) (int, error) {
	var n int
	_, err := fmt.Sscanf(s.CachedInfo().Config.SubjectTransform.Destination, "{{partition(%d,1)}}", &n)
	return n, err
}

func TestEnsureStreamRefusesForeignStream(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MESH", Subjects: []string{"mesh.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	_, _, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if !errors.Is(err, store.ErrIncompatibleStream) {
		t.Fatalf("err = %v, want ErrIncompatibleStream", err)
	}
	for _, what := range []string{"transform", "subjects", "storage"} {
		if !strings.Contains(err.Error(), what) {
			t.Errorf("error %q does not mention %s", err, what)
		}
	}
	if _, err := js.Stream(ctx, "MESH"); err != nil {
		t.Errorf("foreign stream gone: %v", err)
	}
}

// TestOversizedRefusedAtTheDoor: an event over events.MaxEventBytes is
// refused to its publisher at once with the server's error (Permanent),
// and nothing is stored; a stream made before the limit gains it at the
// next EnsureStream (issue 25, item 4).
func TestOversizedRefusedAtTheDoor(t *testing.T) {
	// Not parallel: it times the refusal against 1 s.
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	s, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxMsgSize; got != events.MaxEventBytes {
		t.Fatalf("max message size %d, want %d", got, events.MaxEventBytes)
	}
	// An older stream: no limit of its own.
	old := s.CachedInfo().Config
	old.MaxMsgSize = -1
	if _, err := js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if s, _, err = store.EnsureStream(ctx, js, store.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxMsgSize; got != events.MaxEventBytes {
		t.Fatalf("an older stream adopted: max message size %d, want %d", got, events.MaxEventBytes)
	}
	subj := cfg.Subjects().Event("ace", events.KindWant)
	start := time.Now()
	_, err = js.Publish(ctx, subj, make([]byte, events.MaxEventBytes+1))
	if !store.Permanent(err) {
		t.Fatalf("oversized publish: %v, want the server's maximum message size error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refused after %s, not at once", d)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("%d messages stored", info.State.Msgs)
	}
	// An event at the limit is stored.
	if _, err := js.Publish(ctx, subj, make([]byte, events.MaxEventBytes-64)); err != nil {
		t.Errorf("an event under the limit: %v", err)
	}
}
