package store

import (
	"testing"
	"unsafe"
)

// pubAckSeeds are answers as the server writes them, and near misses.
var pubAckSeeds = []string{
	`{"stream":"MESH","seq":1}`,
	`{"stream":"MESH","seq":18446744073709551615}`,
	`{"stream":"MESH","seq":18446744073709551616}`,
	`{"stream":"MESH","seq":7,"duplicate":true}`,
	`{"stream":"MESH","domain":"hub","seq":7}`,
	`{"stream":"MESH", "seq":7, "duplicate": true}`,
	`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"MESH","seq":0}`,
	`{"error":{"code":400,"err_code":10164,"description":"wrong last sequence: 5"}}`,
	`{"error":{"code":503,"err_code":10023,"description":"insufficient resources"}}`,
	`{"error":{"code":400,"err_code":70000}}`,
	`{"error":{"code":1},"error":{"err_code":2}}`,
	`{"error":null,"stream":"MESH","seq":3}`,
	`{"error":{"code":400,"description":"say \"no\""}}`,
	`{"Stream":"MESH","seq":1}`,
	`{"stream":"MESH","seq":01}`,
	`{"stream":"MESH","seq":1.0}`,
	`{"stream":"MESH","seq":-1}`,
	`{"stream":"MÉSH","seq":1}`,
	`{"stream":"","seq":1}`,
	`{"type":"io.nats.jetstream.api.v1.pub_ack","stream":"MESH","seq":1}`,
	`{"stream":"MESH","seq":1,"batch":"b","count":2}`,
	`{"stream":"MESH","seq":1} x`,
	`{}`,
	``,
	`null`,
	`{"stream":"MESH","seq":1,}`,
}

// FuzzDecodePubAck: whatever the answer, the reflection-free reading,
// when it takes it, reads what encoding/json reads (the client's way).
func FuzzDecodePubAck(f *testing.F) {
	for _, s := range pubAckSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkPubAck(t, data)
	})
}

// checkPubAck fails t when decodePubAck takes data and reads it other
// than encoding/json; it reports whether decodePubAck took it.
func checkPubAck(t testing.TB, data []byte) bool {
	t.Helper()
	got, ok := decodePubAck(data, "MESH")
	if !ok {
		return false
	}
	want := decodePubAckJSON(data)
	if got.invalid || want.invalid || got.ack != want.ack || (got.apiErr == nil) != (want.apiErr == nil) ||
		got.apiErr != nil && *got.apiErr != *want.apiErr {
		t.Fatalf("answer %q: read %+v (error %+v), encoding/json %+v (error %+v)", data, got, got.apiErr, want, want.apiErr)
	}
	return true
}

// TestPubAckStreamNameKept: an acknowledgement naming the stream the
// last one named returns that string, not a new one.
func TestPubAckStreamNameKept(t *testing.T) {
	t.Parallel()
	a := &acks{}
	first, err := a.decode([]byte(`{"stream":"MESH","seq":1}`))
	if err != nil {
		t.Fatal(err)
	}
	second, err := a.decode([]byte(`{"stream":"MESH","seq":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if second.Stream != "MESH" || second.Sequence != 2 || unsafe.StringData(second.Stream) != unsafe.StringData(first.Stream) {
		t.Errorf("second ack %+v: want the first's stream name, the same string", second)
	}
	other, err := a.decode([]byte(`{"stream":"KV_SNAP","seq":3}`))
	if err != nil || other.Stream != "KV_SNAP" {
		t.Errorf("another stream: %+v, %v", other, err)
	}
}

// BenchmarkDecodePubAck reads an acknowledgement, without reflection
// and with encoding/json.
func BenchmarkDecodePubAck(b *testing.B) {
	data := []byte(`{"stream":"MESH","seq":123456789,"duplicate":true}`)
	b.Run("scan", func(b *testing.B) {
		a := &acks{}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := a.decode(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if r := decodePubAckJSON(data); r.invalid {
				b.Fatal("invalid")
			}
		}
	})
}
