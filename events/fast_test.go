package events

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"
)

// fastKinds are the kinds the fast path reads.
var fastKinds = []Kind{KindHave, KindSettle, KindRefusal, KindFilled, KindWant, KindPlan, KindKnock}

// fastSeeds are payloads of every field the fast path reads, encoded as
// Encode writes them, and a few ways of writing them it must decline or
// read alike.
func fastSeeds(t testing.TB) [][]byte {
	at := time.Date(2026, 11, 3, 20, 50, 0, 123456000, time.UTC)
	since := at.Add(-time.Hour)
	ps := []Payload{
		&Have{Modules: []HaveModule{
			{Name: "pg", Build: "pg:1", State: Running, Account: "postgres", Restarts: 3, FillRestarts: 1, Exit: "status 1", Since: &since, Health: Healthy},
			{Name: "x", State: Stopped},
		}},
		&Have{Modules: []HaveModule{}},
		&Settle{Module: "pg", Op: OpFailed, Plan: 7, Error: "boom"},
		&Refusal{Module: "pg", Path: "/etc/x", Reason: ReasonWrongAccount, Plan: 3, Writer: "prov", Error: "e"},
		&Filled{Module: "pg", Path: "/etc/x", Plan: 3, Digest: "ab", Claim: "Wq3mYk0xGvJ9cJ1tXbR2aP"},
		&Want{Modules: []WantModule{{Name: "pg", Build: "b", RunsAs: "pg", Files: []File{{Path: "/a", Mode: "0600"}, {Path: "/b", Mode: "644"}}, Provisioner: true, RequiresApproval: true, Hold: true}}},
		&Want{Modules: []WantModule{}},
		&Plan{Cause: 9, Want: 8, ProvisionerAccount: "prov", Modules: []PlanModule{
			{Name: "pg", Build: "b", RunsAs: "pg", Files: []File{}, Provisioner: true},
			{Name: "q", RunsAs: "q", Files: []File{{Path: "/a", Mode: "0600"}}, Held: true, Why: HoldApproval, Pending: "c"},
		}},
		// Rows without files, as compose emits them: "files":null.
		&Plan{Cause: 9, Want: 8, Modules: []PlanModule{{Name: "prov", Build: "p:1", Provisioner: true}, {Name: "pg", Build: "b", RunsAs: "pg"}}},
		&Want{Modules: []WantModule{{Name: "pg", Build: "b", RunsAs: "pg"}}},
		&Knock{Cause: 5, Reasons: []KnockReason{KnockAccount, KnockDeclared}, Owed: []Owed{{Module: "pg", Path: "/a", Reason: ReasonNoAccount, Plan: 2, Writer: "w"}}},
		&Knock{Cause: 5, Reasons: []KnockReason{KnockOperator}, Owed: []Owed{}},
		&Have{Modules: []HaveModule{{Name: "x", State: Stopped}}, NoPlan: true},
	}
	var out [][]byte
	for _, p := range ps {
		data, err := Encode(Stamp(p, at))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	return append(out,
		[]byte(`{"v":1,"at":"2026-11-03T20:50:00Z","modules":null}`),
		// A want as a build before the gate wrote it, and one with gates
		// first.
		[]byte(`{"v":1,"at":"2026-11-03T20:50:00Z","modules":[{"name":"a","build":"b","requires_approval":true}]}`),
		[]byte(`{"gates":true,"v":1,"at":"2026-11-03T20:50:00Z","modules":[{"name":"a","build":"b","requires_approval":true}]}`),
		[]byte(`{"v":1,"at":"2026-11-03T20:50:00Z","modules":[{"name":"a","files":null ,"runs_as":"x"},{"files":nul}]}`),
		[]byte(`{"v":1,"at":"2026-11-03T20:50:00Z","modules":[{"name":"a","files":nullx}]}`),
		[]byte(`{"v":1,"at":"2026-11-03T20:50:00Z","modules":[],"modules":[{"name":"a"}]}`),
		[]byte(` { "v" : 1 , "at" : "2026-02-29T20:50:00.5Z" , "module" : "a\u0062" } `),
		[]byte(`{"V":1,"at":"2024-02-29T24:00:00Z","plan":012,"op":"apply"}`),
		[]byte(`{"v":1,"at":"2026-11-03T20:50:00+01:00","plan":1e3}`),
		[]byte(`{"v":2,"at":"2026-11-03T20:50:00.1234567891Z","cause":18446744073709551615}`),
	)
}

// FuzzFastDecode holds the fast path to the general decoder: whatever it
// reads, the general decoder reads without error into an equal payload.
func FuzzFastDecode(f *testing.F) {
	for _, data := range fastSeeds(f) {
		for i := range fastKinds {
			f.Add(uint8(i), data)
		}
	}
	f.Fuzz(func(t *testing.T, ki uint8, data []byte) {
		k := fastKinds[int(ki)%len(fastKinds)]
		in := append([]byte(nil), data...)
		got, ok := fastDecode(k, in, nil)
		strs := &Decoder{Strings: map[string]string{}, Max: 4}
		got2, ok2 := fastDecode(k, in, strs)
		if ok != ok2 || (ok && !reflect.DeepEqual(got, got2)) {
			t.Fatalf("with a Decoder's strings: %v %#v, without: %v %#v", ok2, got2, ok, got)
		}
		if !ok {
			return
		}
		want := New(k)
		if err := json.Unmarshal(data, want); err != nil {
			t.Fatalf("fast path read %q, the general decoder says %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nfast    %#v\ngeneral %#v", data, got, want)
		}
		// No string of the payload aliases the data.
		for i := range in {
			in[i] = 'X'
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: the payload changed with the data", data)
		}
	})
}

// TestFastDecodeReadsEncoded: the fast path reads every seed Encode
// wrote (so the reconciler's mix never takes the general path).
func TestFastDecodeReadsEncoded(t *testing.T) {
	seeds := fastSeeds(t)
	kinds := []Kind{KindHave, KindHave, KindSettle, KindRefusal, KindFilled, KindWant, KindWant, KindPlan, KindPlan, KindWant, KindKnock, KindKnock, KindHave}
	for i, k := range kinds {
		if _, ok := fastDecode(k, seeds[i], nil); !ok {
			t.Errorf("%s %s: declined", k, seeds[i])
		}
	}
}

// TestWantGates: every want this build writes carries "gates" (Stamp sets
// it); a want an older build wrote, without the field, decodes with Gates
// false on the fast path and the general one alike, so its flags set no
// gate (DESIGN.md §4, "the gate").
func TestWantGates(t *testing.T) {
	w := Stamp(&Want{Modules: []WantModule{{Name: "db", Build: "d:1", RequiresApproval: true}}}, time.Unix(0, 0))
	data, err := Encode(w)
	if err != nil {
		t.Fatal(err)
	}
	if !w.Gates || !bytes.Contains(data, []byte(`"gates":true`)) {
		t.Fatalf("a stamped want: %s, want gates true", data)
	}
	older := []byte(`{"v":1,"at":"2026-12-03T13:34:00Z","modules":[{"name":"db","build":"d:1","requires_approval":true}]}`)
	for _, dec := range []struct {
		name string
		fn   func([]byte) (Payload, error)
	}{
		{"fast", func(b []byte) (Payload, error) {
			if p, ok := fastDecode(KindWant, b, nil); ok {
				return p, nil
			}
			return nil, errors.New("the fast path declined")
		}},
		{"general", func(b []byte) (Payload, error) { return DecodeStrict(KindWant, b) }},
	} {
		for _, b := range [][]byte{older, data} {
			p, err := dec.fn(b)
			if err != nil {
				t.Fatalf("%s %s: %v", dec.name, b, err)
			}
			if got, want := p.(*Want).Gates, bytes.Equal(b, data); got != want {
				t.Errorf("%s %s: gates %v, want %v", dec.name, b, got, want)
			}
		}
	}
}
