package reconcile_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// fill sets every field of v, recursively, to a value of its own
// (strings, numbers, times at UTC and at other offsets, two elements a
// list, pointers to filled values); n numbers them.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d-é", *n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint64:
		v.SetUint(uint64(1000 + *n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Bool:
		v.SetBool(*n%2 == 0)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), n)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), n)
		}
		v.Set(s)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			zones := []*time.Location{time.UTC, time.FixedZone("", 2*3600), time.FixedZone("X", -(5*3600 + 30*60))}
			v.Set(reflect.ValueOf(time.Unix(1_790_000_000+int64(*n)*61, int64(*n)*1001).In(zones[*n%len(zones)])))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n)
			}
		}
	default:
		panic("fill: " + v.Kind().String())
	}
}

// jsonOf is v as encoding/json writes it: what a fleet row prints of its
// fields (times in RFC 3339 at their offsets).
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSummaryBinaryCoversView checks that format 2 of the fleet summary
// carries every field of a view's summary (View.FleetSummary), each set:
// a field added to the view, or to a type it holds, fails here until
// the format writes it (summarybin.go; bump reconcile.SummaryFormat).
func TestSummaryBinaryCoversView(t *testing.T) {
	for _, seed := range []int{0, 1, 2} {
		var v reconcile.View
		n := seed
		fill(reflect.ValueOf(&v).Elem(), &n)
		// What FleetSummary keeps of the holds and the runtime.
		v.Holds[0].Why = events.HoldApproval
		v.Runtime[0].State = events.Failed
		v.Runtime[1].State, v.Runtime[1].Health = events.Running, events.Unhealthy
		want := v.FleetSummary()
		if len(want.Holds) != 1 || len(want.Runtime) != 2 {
			t.Fatalf("the filled view's summary keeps %d holds, %d runtimes", len(want.Holds), len(want.Runtime))
		}
		// FleetSummary clears the accounts and the owed items' errors;
		// set here, the format must carry them once it keeps them.
		want.ProvisionerAccount, want.RunningAccount, want.OwedWhy = "pa", "ra", []string{"", "why"}
		b := reconcile.MarshalSummaryView(want)
		got, err := reconcile.UnmarshalSummary(b)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		// The accounts are not in format 2: a row does not read them.
		got.ProvisionerAccount, got.RunningAccount = want.ProvisionerAccount, want.RunningAccount
		if g, w := jsonOf(t, got), jsonOf(t, want); g != w {
			t.Fatalf("seed %d: format 2 does not carry the whole summary:\n got %s\nwant %s", seed, g, w)
		}
		for i := range b {
			if b[i] < 0x20 || b[i] >= 0x7f {
				t.Fatalf("byte %d of a summary is %#x, not printable ASCII", i, b[i])
			}
		}
		// Cut short, or with a byte changed: an error or another view,
		// never a panic.
		for i := range len(b) {
			if _, err := reconcile.UnmarshalSummary(b[:i]); err == nil {
				t.Fatalf("seed %d: cut at %d of %d: no error", seed, i, len(b))
			}
			c := []byte(string(b))
			c[i] ^= 0x5
			reconcile.UnmarshalSummary(c)
		}
	}
}

// TestSummaryFormats checks that a summary of format 1 (JSON, as builds
// before format 2 wrote it) reads as the same view as the same state's
// summary of this build's format, over the bench's scripted mix, and that
// a summary of another format is refused with ErrSummaryFormat.
func TestSummaryFormats(t *testing.T) {
	names := make([]string, 300)
	for i := range names {
		names[i] = fmt.Sprintf("n%03d", i)
	}
	s := reconciletest.Scripted(names, 20*len(names), 17, nil)
	var size1, size2 int
	for _, name := range names {
		st := s.State(name)
		b1, err := reconcile.MarshalSummaryJSON(st)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := reconcile.MarshalSummary(st)
		if err != nil {
			t.Fatal(err)
		}
		size1, size2 = size1+len(b1), size2+len(b2)
		v1, err := reconcile.UnmarshalSummary(b1)
		if err != nil {
			t.Fatalf("%s: format 1: %v", name, err)
		}
		v2, err := reconcile.UnmarshalSummary(b2)
		if err != nil {
			t.Fatalf("%s: format 2: %v", name, err)
		}
		if g, w := jsonOf(t, v2), jsonOf(t, v1); g != w {
			t.Fatalf("%s: format 2 reads\n%s\nformat 1\n%s", name, g, w)
		}
		if w := jsonOf(t, st.View().FleetSummary()); jsonOf(t, v2) != w {
			t.Fatalf("%s: format 2 reads\n%s\nthe view's summary is\n%s", name, jsonOf(t, v2), w)
		}
	}
	t.Logf("%d summaries: format 1 %d B each, format 2 %d B", len(names), size1/len(names), size2/len(names))
	for _, b := range []string{
		`{"format":3,"snapshot":1,"node":"a"}`,
		`{"format":1,"snapshot":9,"node":"a"}`,
		`7:AAAA`,
		`2` + strings.Repeat("A", 8),
	} {
		if _, err := reconcile.UnmarshalSummary([]byte(b)); !errors.Is(err, reconcile.ErrSummaryFormat) {
			t.Errorf("%s: %v, want ErrSummaryFormat", b, err)
		}
	}
	if _, err := reconcile.UnmarshalSummary(append([]byte("2:"), "AQ"...)); err == nil || errors.Is(err, reconcile.ErrSummaryFormat) {
		t.Errorf("a summary cut short: %v, want a decode error", err)
	}
	// A time RFC 3339 cannot say (format 1 could not hold one) is a
	// summary that does not decode: a row could not print it.
	for _, at := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 25*3600)),
	} {
		if _, err := reconcile.UnmarshalSummary(reconcile.MarshalSummaryView(reconcile.View{Node: "a", HaveSeq: 1, HaveTime: at})); err == nil {
			t.Errorf("have time %s: decoded", at)
		}
	}
	for _, at := range []time.Time{
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", -(23*3600+59*60))),
	} {
		v, err := reconcile.UnmarshalSummary(reconcile.MarshalSummaryView(reconcile.View{Node: "a", HaveSeq: 1, HaveTime: at}))
		if err != nil || !v.HaveTime.Equal(at) {
			t.Errorf("have time %s: %s, %v", at, v.HaveTime, err)
		}
	}
}

// TestSummaryFormat4: a summary of format 4 (the build before each
// missing file's at_start wrote it so: format4 below, a golden of that
// build's MarshalSummaryView) reads as this build's summary of the same
// view, its missing files not gone at the agent's start; format 5 keeps
// one that was.
func TestSummaryFormat4(t *testing.T) {
	const format4 = "4:BAEGYWNlDAAAAAAAAAAACQGAsZyxDQAAAAAAAAAAAgZhcHAWL3J1bi9hcHAvY2ELAYKxnLENAAMcL3J1bi9hcHAvdG9rZW4JAYCxnLENAA"
	at := time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)
	v := reconcile.View{Node: "ace", Seq: 12, HaveSeq: 9, HaveTime: at,
		Missing: []reconcile.MissingFile{{Module: "app", Path: "/run/app/ca", Seq: 11, Time: at.Add(time.Second)}, {Module: "app", Path: "/run/app/token", Seq: 9, Time: at}}}
	got, err := reconcile.UnmarshalSummary([]byte(format4))
	if err != nil {
		t.Fatalf("format 4: %v", err)
	}
	want, err := reconcile.UnmarshalSummary(reconcile.MarshalSummaryView(v))
	if err != nil {
		t.Fatal(err)
	}
	if g, w := jsonOf(t, got), jsonOf(t, want); g != w || len(got.Missing) != 2 {
		t.Fatalf("format 4 reads\n%s\nformat %d\n%s", g, reconcile.SummaryFormat, w)
	}
	v.Missing[1].AtStart = true
	v5, err := reconcile.UnmarshalSummary(reconcile.MarshalSummaryView(v))
	if err != nil || v5.Missing[0].AtStart || !v5.Missing[1].AtStart {
		t.Fatalf("format %d: %+v, %v; want the token gone at the agent's start", reconcile.SummaryFormat, v5.Missing, err)
	}
}

// TestSummaryFormat6: a view with no noisy episode is written in format 5,
// byte for byte as the build before format 6 wrote it (format5 below, a
// golden of that build's MarshalSummaryView), so an older reader reads it
// as before; one with an episode is written in format 6, which an older
// reader refuses (its TestSummaryFormats: "6:AAAA" is ErrSummaryFormat)
// and reads the node's snapshot instead, and this build reads whole.
func TestSummaryFormat6(t *testing.T) {
	const format5 = "5:BAEGYWNlzQcAAAAAAAAAQM0HAYCxnLENAAAAAAAAAADeBwGAsZyxDQAGb3Bz1AcBBmFwcBYvcnVuL2FwcC9jYQkBgLGcsQ0AAQ"
	at := time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)
	v := reconcile.View{Node: "ace", Seq: 973, HaveSeq: 973, HaveTime: at,
		Missing: []reconcile.MissingFile{{Module: "app", Path: "/run/app/ca", Seq: 9, Time: at, AtStart: true}},
		Ack:     &reconcile.AckRecord{Seq: 990, Time: at, By: "ops", Upto: 980}}
	if got := string(reconcile.MarshalSummaryView(v)); got != format5 {
		t.Fatalf("a view with no episode:\n%s\nthe build before wrote\n%s", got, format5)
	}
	v.Noisy = &reconcile.NoisyRecord{Seq: 578, Since: at.Add(-77 * time.Millisecond), SinceSeq: 568, LastSeq: 973, Last: at.Add(2800 * time.Millisecond),
		Traffic: reconcile.Traffic{Haves: 401, Bytes: 80_000_000}, Warned: reconcile.Traffic{Haves: 353}}
	want := v.FleetSummary()
	if want.Noisy.Warned != (reconcile.Traffic{}) || v.Noisy.Warned.Haves != 353 {
		t.Fatalf("FleetSummary keeps the episode's warned %+v (and the view's is %+v)", want.Noisy.Warned, v.Noisy.Warned)
	}
	b := reconcile.MarshalSummaryView(want)
	if !strings.HasPrefix(string(b), "6:") {
		t.Fatalf("a view with an episode written as %.2s", b)
	}
	got, err := reconcile.UnmarshalSummary(b)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := jsonOf(t, got), jsonOf(t, want); g != w {
		t.Fatalf("format 6 reads\n%s\nwant\n%s", g, w)
	}
}
