package reconcile_test

import (
	"encoding/json"
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
		n++
	})
	if _, err := reconcile.UnmarshalState([]byte(`{"node":"x","seq":1,"want":{"seq":5}}`)); err == nil {
		t.Error("a state breaking an invariant decoded")
	}
	if n < 300 {
		t.Fatalf("%d states", n)
	}
}
