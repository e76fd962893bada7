package audit_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile/audit"
)

// TestFleetRowAppendJSON checks that FleetRow.AppendJSON writes what
// encoding/json writes, over rows whose fields are filled at random by
// reflection (every field, nested ones too, a field added later as well:
// each is set or left zero at random, strings with characters JSON and
// HTML escape, times, ages tiny and huge).
func TestFleetRowAppendJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		var r audit.FleetRow
		fill(rng, reflect.ValueOf(&r).Elem(), 0, i%3 == 0)
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.AppendJSON([]byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[1:], want) {
			t.Fatalf("row %d:\n got %s\nwant %s", i, got[1:], want)
		}
	}
	// The zero row, and one of each field alone.
	var zero audit.FleetRow
	want, _ := json.Marshal(zero)
	if got, _ := zero.AppendJSON(nil); !bytes.Equal(got, want) {
		t.Fatalf("zero row:\n got %s\nwant %s", got, want)
	}
	rt := reflect.TypeFor[audit.FleetRow]()
	for f := range rt.NumField() {
		for range 20 {
			var r audit.FleetRow
			fill(rng, reflect.ValueOf(&r).Elem().Field(f), 1, false)
			want, _ := json.Marshal(r)
			if got, _ := r.AppendJSON(nil); !bytes.Equal(got, want) {
				t.Fatalf("field %s alone:\n got %s\nwant %s", rt.Field(f).Name, got, want)
			}
		}
	}
}

var strs = []string{"", "ace", "node-000001", "up", "a\"b", `c\d`, "<script>&", "a<b", "c>d", "e&f", "tab\tnl\n", "é ✓ 𝄞", "\u2028", "\xff bad", "failed", "stale-have"}

// fill sets v at random: sparse leaves many fields zero.
func fill(rng *rand.Rand, v reflect.Value, depth int, sparse bool) {
	if v.Type() == reflect.TypeFor[time.Time]() {
		switch rng.IntN(4) {
		case 0:
		case 1:
			v.Set(reflect.ValueOf(time.Date(2026, 11, 3, 20, 0, rng.IntN(3600), rng.IntN(2)*rng.IntN(1e9), time.UTC)))
		case 2:
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))))
		default:
			v.Set(reflect.ValueOf(time.Unix(int64(rng.Uint32()), 0).UTC()))
		}
		return
	}
	if sparse && depth > 0 && rng.IntN(3) > 0 {
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(strs[rng.IntN(len(strs))])
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(rng.IntN(5) - 1))
	case reflect.Uint64, reflect.Uint32, reflect.Uint:
		if rng.IntN(2) == 0 {
			v.SetUint(rng.Uint64() >> rng.IntN(64))
		}
	case reflect.Float64:
		fs := []float64{0, -1, 0.5, 12, 1e-7, 3.25e-9, 1e21, 123456789.125, 1e20}
		v.SetFloat(fs[rng.IntN(len(fs))])
	case reflect.Pointer:
		if depth < 4 && rng.IntN(2) == 0 {
			p := reflect.New(v.Type().Elem())
			fill(rng, p.Elem(), depth+1, sparse)
			v.Set(p)
		}
	case reflect.Slice:
		if depth < 4 {
			n := rng.IntN(3)
			if n == 0 && rng.IntN(2) == 0 {
				v.Set(reflect.MakeSlice(v.Type(), 0, 0)) // empty, not nil
				return
			}
			s := reflect.MakeSlice(v.Type(), n, n)
			for i := range n {
				fill(rng, s.Index(i), depth+1, sparse)
			}
			v.Set(s)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(rng, v.Field(i), depth+1, sparse)
			}
		}
	}
}
