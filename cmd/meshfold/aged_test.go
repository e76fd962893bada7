package main

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

// agedMesh is applyMesh's stream (wants of ace, bob and cat) with a
// reconciler that folded them, after which cat's events are removed
// from the stream, as serve --max-age removes a quiet node's: the
// reconciler's state still holds cat.
func agedMesh(t *testing.T) *mesh {
	t.Helper()
	m := applyMesh(t)
	r := m.serveReconciler(t)
	waitfor.Until(t, 30*time.Second, "the reconciler folded cat's want and plan", func() bool {
		st, ok := r.Node("cat")
		return ok && st.Want != nil && st.Emitted() != nil && st.Emitted().Seq != 0
	})
	// Every event before a new one of ace ages out, as the stream's
	// max-age removes the oldest.
	ack, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := m.js.Stream(testCtx(t), m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(testCtx(t), jetstream.WithPurgeSequence(ack.Seq)); err != nil {
		t.Fatal(err)
	}
	if info, err := stream.Info(testCtx(t), jetstream.WithSubjectFilter(m.cfg.Subjects().StoredNode("cat"))); err != nil || len(info.State.Subjects) != 0 || info.State.FirstSeq != ack.Seq {
		t.Fatalf("cat's events still in the stream after the purge, or the stream does not begin at #%d (%v)", ack.Seq, err)
	}
	return m
}

// A node whose events aged out of the stream (serve --max-age) while the
// reconciler's state holds it is no mistyped name: the verbs that check
// the stream for a node's event, or its want, ask the reconciler's state
// (a fresh user's finding U28: they refused it, exit 2, while `fleet`
// and `state` listed it). A name neither holds is still refused.
func TestVerbsTakeANodeWhoseEventsAgedOut(t *testing.T) {
	t.Parallel()
	m := agedMesh(t)
	want := writeWantFile(t, `{"modules":[{"name":"web","build":"web:3"}]}`)
	for _, args := range [][]string{
		{"want", "cat", "-f", want, "--dry-run"},
		{"pause", "cat", "--by", "alice"}, // the stream holds some event of it
		{"resume", "cat", "--by", "alice"},
		{"poke", "cat", "--by", "alice"}, // the stream holds a want of it
		{"apply", "-f", writeFleet(t, fleetYAML), "--dry-run"},
		{"retire", "cat", "--by", "alice"},
	} {
		if out, errs, code := m.cli(t, args...); code != 0 || strings.Contains(errs, "mistyped") {
			t.Errorf("meshfold %s: exit %d, want 0 (cat is in the reconciler's state)\n%s%s", strings.Join(args, " "), code, out, errs)
		}
	}
	// A want of it, even with --new, creates no node.
	if out, errs, code := m.cli(t, "want", "cat", "-f", want, "--new"); code != 0 || strings.Contains(errs, "created node") {
		t.Errorf("meshfold want cat --new: exit %d, want 0 without a 'created node' note\n%s%s", code, out, errs)
	}
	for _, args := range [][]string{
		{"pause", "dog", "--by", "alice"},
		{"poke", "dog", "--by", "alice"},
		{"want", "dog", "-f", want, "--dry-run"},
	} {
		if out, errs, code := m.cli(t, args...); code != exitUsage || !strings.Contains(errs, "mistyped") {
			t.Errorf("meshfold %s: exit %d, want %d (a name nothing holds)\n%s%s", strings.Join(args, " "), code, exitUsage, out, errs)
		}
	}
}

// audit of a node whose history aged out says where the stream begins
// and what the reconciler's state holds, exit 0: not "no events … (a
// mistyped name?)".
func TestAuditOfANodeWhoseHistoryAgedOut(t *testing.T) {
	t.Parallel()
	m := agedMesh(t)
	stream, err := m.js.Stream(testCtx(t), m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "audit", "cat")
	first := info.State.FirstSeq
	wantText := "cat's history before #" + seqArg(first) + " is gone (--max-age): the stream begins at #" + seqArg(first)
	flat := strings.Join(strings.Fields(strings.ReplaceAll(errs, "--    ", "")), " ")
	if code != 0 || !strings.Contains(flat, wantText) || !strings.Contains(flat, "'meshfold state cat'") || strings.Contains(errs, "mistyped") {
		t.Fatalf("audit cat: exit %d, want 0 saying %q\n%s%s", code, wantText, out, errs)
	}
	if _, errs, code := m.cli(t, "audit", "dog"); code != exitUsage || !strings.Contains(errs, "mistyped") {
		t.Fatalf("audit dog: exit %d, want %d (a mistyped name)\n%s", code, exitUsage, errs)
	}
}
