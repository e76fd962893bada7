package reconcile_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// TestUnmarshalStateRoundTrip: every state of a long history comes back
// from its JSON form (the snapshot format, which `meshfold fleet` and a
// restart decode) exactly as it was, and a state breaking an invariant is
// refused. (It replaces cmd's TestDecodeStateMatches: fleet's own decoder
// is gone, it uses UnmarshalState.)
func TestUnmarshalStateRoundTrip(t *testing.T) {
	n := 0
	reconciletest.Scripted([]string{"ace", "novox"}, 300, 5, func(_ events.Event, st *reconcile.State) {
		data, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := reconcile.UnmarshalState(data)
		if err != nil {
			t.Fatal(err)
		}
		back, _ := json.Marshal(got)
		if string(back) != string(data) {
			t.Fatalf("UnmarshalState differs:\n got %s\nwant %s", back, data)
		}
		snap, err := reconcile.MarshalState(st)
		if err != nil {
			t.Fatal(err)
		}
		if got, err = reconcile.UnmarshalState(snap); err != nil {
			t.Fatal(err)
		}
		if back, _ = json.Marshal(got); string(back) != string(data) {
			t.Fatalf("UnmarshalState of MarshalState differs:\n got %s\nwant %s", back, data)
		}
		// AppendState writes the same bytes after whatever the buffer
		// holds, and leaves that alone.
		arena := []byte("before")
		if arena, err = reconcile.AppendState(arena, st); err != nil {
			t.Fatal(err)
		}
		if string(arena) != "before"+string(snap) {
			t.Fatalf("AppendState differs from MarshalState:\n got %s\nwant before%s", arena, snap)
		}
		shared, err := reconcile.UnmarshalStateShared(snap)
		if err != nil {
			t.Fatal(err)
		}
		if back, _ := json.Marshal(shared); string(back) != string(data) {
			t.Fatalf("UnmarshalStateShared differs:\n got %s\nwant %s", back, data)
		}
		n++
	})
	if _, err := reconcile.UnmarshalState([]byte(`{"node":"x","seq":1,"want":{"seq":5}}`)); err == nil {
		t.Error("a state breaking an invariant decoded")
	}
	if _, err := reconcile.UnmarshalStateShared([]byte(`{"node":"x","seq":1,"want":{"seq":5}}`)); err == nil {
		t.Error("a state breaking an invariant decoded (shared)")
	}
	if n < 300 {
		t.Fatalf("%d states", n)
	}
}

// TestSnapshotFormat: a snapshot says its format; one written before
// formats existed (testdata/snapshot_v0.json, node ace's snapshot in
// e2e/testdata/golden/2026-12-02T0049-55cf2a5, written by a build that had
// no format field) migrates to the same state; one of a newer format is
// refused with ErrSnapshotNewer, naming both formats, even when its shape
// changed (docs/operations.md, "Upgrading").
func TestSnapshotFormat(t *testing.T) {
	v0, err := os.ReadFile("testdata/snapshot_v0.json")
	if err != nil {
		t.Fatal(err)
	}
	v0 = bytes.TrimSpace(v0)
	if bytes.Contains(v0, []byte(`"format"`)) {
		t.Fatal("the format-0 fixture has a format field")
	}
	st, err := reconcile.UnmarshalState(v0)
	if err != nil {
		t.Fatalf("format 0: %v", err)
	}
	got, err := reconcile.MarshalState(st)
	if err != nil {
		t.Fatal(err)
	}
	// Written in format 1, the oldest that holds it (no failed re-apply):
	// a build of format 1 reads it.
	want := fmt.Sprintf(`{"format":1,%s`, v0[1:])
	if string(got) != want {
		t.Fatalf("format 0 migrated and written again:\n got %s\nwant %s", got, want)
	}
	back, err := reconcile.UnmarshalState(got)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := reconcile.MarshalState(back); string(again) != string(got) {
		t.Fatalf("format %d round trip:\n got %s\nwant %s", reconcile.SnapshotFormat, again, got)
	}

	// A failed re-apply of the settled plan (a failed apply at it) is
	// written in format 2, which a build of format 1, whose invariants
	// refused it ("not above the settled plan"), refuses as newer and
	// refolds from the stream; its summary says so too. This build reads
	// it back.
	st.Failed = []reconcile.FailedApply{{Module: "web", Plan: st.Settled.Seq, Seq: st.Seq, Error: "no build web:3"}}
	if err := st.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	reapply, err := reconcile.MarshalState(st)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(reapply, []byte(`{"format":2,`)) {
		t.Fatalf("a failed re-apply written as %.20s…, want format 2", reapply)
	}
	if _, err := reconcile.UnmarshalState(reapply); err != nil {
		t.Fatalf("format 2 read back: %v", err)
	}
	sum, err := reconcile.MarshalSummary(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, snapshot := reconcile.SummaryFormats(sum); snapshot != 2 {
		t.Errorf("a failed re-apply's summary names snapshot format %d, want 2", snapshot)
	}
	if _, err := reconcile.UnmarshalSummary(sum); err != nil {
		t.Errorf("its summary read back: %v", err)
	}

	newer := reconcile.SnapshotFormat + 1
	for _, data := range []string{
		fmt.Sprintf(`{"format":%d,"node":"ace","seq":57}`, newer),
		fmt.Sprintf(`{"format":%d,"node":{"name":"ace"},"seq":"57"}`, newer), // a newer shape
	} {
		_, err := reconcile.UnmarshalState([]byte(data))
		if !errors.Is(err, reconcile.ErrSnapshotNewer) {
			t.Fatalf("%s: err = %v, want ErrSnapshotNewer", data, err)
		}
		for _, v := range []string{fmt.Sprintf("format %d", newer), fmt.Sprintf("0 to %d", reconcile.SnapshotFormat)} {
			if !strings.Contains(err.Error(), v) {
				t.Errorf("%s: %q does not say %q", data, err, v)
			}
		}
	}
	if _, err := reconcile.UnmarshalState([]byte(`{"format":-1,"node":"ace"}`)); err == nil {
		t.Error("format -1 decoded")
	}
}
