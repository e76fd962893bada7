package store_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

func TestLastMsg(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	subj := cfg.Subjects()

	if _, err := store.LastMsg(ctx, stream, subj, "ace", events.KindKnock); !errors.Is(err, store.ErrNoMessage) {
		t.Fatalf("no knock yet: err = %v, want ErrNoMessage", err)
	}
	var last store.Ack
	for i := range 3 {
		a, err := pub.Append(ctx, "ace", journal(fmt.Sprint("j", i)), store.WithMsgID(fmt.Sprintf("ace.journal.%d.0", i)))
		if err != nil {
			t.Fatal(err)
		}
		last = a
		// Other nodes and kinds in between.
		if _, err := pub.Append(ctx, "shanks", journal("other")); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Append(ctx, "ace", want("b")); err != nil {
			t.Fatal(err)
		}
	}
	m, err := store.LastMsg(ctx, stream, subj, "ace", events.KindJournal)
	if err != nil {
		t.Fatal(err)
	}
	if m.Event.Seq != last.Seq || m.MsgID != "ace.journal.2.0" || m.Event.Node != "ace" || m.Event.Kind != events.KindJournal || m.Event.Err != nil {
		t.Errorf("LastMsg = %+v (id %q), want seq %d id ace.journal.2.0", m.Event, m.MsgID, last.Seq)
	}
	if j, ok := m.Event.Payload.(*events.Journal); !ok || j.Msg != "j2" {
		t.Errorf("payload = %#v", m.Event.Payload)
	}
	if want := subj.Stored("ace", events.KindJournal); m.Subject != want {
		t.Errorf("subject = %q, want %q", m.Subject, want)
	}
	if _, err := store.LastMsg(ctx, stream, subj, "novox", events.KindJournal); !errors.Is(err, store.ErrNoMessage) {
		t.Errorf("other node: err = %v, want ErrNoMessage", err)
	}
}

func TestListNodes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	subj := cfg.Subjects()
	if nodes, err := store.ListNodes(ctx, stream, subj, "*"); err != nil || len(nodes) != 0 {
		t.Fatalf("empty stream: %v, %v", nodes, err)
	}
	for _, n := range []string{"shanks", "ace", "novox"} {
		if _, err := pub.Append(ctx, n, journal("j")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Append(ctx, "ace", want("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Append(ctx, "ace", want("c")); err != nil {
		t.Fatal(err)
	}
	all, err := store.ListNodes(ctx, stream, subj, "*")
	if err != nil || !slices.Equal(all, []string{"ace", "novox", "shanks"}) {
		t.Errorf("every node: %v, %v", all, err)
	}
	wanted, err := store.ListNodes(ctx, stream, subj, events.KindWant)
	if err != nil || !slices.Equal(wanted, []string{"ace"}) {
		t.Errorf("nodes with a want: %v, %v", wanted, err)
	}
}

func TestReadNode(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	subj := cfg.Subjects()

	var aceSeqs []uint64
	for i := range 20 {
		a, err := pub.Append(ctx, "ace", journal(fmt.Sprint("ace ", i)))
		if err != nil {
			t.Fatal(err)
		}
		aceSeqs = append(aceSeqs, a.Seq)
		if _, err := pub.Append(ctx, "shanks", journal("s")); err != nil {
			t.Fatal(err)
		}
	}
	// A malformed message of ace's, published around the validation.
	if _, err := js.Publish(ctx, "mesh.ace.have", []byte(`{"v":1,"modules":"nope"}`)); err != nil {
		t.Fatal(err)
	}
	bad, err := store.StreamLastSeq(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	aceSeqs = append(aceSeqs, bad)

	read := func(from, to uint64) []store.Msg {
		t.Helper()
		var got []store.Msg
		if err := store.ReadNode(ctx, js, cfg.Name, subj, "ace", from, to, func(m store.Msg) error {
			got = append(got, m)
			return nil
		}); err != nil {
			t.Fatalf("ReadNode(%d, %d): %v", from, to, err)
		}
		return got
	}
	seqs := func(ms []store.Msg) []uint64 {
		var out []uint64
		for _, m := range ms {
			if m.Event.Node != "ace" {
				t.Errorf("read an event of %q", m.Event.Node)
			}
			out = append(out, m.Event.Seq)
		}
		return out
	}

	all := read(0, 0)
	if got := seqs(all); fmt.Sprint(got) != fmt.Sprint(aceSeqs) {
		t.Errorf("all of ace = %v, want %v", got, aceSeqs)
	}
	if m := all[len(all)-1]; m.Event.Err == nil || m.Event.Payload != nil || m.Event.Kind != events.KindHave {
		t.Errorf("malformed have: %+v, want delivered with Err set", m.Event)
	}
	if got := seqs(read(aceSeqs[5], aceSeqs[9])); fmt.Sprint(got) != fmt.Sprint(aceSeqs[5:10]) {
		t.Errorf("range = %v, want %v", got, aceSeqs[5:10])
	}
	if got := read(bad+1, 0); len(got) != 0 {
		t.Errorf("past the end: %d messages", len(got))
	}
	if err := store.ReadNode(ctx, js, cfg.Name, subj, "novox", 0, 0, func(store.Msg) error {
		t.Error("novox has no events")
		return nil
	}); err != nil {
		t.Error(err)
	}

	// fn's error ends the read and is returned.
	stop := errors.New("stop")
	n := 0
	err = store.ReadNode(ctx, js, cfg.Name, subj, "ace", 0, 0, func(store.Msg) error {
		n++
		if n == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 3 {
		t.Errorf("err = %v after %d messages, want stop after 3", err, n)
	}
}
