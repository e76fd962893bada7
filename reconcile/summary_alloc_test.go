package reconcile_test

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"reflect"
	"runtime"
	"testing"

	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// summaryAllocPerByte and summaryAllocFixed bound what decoding a fleet
// summary of n bytes may allocate: summaryAllocFixed + n·summaryAllocPerByte.
// A list's elements are made before they are read, so a count the bytes
// left cannot hold is refused first; what an element that was read may
// take is the largest ratio of an element's size to its shortest
// encoding (a zero time: 24 bytes of time.Time from 1 byte, in a module
// runtime of 176 bytes from 12), on the 3 bytes base64 gives of every 4.
// The fixed part is the view and the decoding's own buffers.
const (
	summaryAllocPerByte = 32
	summaryAllocFixed   = 4 << 10
)

// allocated returns the bytes the heap gave fn, the fewest of 3 runs
// (a run may count an allocation of the runtime's own).
func allocated(fn func()) uint64 {
	least := ^uint64(0)
	var m0, m1 runtime.MemStats
	for range 3 {
		runtime.ReadMemStats(&m0)
		fn()
		runtime.ReadMemStats(&m1)
		least = min(least, m1.TotalAlloc-m0.TotalAlloc)
	}
	return least
}

// hostileSummaries are format 2 summaries of about n decoded bytes whose
// every list count (and the string table's) claims as many elements as
// the bytes left could hold one byte each, followed by zero bytes (each
// an empty string, a zero or a zero time): what a writer of the snapshot
// bucket could put in a snapshot's header.
func hostileSummaries(n int) map[string][]byte {
	uv := binary.AppendUvarint
	head := func(seen uint64) []byte {
		b := uv(nil, seen)
		b = uv(b, 1)                      // snapshot format
		b = append(b, 0)                  // node ""
		b = append(b, make([]byte, 8)...) // seq, want, plans; unsettled, modules, files, held
		b = append(b, 0, 0, 0)            // flags, have seq, have time (zero)
		return b
	}
	enc := func(body []byte) []byte {
		return append([]byte("2:"), base64.RawStdEncoding.EncodeToString(body)...)
	}
	lists := []string{"holds", "owed", "owed times", "owed errors", "runtimes", "unfilled", "failed applies"}
	out := map[string][]byte{}
	for i, name := range lists {
		b := head(0)
		b = append(b, make([]byte, i)...) // the lists before it: empty
		b = uv(b, uint64(n))
		out[name] = enc(append(b, make([]byte, n)...))
	}
	// A runtime's own lists: the crashes and its unfilled files.
	for i, name := range []string{"a runtime's crashes", "a runtime's unfilled files"} {
		b := head(0)
		b = append(b, 0, 0, 0, 0) // holds, owed, owed times, owed errors
		b = uv(b, 1)              // one runtime
		b = append(b, make([]byte, 10+i)...)
		b = uv(b, uint64(n))
		out[name] = enc(append(b, make([]byte, n)...))
	}
	out["strings"] = enc(append(head(uint64(n)), make([]byte, n)...))
	return out
}

// TestSummaryDecodeAllocationBounded decodes hostile fleet summaries
// (hostileSummaries) and real ones, and checks that none makes the
// reader allocate more than summaryAllocFixed + summaryAllocPerByte
// bytes a byte of summary: a snapshot's header is read by fleet and the
// console for every node, and a count taken on trust made a summary of
// 16 KiB allocate ~135 times its size.
func TestSummaryDecodeAllocationBounded(t *testing.T) {
	worst, worstName := 0.0, ""
	defer func() { t.Logf("at most %.1f bytes allocated a byte of summary (%s)", worst, worstName) }()
	check := func(t *testing.T, name string, b []byte) {
		t.Helper()
		got := allocated(func() { _, _ = reconcile.UnmarshalSummary(b) })
		if r := float64(got) / float64(len(b)); len(b) > 4096 && r > worst {
			worst, worstName = r, name
		}
		if limit := summaryAllocFixed + summaryAllocPerByte*uint64(len(b)); got > limit {
			t.Errorf("%s: a summary of %d bytes allocated %d bytes (%.0f a byte), more than %d", name, len(b), got,
				float64(got)/float64(len(b)), limit)
		}
	}
	for _, n := range []int{16 << 10, 256 << 10} {
		for name, b := range hostileSummaries(n) {
			check(t, fmt.Sprintf("%s, %d bytes", name, n), b)
		}
	}
	names := make([]string, 50)
	for i := range names {
		names[i] = fmt.Sprintf("n%03d", i)
	}
	s := reconciletest.Scripted(names, 20*len(names), 17, nil)
	for _, name := range names {
		b, err := reconcile.MarshalSummary(s.State(name))
		if err != nil {
			t.Fatal(err)
		}
		check(t, name, b)
	}
	var v reconcile.View
	n := 0
	fill(reflect.ValueOf(&v).Elem(), &n)
	check(t, "every field set", reconcile.MarshalSummaryView(v.FleetSummary()))
}

// FuzzUnmarshalSummary decodes any bytes as a fleet summary: it must not
// panic, nor allocate more than summaryAllocFixed + summaryAllocPerByte
// bytes a byte of input, and a summary that decodes encodes back to one
// that decodes to the same view.
//
//	go test ./reconcile -run '^$' -fuzz FuzzUnmarshalSummary -fuzztime 60s
func FuzzUnmarshalSummary(f *testing.F) {
	for _, b := range hostileSummaries(512) {
		f.Add(b)
	}
	names := []string{"a", "b", "c", "d"}
	s := reconciletest.Scripted(names, 80, 17, nil)
	for _, name := range names {
		b, _ := reconcile.MarshalSummary(s.State(name))
		f.Add(b)
	}
	var v reconcile.View
	n := 0
	fill(reflect.ValueOf(&v).Elem(), &n)
	f.Add(reconcile.MarshalSummaryView(v.FleetSummary()))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got reconcile.View
		var err error
		a := allocated(func() { got, err = reconcile.UnmarshalSummary(b) })
		if limit := summaryAllocFixed + summaryAllocPerByte*uint64(len(b)); a > limit {
			t.Fatalf("a summary of %d bytes allocated %d bytes, more than %d", len(b), a, limit)
		}
		if err != nil || len(b) == 0 || b[0] == '{' {
			return
		}
		again, err := reconcile.UnmarshalSummary(reconcile.MarshalSummaryView(got))
		if err != nil {
			t.Fatalf("a decoded summary encoded again does not decode: %v", err)
		}
		if g, w := jsonOf(t, again), jsonOf(t, got); g != w {
			t.Fatalf("encoded again, decodes as\n%s\nnot\n%s", g, w)
		}
	})
}
