package events

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"
)

// effectReader makes plans, knocks and journal entries of a fuzzer's
// bytes: any string (HTML characters, control bytes, U+2028, invalid
// UTF-8), any number, nil and empty slices, times of any year, with
// nanoseconds, in UTC, Local or a zone of any offset.
type effectReader struct{ b []byte }

func (r *effectReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *effectReader) u64() uint64 {
	var x [8]byte
	n := int(r.byte() % 9)
	for i := 0; i < n; i++ {
		x[i] = r.byte()
	}
	return binary.LittleEndian.Uint64(x[:])
}

// tricky are fragments a string is also made of, so that short inputs
// reach every escape.
var tricky = []string{"<", ">", "&", `"`, `\`, "\u2028", "\u2029", "\x00", "\x1f", "\x7f", "\t", "\n", "\r", "\b", "\f",
	"\xff", "\xe2\x80", "é", "😀", "/etc/pg/pw", "0600", "pg:b3", "\ufffd"}

func (r *effectReader) str() string {
	var s []byte
	for n := int(r.byte() % 6); n > 0; n-- {
		c := r.byte()
		switch {
		case c < 64:
			s = append(s, tricky[int(c)%len(tricky)]...)
		case c < 128:
			s = append(s, 'a'+c%26)
		default:
			s = append(s, r.byte())
		}
	}
	return string(s)
}

func (r *effectReader) time() time.Time {
	var t time.Time
	switch r.byte() % 4 {
	case 0: // as Stamp writes it
		t = time.Unix(int64(r.u64()%(1<<36)), int64(r.u64()%1e9)/1000*1000).UTC()
	case 1:
		t = time.Unix(int64(r.u64()), int64(r.u64()%1e9)).UTC()
	case 2:
		t = time.Unix(int64(r.u64()%(1<<40))-1<<39, int64(r.u64()%1e9)).In(time.FixedZone("z", int(int32(r.u64()))%200000))
	default:
		t = time.Unix(int64(r.u64()%(1<<36)), int64(r.u64()%1e9)).Local()
	}
	return t
}

func (r *effectReader) header() Header { return Header{V: int(int64(r.u64())), At: r.time()} }

// n is a slice's length, or -1 for nil.
func (r *effectReader) n() int { return int(r.byte()%5) - 1 }

func (r *effectReader) payload() Payload {
	switch r.byte() % 3 {
	case 0:
		p := &Plan{Header: r.header(), Cause: r.u64(), Want: r.u64(), ProvisionerAccount: r.str()}
		if n := r.n(); n >= 0 {
			p.Modules = make([]PlanModule, n)
			for i := range p.Modules {
				m := &p.Modules[i]
				*m = PlanModule{Name: r.str(), Build: r.str(), RunsAs: r.str(), Provisioner: r.byte()&1 == 1,
					Held: r.byte()&1 == 1, Why: HoldReason(r.str()), Pending: r.str()}
				if n := r.n(); n >= 0 {
					m.Files = make([]File, n)
					for j := range m.Files {
						m.Files[j] = File{Path: r.str(), Mode: Mode(r.str())}
					}
				}
			}
		}
		return p
	case 1:
		k := &Knock{Header: r.header(), Cause: r.u64()}
		if n := r.n(); n >= 0 {
			k.Reasons = make([]KnockReason, n)
			for i := range k.Reasons {
				k.Reasons[i] = KnockReason(r.str())
			}
		}
		if n := r.n(); n >= 0 {
			k.Owed = make([]Owed, n)
			for i := range k.Owed {
				k.Owed[i] = Owed{Module: r.str(), Path: r.str(), Reason: Reason(r.str()), Plan: r.u64(), Writer: r.str()}
			}
		}
		return k
	default:
		return &Journal{Header: r.header(), Level: Level(r.str()), Msg: r.str(), Cause: r.u64()}
	}
}

// sameAsMarshal fails t unless Encode writes p as json.Marshal does.
func sameAsMarshal(t *testing.T, p Payload) {
	t.Helper()
	got, err := Encode(p)
	if err != nil {
		t.Fatalf("Encode(%#v): %v", p, err)
	}
	want, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("json.Marshal(%#v): %v", p, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%#v:\nEncode       %q\njson.Marshal %q", p, got, want)
	}
}

// FuzzEncodeEffects holds the hand-written writers of plans, knocks and
// journal entries to json.Marshal, byte for byte.
func FuzzEncodeEffects(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x03\x10\x20\x30\x40\x50\x60\x70\x80\x90\xa0\xb0\xc0\xd0\xe0\xf0"))
	f.Add([]byte("\x01\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02"))
	f.Add([]byte("\x02\x03\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05\x05"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &effectReader{b: data}
		sameAsMarshal(t, r.payload())
	})
}

// TestEncodeStampedEffects: the shapes the reconciler writes (Stamp's
// time, rows with and without files, held rows, empty and nil slices),
// and strings to escape.
func TestEncodeStampedEffects(t *testing.T) {
	at := time.Date(2026, 12, 5, 20, 15, 0, 123456000, time.UTC)
	for _, p := range []Payload{
		&Plan{Cause: 9, Want: 8, ProvisionerAccount: "prov", Modules: []PlanModule{
			{Name: "pg", Build: "b", RunsAs: "pg", Files: []File{}, Provisioner: true},
			{Name: "q", RunsAs: "q", Files: []File{{Path: "/a", Mode: "0600"}, {Path: "/b&<c>", Mode: "644"}}, Held: true, Why: HoldApproval, Pending: "c"},
			{Name: "prov", Build: "p:1"},
		}},
		&Plan{},
		&Plan{Modules: []PlanModule{}},
		&Knock{Cause: 5, Reasons: []KnockReason{KnockAccount, KnockDeclared}, Owed: []Owed{{Module: "pg", Path: "/a", Reason: ReasonNoAccount, Plan: 2, Writer: "w"}}},
		&Knock{Cause: 5, Reasons: []KnockReason{KnockOperator}, Owed: []Owed{}},
		&Knock{},
		&Journal{Level: LevelWarn, Msg: `plan "x" <held> & kept` + "\u2028\xff\x01", Cause: 3},
		&Journal{},
	} {
		sameAsMarshal(t, p)
		sameAsMarshal(t, Stamp(p, at))
	}
	// A nil pointer of each is json.Marshal's null.
	for _, p := range []Payload{(*Plan)(nil), (*Knock)(nil), (*Journal)(nil)} {
		sameAsMarshal(t, p)
	}
}

// TestEncodeOneAllocation: a plan, knock or journal entry whose strings
// are ASCII, escaped or not, is written into one allocation of its
// length (size is exact), whatever its times and numbers.
func TestEncodeOneAllocation(t *testing.T) {
	for _, at := range []time.Time{{}, time.Date(2026, 12, 5, 20, 15, 0, 123456000, time.UTC), time.Date(-3, 1, 2, 3, 4, 5, 6, time.FixedZone("x", -3*3600-1800))} {
		for _, p := range []Payload{
			&Plan{Cause: 9, Want: 12345678901, ProvisionerAccount: "prov", Modules: []PlanModule{
				{Name: "pg", Build: "b", RunsAs: "pg", Files: []File{}, Provisioner: true},
				{Name: "q", RunsAs: "q", Files: []File{{Path: "/a", Mode: "0600"}, {Path: "/b", Mode: "644"}}, Held: true, Why: HoldApproval, Pending: "c"},
				{Name: "prov", Build: "p:1"},
			}},
			&Plan{}, &Plan{Modules: []PlanModule{}},
			&Knock{Cause: 1 << 63, Reasons: []KnockReason{KnockAccount, KnockDeclared}, Owed: []Owed{{Module: "pg", Path: "/a", Reason: ReasonNoAccount, Plan: 2, Writer: "w"}, {}}},
			&Knock{}, &Knock{Reasons: []KnockReason{}, Owed: []Owed{}},
			&Journal{Level: LevelWarn, Msg: "plan held", Cause: 3}, &Journal{},
			&Journal{Level: LevelWarn, Msg: `plan names no provisioner account while what runs names "prov"`, Cause: 3},
			&Journal{Msg: "<a> & \\ \"b\"\b\f\n\r\t\x00\x01\x1f\x7f"},
			&Plan{ProvisionerAccount: `p"`, Modules: []PlanModule{{Name: "<x>", Files: []File{{Path: "/a&b", Mode: "\n"}}, Why: `"`, Pending: `\`}}},
			&Knock{Reasons: []KnockReason{`"`}, Owed: []Owed{{Module: "<", Path: ">", Reason: "&", Writer: "\t"}}},
		} {
			HeaderOf(p).At = at
			HeaderOf(p).V = Version
			got, err := Encode(p)
			if err != nil {
				t.Fatal(err)
			}
			if cap(got) != len(got) {
				t.Errorf("%s: %d bytes in %d", got, len(got), cap(got))
			}
		}
	}
}

func TestEncodeNil(t *testing.T) {
	// A nil pointer of each is json.Marshal's null.
	for _, p := range []Payload{(*Plan)(nil), (*Knock)(nil), (*Journal)(nil)} {
		sameAsMarshal(t, p)
	}
}

// TestEncodeEveryField: each writer writes every field of its type. A
// payload with every field set (reflection: each string, number, bool,
// time and slice of the type and of the types it holds) encodes as
// json.Marshal's, so a field added to Plan, PlanModule, File, Knock,
// Owed, Journal or Header without its writer fails here.
func TestEncodeEveryField(t *testing.T) {
	for _, p := range []Payload{&Plan{}, &Knock{}, &Journal{}} {
		fill(t, reflect.ValueOf(p).Elem())
		sameAsMarshal(t, p)
		if got, _ := Encode(p); bytes.Contains(got, []byte(`null`)) || bytes.Contains(got, []byte(`""`)) {
			t.Errorf("a field left empty: %s", got)
		}
	}
}

// fill sets every field of v to a value that is not its zero.
func fill(t *testing.T, v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 12, 5, 20, 15, 0, 1, time.UTC)))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			fill(t, v.Field(i))
		}
	case reflect.String:
		v.SetString("s<&>")
	case reflect.Int, reflect.Int64:
		v.SetInt(-7)
	case reflect.Uint64:
		v.SetUint(1<<63 + 1)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(t, v.Index(i))
		}
	default:
		t.Fatalf("fill: a field of kind %s (a new field's writer and this test need it)", v.Kind())
	}
}

// BenchmarkEncodeEffects: one plan, knock and journal entry of the
// benchmarks' shapes, by Encode and by json.Marshal; one op is one
// payload.
func BenchmarkEncodeEffects(b *testing.B) {
	at := time.Date(2026, 11, 3, 20, 50, 0, 123456000, time.UTC)
	ps := []Payload{
		Stamp(&Plan{Cause: 123457, Want: 123457, ProvisionerAccount: "prov", Modules: []PlanModule{
			{Name: "power", Build: "w:1", RunsAs: "power"},
			{Name: "postgres", Build: "pg:b3", RunsAs: "postgres", Files: []File{{Path: "/etc/postgres/pw", Mode: "0600"}}},
			{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
			{Name: "restic", Build: "r:b3", RunsAs: "restic", Files: []File{{Path: "/etc/restic/key", Mode: "0600"}}},
		}}, at),
		Stamp(&Knock{Cause: 123458, Reasons: []KnockReason{KnockDeclared}, Owed: []Owed{
			{Module: "restic", Path: "/etc/restic/new", Reason: ReasonUndeclared, Plan: 123456, Writer: "prov"},
		}}, at),
		Stamp(&Journal{Level: LevelInfo, Msg: "module restic: build r:b3 settled", Cause: 123459}, at),
	}
	for _, p := range ps {
		b.Run(string(p.Kind())+"/Encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(string(p.Kind())+"/json.Marshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := json.Marshal(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
