package store_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// olderBuildAccepts is the subject check of a reconciler built before
// named operators (main at 4753e4b, store.adoptStream and kindShaped):
// a stream is adopted when every subject it captures beyond the build's
// own is "<prefix>.*.<kind>", a newer build's kind; anything else is
// ErrIncompatibleStream, and that reconciler does not start.
func olderBuildAccepts(prefix string, have, own []string) bool {
	for _, s := range have {
		if slices.Contains(own, s) {
			continue
		}
		kind, ok := strings.CutPrefix(s, prefix+".*.")
		if !ok || kind == "" || strings.ContainsAny(kind, ".*> ") {
			return false
		}
	}
	return len(have) > 0
}

// The upgrade path of named operators: a stream an older build created
// (no named patterns) stays exactly as it is when this build's
// reconciler, agents and CLI open it, so an older reconciler still
// adopts it; a named publish is not stored. Once an operator asks
// (CaptureNamed) the patterns are there, every partition's, a named
// publish is stored and read back with its name, and this build's
// EnsureStream keeps them; only then would an older reconciler refuse
// the stream (the order docs/operations.md gives).
func TestNamedOperatorsAreAnOperatorsStep(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)

	// The stream as the older build made it: its kinds, the rollout
	// subjects, the partition transform; no named patterns.
	subj := events.Subjects{Prefix: "mesh", Partitions: 4}
	older := append(subj.Input(), subj.RolloutInput())
	src, dst := subj.Transform()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "MESH", Subjects: older, SubjectTransform: &jetstream.SubjectTransformConfig{Source: src, Destination: dst},
		Storage: jetstream.FileStorage, AllowDirect: true, Duplicates: 2 * time.Minute, MaxMsgSize: store.MaxMsgSize,
	}); err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		s, err := js.Stream(ctx, "MESH")
		if err != nil {
			t.Fatal(err)
		}
		return sortedStrings(s.CachedInfo().Config.Subjects)
	}

	// This build's reconciler start (EnsureStream), agent and CLI
	// (OpenStream): nothing added.
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatalf("EnsureStream on the older build's stream: %v", err)
	}
	if _, _, err := store.OpenStream(ctx, js, store.StreamConfig{}); err != nil {
		t.Fatalf("OpenStream on the older build's stream: %v", err)
	}
	if got := subjects(); !slices.Equal(got, sortedStrings(older)) {
		t.Fatalf("this build's start changed the stream's subjects:\n got %v\nwant %v", got, sortedStrings(older))
	}
	if !olderBuildAccepts("mesh", subjects(), older) {
		t.Errorf("an older reconciler would refuse the stream after this build opened it: %v", subjects())
	}
	if store.CapturesNamed(stream, cfg) {
		t.Error("CapturesNamed on a stream without the named patterns")
	}
	alice := store.NewPublisher(js, cfg.Subjects()).As("alice")
	pause := func(by string) events.Payload {
		return events.Stamp(&events.Pause{By: by, Reason: "disk swap"}, time.Now())
	}
	if _, err := alice.Append(ctx, "ace", pause("alice")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("a named publish before the operator's step: %v, want no stream response (not captured)", err)
	}

	// The operator's step.
	added, err := store.CaptureNamed(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	named := append(subj.NamedInput(), subj.NamedRolloutInput())
	if !slices.Equal(added, named) {
		t.Errorf("CaptureNamed added %v, want %v", added, named)
	}
	if got, want := subjects(), sortedStrings(append(slices.Clone(older), named...)); !slices.Equal(got, want) {
		t.Errorf("after CaptureNamed the stream captures\n %v\nwant %v", got, want)
	}
	if again, err := store.CaptureNamed(ctx, js, store.StreamConfig{}); err != nil || len(again) != 0 {
		t.Errorf("CaptureNamed again: added %v, %v; want nothing", again, err)
	}
	stream, cfg, err = store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatalf("EnsureStream on a stream with the named patterns: %v", err)
	}
	if !store.CapturesNamed(stream, cfg) || !store.CapturesNamedRollouts(stream, cfg) {
		t.Errorf("EnsureStream dropped the named patterns: %v", subjects())
	}
	ack, err := alice.Append(ctx, "ace", pause("alice"))
	if err != nil {
		t.Fatalf("a named publish after the operator's step: %v", err)
	}
	m, err := store.LastMsg(ctx, stream, cfg.Subjects(), "ace", events.KindPause)
	if err != nil {
		t.Fatal(err)
	}
	_, _, by, err := cfg.Subjects().ParseBy(m.Subject)
	if err != nil || m.Event.Seq != ack.Seq || by != "alice" || m.Event.Payload.(*events.Pause).By != "alice" {
		t.Errorf("the named pause read back: seq %d (want %d) subject %s by %q %v", m.Event.Seq, ack.Seq, m.Subject, by, err)
	}
	// Why the order matters: an older reconciler refuses it now.
	if olderBuildAccepts("mesh", subjects(), older) {
		t.Error("the older build's check accepts the stream with the named patterns: the upgrade order would not matter")
	}
}

// CaptureNamed never creates the stream: only a reconciler does.
func TestCaptureNamedNeedsTheStream(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	if _, err := store.CaptureNamed(ctx, js, store.StreamConfig{}); !errors.Is(err, store.ErrNoStream) {
		t.Errorf("CaptureNamed without a stream: %v, want ErrNoStream", err)
	}
	if _, err := js.Stream(ctx, "MESH"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("CaptureNamed made a stream: %v", err)
	}
}

func sortedStrings(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// previousBuildAccepts is the subject check of the build before named
// rollout verbs (main at db00347, store.adoptStream and kindShaped): a
// newer build's kind, "<prefix>.*.<kind>", or a partition's named
// operator events, "<p>.<prefix>.*.*.*"; "<prefix>.rollout.*.*.*" is
// neither.
func previousBuildAccepts(prefix string, have, own []string) bool {
	for _, s := range have {
		if slices.Contains(own, s) {
			continue
		}
		kind, ok := strings.CutPrefix(s, prefix+".*.")
		if !ok {
			p, found := strings.CutSuffix(s, "."+prefix+".*.*.*")
			if _, err := strconv.Atoi(p); !found || err != nil {
				return false
			}
			continue
		}
		if kind == "" || strings.ContainsAny(kind, ".*> ") {
			return false
		}
	}
	return len(have) > 0
}

// A stream whose step the build before named rollout verbs took (the
// partitions' named patterns, not the rollouts'): this build's
// EnsureStream and OpenStream leave it as it is, so that build's
// reconciler still adopts it; it captures named operator events and not
// named rollout verbs (a named verb's publish is not stored); the step
// taken again adds the rollouts' pattern alone, which that build's check
// refuses: the reason enable-named asks every reconciler for
// named_rollouts first.
func TestNamedRolloutsAreAStepOfTheirOwn(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	subj := events.Subjects{Prefix: "mesh", Partitions: 4}
	previous := append(append(subj.Input(), subj.RolloutInput()), subj.NamedInput()...)
	src, dst := subj.Transform()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "MESH", Subjects: previous, SubjectTransform: &jetstream.SubjectTransformConfig{Source: src, Destination: dst},
		Storage: jetstream.FileStorage, AllowDirect: true, Duplicates: 2 * time.Minute, MaxMsgSize: store.MaxMsgSize,
	}); err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		s, err := js.Stream(ctx, "MESH")
		if err != nil {
			t.Fatal(err)
		}
		return sortedStrings(s.CachedInfo().Config.Subjects)
	}
	own := append(subj.Input(), subj.RolloutInput())
	if !previousBuildAccepts("mesh", subjects(), own) {
		t.Fatalf("the previous build's check refuses the stream its own step made: %v", subjects())
	}
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatalf("EnsureStream on the previous build's stepped stream: %v", err)
	}
	if got := subjects(); !slices.Equal(got, sortedStrings(previous)) {
		t.Fatalf("this build's start changed the stream's subjects:\n got %v\nwant %v", got, sortedStrings(previous))
	}
	if !store.CapturesNamed(stream, cfg) || store.CapturesNamedRollouts(stream, cfg) {
		t.Errorf("CapturesNamed %v, CapturesNamedRollouts %v: want true, false", store.CapturesNamed(stream, cfg), store.CapturesNamedRollouts(stream, cfg))
	}
	if _, err := js.Publish(ctx, subj.NamedRollout("web", "pause", "alice"), []byte(`{}`)); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("a named rollout verb before the step: %v, want no stream response (not captured)", err)
	}
	added, err := store.CaptureNamed(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{subj.NamedRolloutInput()}; !slices.Equal(added, want) {
		t.Errorf("CaptureNamed added %v, want %v", added, want)
	}
	if stream, cfg, err = store.EnsureStream(ctx, js, store.StreamConfig{}); err != nil {
		t.Fatalf("EnsureStream with the named rollouts' pattern: %v", err)
	}
	if !store.CapturesNamedRollouts(stream, cfg) {
		t.Errorf("EnsureStream dropped the named rollouts' pattern: %v", subjects())
	}
	if _, err := js.Publish(ctx, subj.NamedRollout("web", "pause", "alice"), []byte(`{}`)); err != nil {
		t.Errorf("a named rollout verb after the step: %v", err)
	}
	if previousBuildAccepts("mesh", subjects(), own) {
		t.Error("the previous build's check accepts the rollouts' pattern: enable-named's named_rollouts ask would not matter")
	}
}
