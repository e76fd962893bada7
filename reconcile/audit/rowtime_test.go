package audit_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/reconcile/audit"
)

// TestFleetRowTimesMatchEncodingJSON checks that a row's times are
// written byte for byte as encoding/json writes them (time.Time's
// MarshalJSON), or refused when it refuses them: times drawn over years
// -1 to 10000, the edges of years 0 and 9999 and of each day most
// often, nanoseconds with and without trailing zeros, in UTC, in zones
// at any offset within two days (whole minutes or not, those of a day
// or more refused) and in the machine's local zone.
func TestFleetRowTimesMatchEncodingJSON(t *testing.T) {
	const (
		first = -62167219200 // 0000-01-01T00:00:00Z
		last  = 253402300799 // 9999-12-31T23:59:59Z
		year  = 366 * 86400
	)
	rapid.Check(t, func(rt *rapid.T) {
		var sec int64
		switch rapid.IntRange(0, 3).Draw(rt, "where") {
		case 0: // anywhere
			sec = rapid.Int64Range(first-year, last+year).Draw(rt, "sec")
		case 1: // near the first and last RFC 3339 can write
			sec = rapid.SampledFrom([]int64{first, last}).Draw(rt, "edge") + rapid.Int64Range(-2*86400, 2*86400).Draw(rt, "off edge")
		case 2: // near a day's start
			sec = rapid.Int64Range(first/86400, last/86400).Draw(rt, "day")*86400 + rapid.Int64Range(-2, 2).Draw(rt, "off day")
		default: // this century, as fleets' times are
			sec = rapid.Int64Range(946684800, 4102444800).Draw(rt, "sec")
		}
		var nsec int64
		switch rapid.IntRange(0, 2).Draw(rt, "nsec kind") {
		case 0:
		case 1:
			nsec = rapid.Int64Range(0, 999).Draw(rt, "ms") * 1e6
		default:
			nsec = rapid.Int64Range(0, 999999999).Draw(rt, "nsec")
		}
		tm := time.Unix(sec, nsec)
		switch rapid.IntRange(0, 3).Draw(rt, "zone") {
		case 0:
			tm = tm.UTC()
		case 1:
			tm = tm.In(time.FixedZone("", rapid.IntRange(-2*86400, 2*86400).Draw(rt, "offset")))
		case 2:
			tm = tm.In(time.FixedZone("X", 60*rapid.IntRange(-25*60, 25*60).Draw(rt, "offset min")))
		default:
			tm = tm.Local()
		}
		row := audit.FleetRow{Node: "n", HaveTime: tm}
		want, wantErr := json.Marshal(row)
		got, err := row.AppendJSON(nil)
		if (err != nil) != (wantErr != nil) {
			rt.Fatalf("%v (%d s, %d ns): AppendJSON's error %v, encoding/json's %v", tm, sec, nsec, err, wantErr)
		}
		if err == nil && !bytes.Equal(got, want) {
			rt.Fatalf("%v (%d s, %d ns):\n got %s\nwant %s", tm, sec, nsec, got, want)
		}
	})
}
