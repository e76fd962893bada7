package engine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// fleetEvents makes a small history for each of n nodes, as decoded from
// the wire: every string a fresh copy.
func fleetEvents(n int) [][]events.Event {
	at := time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)
	out := make([][]events.Event, n)
	seq := uint64(0)
	for i := range n {
		node := fmt.Sprintf("node-%05d", i)
		payloads := []events.Payload{
			&events.Want{Modules: []events.WantModule{
				{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
				{Name: "postgres", Build: "pg:15", RunsAs: "postgres", Files: []events.File{{Path: "/etc/postgres/pw", Mode: "0600"}}},
				{Name: "restic", Build: "r:1", RunsAs: "restic", Files: []events.File{{Path: "/etc/restic/key", Mode: "0600"}, {Path: "/etc/restic/env", Mode: "0640"}}},
				{Name: "nats", Build: "n:2", RunsAs: "nats", RequiresApproval: true, Files: []events.File{{Path: "/etc/nats/nats.creds", Mode: "0600"}}},
				{Name: "power", Build: "w:1", RunsAs: "power"},
			}},
			&events.Approve{Module: "nats", Build: "n:2", By: "ops"},
			&events.Have{Modules: []events.HaveModule{
				{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"},
				{Name: "postgres", Build: "pg:15", State: events.Running, Account: "postgres"},
				{Name: "restic", Build: "r:1", State: events.Running, Account: "restic"},
				{Name: "nats", Build: "n:2", State: events.Running, Account: "nats"},
				{Name: "power", Build: "w:1", State: events.Running, Account: "power"},
			}},
			&events.Refusal{Module: "restic", Path: "/etc/restic/new", Reason: events.ReasonUndeclared, Writer: "prov"},
		}
		for _, p := range payloads {
			seq++
			// A round trip through the codec: fresh strings, as the wire gives.
			b, _ := events.Encode(events.Stamp(p, at))
			dec, err := events.Decode(p.Kind(), b)
			if err != nil {
				panic(err)
			}
			out[i] = append(out[i], events.Event{Seq: seq, Node: node, Kind: p.Kind(), Payload: dec, Time: at})
		}
	}
	return out
}

func foldFleet(evs [][]events.Event, in *interner) []*reconcile.State {
	states := make([]*reconcile.State, len(evs))
	for i, node := range evs {
		st := reconcile.NewState(node[0].Node)
		for _, ev := range node {
			if in != nil {
				in.payload(ev.Payload)
			}
			st.Fold(ev)
		}
		states[i] = st
	}
	return states
}

// Interned states share one copy of equal strings across nodes, and fold
// to the same states.
func TestInternerShares(t *testing.T) {
	t.Parallel()
	plain := foldFleet(fleetEvents(2), nil)
	interned := foldFleet(fleetEvents(2), newInterner())
	for i := range plain {
		a, _ := json.Marshal(plain[i])
		b, _ := json.Marshal(interned[i])
		if string(a) != string(b) {
			t.Fatalf("node %d: interning changed the state", i)
		}
	}
	x, y := interned[0].Want.Modules[1].Files[0].Path, interned[1].Want.Modules[1].Files[0].Path
	if unsafe.StringData(x) != unsafe.StringData(y) {
		t.Error("two nodes' equal paths are two copies")
	}
	if x, y := plain[0].Want.Modules[1].Files[0].Path, plain[1].Want.Modules[1].Files[0].Path; unsafe.StringData(x) == unsafe.StringData(y) {
		t.Error("the test's decoding already shares strings: it proves nothing")
	}
}

// BenchmarkInternedStateMemory reports the heap of 10,000 nodes' states
// folded from decoded events, plain and interned as the loop does.
func BenchmarkInternedStateMemory(b *testing.B) {
	for _, c := range []struct {
		name string
		in   func() *interner
	}{{"plain", func() *interner { return nil }}, {"interned", newInterner}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				states := foldFleet(fleetEvents(10_000), c.in())
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(len(states)), "B/node")
				runtime.KeepAlive(states)
			}
		})
	}
}

// TestInternerTrimsSnapshotStates: a state decoded from its snapshot keeps
// no decoder slack (every slice it keeps, the files of each module and
// plan row and the placements among them, holds exactly its elements),
// two nodes' equal strings are one copy, and the state is unchanged.
func TestInternerTrimsSnapshotStates(t *testing.T) {
	t.Parallel()
	h := enginetest.Simulate(200, 2)
	states := map[string]*reconcile.State{}
	for i, m := range h.Msgs {
		node, kind, err := events.Subjects{}.Parse(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		if kind == events.KindKnock || kind == events.KindJournal {
			continue
		}
		p, err := events.Decode(kind, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if states[node] == nil {
			states[node] = reconcile.NewState(node)
		}
		states[node].Fold(events.Event{Seq: uint64(i + 1), Node: node, Kind: kind, Payload: p, Time: events.HeaderOf(p).At})
	}
	in := newInterner()
	var loaded []*reconcile.State
	for _, node := range []string{enginetest.Node(0), enginetest.Node(1)} {
		b, err := json.Marshal(states[node])
		if err != nil {
			t.Fatal(err)
		}
		st, err := reconcile.UnmarshalState(b)
		if err != nil {
			t.Fatal(err)
		}
		in.state(st)
		if after, _ := json.Marshal(st); string(after) != string(b) {
			t.Fatalf("%s: interning changed the state:\n%s\n%s", node, b, after)
		}
		if st.Settled == nil || len(st.Placed) == 0 {
			t.Fatalf("%s: the history settled nothing: the test proves nothing", node)
		}
		tight := func(what string, n, c int) {
			if c != n {
				t.Errorf("%s: %s holds %d of room for %d", node, what, n, c)
			}
		}
		for _, m := range st.Want.Modules {
			tight("want files of "+m.Name, len(m.Files), cap(m.Files))
		}
		for _, r := range st.Settled.Modules {
			tight("settled files of "+r.Name, len(r.Files), cap(r.Files))
		}
		tight("placements", len(st.Placed), cap(st.Placed))
		loaded = append(loaded, st)
	}
	if x, y := loaded[0].Placed[0].Path, loaded[1].Placed[0].Path; unsafe.StringData(x) != unsafe.StringData(y) {
		t.Error("two nodes' equal placed paths are two copies")
	}
}

// TestFastDecodedIsInterned: a payload the interner's decoder read on the
// fast path (events.Decoder.Fast) is already what interning it would make
// of it (each string the map's copy, each slice exactly its length), so
// the fold's loop skips interner.payload for it (issue 27, item 1).
func TestFastDecodedIsInterned(t *testing.T) {
	t.Parallel()
	in := newInterner()
	fast := 0
	for _, node := range fleetEvents(3) {
		for _, ev := range node {
			b, err := events.Encode(ev.Payload)
			if err != nil {
				t.Fatal(err)
			}
			p, err := in.dec.Decode(ev.Kind, b)
			if err != nil {
				t.Fatal(err)
			}
			if !in.dec.Fast {
				in.payload(p)
				continue
			}
			fast++
			before := walkPayload(t, p)
			in.payload(p)
			after := walkPayload(t, p)
			if fmt.Sprint(before.strs) != fmt.Sprint(after.strs) {
				t.Errorf("%s: interning replaced strings of a fast-decoded payload", ev.Kind)
			}
			if before.spare != 0 {
				t.Errorf("%s: %d slices of a fast-decoded payload have room to spare", ev.Kind, before.spare)
			}
		}
	}
	if fast == 0 {
		t.Fatal("no payload took the fast path: the test proves nothing")
	}
	// An escape: the fast path declines it, the general one reads it.
	if _, err := in.dec.Decode(events.KindHave, []byte(`{"v":1,"at":"2026-11-03T20:50:00Z","modules":[{"name":"p\u0067","build":"b","state":"running"}]}`)); err != nil || in.dec.Fast {
		t.Errorf("a have the fast path declines: Fast %v, %v", in.dec.Fast, err)
	}
}

// walked is what walkPayload finds: every string's data pointer, in
// order, and the slices with more capacity than length.
type walked struct {
	strs  []uintptr
	spare int
}

func walkPayload(t *testing.T, p events.Payload) walked {
	var w walked
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			if v.Type() == reflect.TypeFor[time.Time]() {
				return
			}
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Slice:
			if v.Cap() > v.Len() {
				w.spare++
			}
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.String:
			if v.Len() > 0 {
				w.strs = append(w.strs, uintptr(unsafe.Pointer(unsafe.StringData(v.String()))))
			}
		}
	}
	walk(reflect.ValueOf(p))
	return w
}

// foldHistory folds h's inputs into a state per node, through in as
// session.fold does when in is not nil, and returns the states.
func foldHistory(t *testing.T, h *enginetest.History, in *interner) map[string]*reconcile.State {
	t.Helper()
	states := map[string]*reconcile.State{}
	for i, m := range h.Msgs {
		node, kind, err := events.Subjects{}.Parse(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		if !kind.Input() {
			continue
		}
		ev := events.Event{Seq: uint64(i + 1), Node: node, Kind: kind}
		if in != nil {
			ev.Payload, ev.Err = in.dec.Decode(kind, m.Data)
			if ev.Payload != nil {
				in.read(ev.Payload)
			}
		} else {
			ev.Payload, ev.Err = events.Decode(kind, m.Data)
		}
		if states[node] == nil {
			states[node] = reconcile.NewState(node)
		}
		effs := states[node].Fold(ev)
		if in != nil {
			in.folded(states[node], effs)
		}
	}
	return states
}

// The interner keeps one list of files, of want modules and of plan rows
// for the nodes that hold equal ones, and the states it shares them among
// fold to what they fold to without it, on both mixes, over several wants
// of new builds (so that lists change while others still hold the old).
func TestInternerSharesLists(t *testing.T) {
	t.Parallel()
	same := func(a, b any) bool { return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer() }
	for name, h := range map[string]*enginetest.History{
		"bench": enginetest.Simulate(3_000, 20),
		"dense": enginetest.SimulateDense(3_000, 20),
	} {
		t.Run(name, func(t *testing.T) {
			in := newInterner()
			shared, plain := foldHistory(t, h, in), foldHistory(t, h, nil)
			for node, st := range plain {
				a, _ := json.Marshal(st)
				b, _ := json.Marshal(shared[node])
				if string(a) != string(b) {
					t.Fatalf("%s: sharing changed the state:\n%s\n%s", node, a, b)
				}
			}
			x, y := shared[enginetest.Node(0)], shared[enginetest.Node(1)]
			if !same(x.Want.Modules, y.Want.Modules) {
				t.Error("two nodes' equal wants are two lists")
			}
			if e, f := x.Emitted(), y.Emitted(); !same(e.Modules, f.Modules) {
				t.Error("two nodes' equal plans are two lists of rows")
			}
			for i, m := range x.Want.Modules {
				if len(m.Files) > 0 && !same(m.Files, y.Want.Modules[i].Files) {
					t.Errorf("two nodes' equal files of %s are two lists", m.Name)
				}
			}
			if same(x.Have.Modules, y.Have.Modules) {
				t.Error("haves shared: the interner shares no have")
			}
		})
	}
}
