package rollout

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A view's params encode with the fleet file's names and forms
// (snake_case, durations as "5s"), and decode back; the resolved params
// the state stores (Rollout.R) keep their encoding, so a stored state
// decodes as before (a fresh user's finding U3: Go's field names and
// nanoseconds in 'rollout status -o json').
func TestViewParamsJSON(t *testing.T) {
	r := Resolved{Batch: 2, MaxUnavailable: 1, Canary: 1, MinHealthy: 5 * time.Second, HealthyDeadline: time.Minute, AutoRevert: true}
	b, err := json.Marshal(View{Params: ViewParams(r)})
	if err != nil {
		t.Fatal(err)
	}
	const want = `"params":{"batch":2,"max_unavailable":1,"canary":1,"min_healthy":"5s","healthy_deadline":"1m0s","auto_revert":true}`
	if !strings.Contains(string(b), want) {
		t.Errorf("view JSON:\n%s\nwant it to hold\n%s", b, want)
	}
	var v View
	if err := json.Unmarshal(b, &v); err != nil || Resolved(v.Params) != r {
		t.Errorf("decoded %+v (%v), want %+v", v.Params, err, r)
	}
	old := []byte(`{"resolved":{"Batch":2,"MaxUnavailable":1,"Canary":1,"MinHealthy":5000000000,"HealthyDeadline":60000000000,"AutoRevert":true}}`)
	var ro Rollout
	if err := json.Unmarshal(old, &ro); err != nil || ro.R != r {
		t.Errorf("a stored rollout's resolved params decode as %+v (%v), want %+v", ro.R, err, r)
	}
	if b, _ := json.Marshal(Rollout{R: r}); !strings.Contains(string(b), `"resolved":{"Batch":2,"MaxUnavailable":1,"Canary":1,"MinHealthy":5000000000`) {
		t.Errorf("a rollout's resolved params encode otherwise than before: %s", b)
	}
}

// A target's revert reads after its status without a stutter: "failed;
// reverted", not "failed, revert reverted" (a fresh user's finding U5).
func TestBackText(t *testing.T) {
	for st, want := range map[Status]string{RevertDone: "reverted", RevertChanging: "reverting", RevertQueued: "revert queued", RevertFailed: "revert failed"} {
		if got := (&Back{Status: st}).Text(); got != want {
			t.Errorf("%s: %q, want %q", st, got, want)
		}
	}
}
