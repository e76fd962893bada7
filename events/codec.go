package events

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"time"

	// encoding/json's API and behaviour, decoding our payloads 4-6x
	// faster: the fold's budget is 2 µs an event and encoding/json alone
	// took 2.7. The strict decoder of the CLI (not a hot path) stays on
	// encoding/json.
	"github.com/segmentio/encoding/json"
)

// Encode returns the payload's JSON, as json.Marshal writes it (the
// reconciler's plans, knocks and journal entries by hand, encode.go, the
// same bytes). It does not validate.
func Encode(p Payload) ([]byte, error) {
	// The header is written first, on the stack, so that the payload's
	// one allocation is its length.
	var head [64]byte
	switch p := p.(type) {
	case *Plan:
		if p != nil {
			h := appendHeader(head[:0], &p.Header)
			return p.appendBody(append(make([]byte, 0, len(h)+p.size()), h...)), nil
		}
	case *Knock:
		if p != nil {
			h := appendHeader(head[:0], &p.Header)
			return p.appendBody(append(make([]byte, 0, len(h)+p.size()), h...)), nil
		}
	case *Journal:
		if p != nil {
			h := appendHeader(head[:0], &p.Header)
			return p.appendBody(append(make([]byte, 0, len(h)+p.size()), h...)), nil
		}
	}
	return json.Marshal(p)
}

// Decode parses data as a payload of kind k and validates it. Unknown
// fields are ignored (a newer publisher may add some).
//
// Errors: ErrUnknownKind for a kind not in [Kinds]; a *FieldError wrapping
// ErrTooLong (and ErrInvalid) when data is over [MaxEventBytes];
// ErrNewerVersion when
// `v` is newer than [Version]; ErrMalformed when data is not JSON of the
// kind's shape; a *FieldError (matching ErrInvalid) when validation fails.
func Decode(k Kind, data []byte) (Payload, error) { return decode(k, data, false, nil) }

// DecodeStrict is [Decode] that also refuses fields it does not know. The
// CLI verbs that read a user's file use it, so a typo is an error.
func DecodeStrict(k Kind, data []byte) (Payload, error) { return decode(k, data, true, nil) }

// Decoder decodes payloads as [Decode] does, and keeps one copy of each
// string it decodes: a decoded string equal to a key of Strings is that
// key's value, and a new one is added while Strings holds fewer than Max.
// A fleet's module names, builds, accounts and paths repeat from event to
// event, so most of an event's strings are found, not allocated. Its
// strings never alias the data decoded. Not safe for concurrent use; with
// Strings nil it keeps nothing.
type Decoder struct {
	Strings map[string]string
	Max     int
	// Fast reports whether the last Decode read its data on the fast path
	// (the kinds and shapes [Encode] writes for have, settle, refusal,
	// filled, want, plan and knock): each string of its payload is then
	// Strings' copy (while Strings held fewer than Max, as above) and
	// each slice exactly its length. The general path's payloads keep
	// their own strings and slices with room to spare.
	Fast bool
}

// Decode is [Decode] with d's strings.
func (d *Decoder) Decode(k Kind, data []byte) (Payload, error) { return decode(k, data, false, d) }

// text returns a string of b's bytes that does not alias b.
func (d *Decoder) text(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if d == nil || d.Strings == nil {
		if v, ok := constants[string(b)]; ok {
			return v
		}
		return string(b)
	}
	if v, ok := d.Strings[string(b)]; ok {
		return v
	}
	v := string(b)
	if len(d.Strings) < d.Max {
		d.Strings[v] = v
	}
	return v
}

// constants are the values of the payloads' enumerations (and the
// common file mode), which a decode without a [Decoder] need not
// allocate.
var constants = func() map[string]string {
	m := map[string]string{}
	for _, v := range []string{string(Running), string(Stopped), string(Failed),
		string(HealthStarting), string(Healthy), string(Unhealthy),
		string(OpApply), string(OpRemove), string(OpFailed),
		string(ReasonUndeclared), string(ReasonNoAccount), string(ReasonWrongAccount), string(ReasonWriteFailed),
		string(HoldWant), string(HoldApproval),
		string(KnockDeclared), string(KnockAccount), string(KnockWriteFailed), string(KnockOperator), string(KnockAgent), string(KnockMissing),
		"0600", "0640", "0644", "0400", "0440"} {
		m[v] = v
	}
	return m
}()

func decode(k Kind, data []byte, strict bool, d *Decoder) (Payload, error) {
	if d != nil {
		d.Fast = false
	}
	if len(data) > MaxEventBytes {
		if New(k) == nil {
			return nil, fmt.Errorf("%w %s", ErrUnknownKind, Short(string(k)))
		}
		return nil, fieldErr("payload", "", &LimitError{Err: ErrTooLong, Got: len(data), Limit: MaxEventBytes, Name: "MaxEventBytes"})
	}
	if !strict {
		if p, ok := fastDecode(k, data, d); ok {
			if d != nil {
				d.Fast = true
			}
			return checked(p)
		}
	}
	p := New(k)
	if p == nil {
		return nil, fmt.Errorf("%w %s", ErrUnknownKind, Short(string(k)))
	}
	var err error
	if strict {
		dec := stdjson.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(p)
		if err == nil && dec.More() {
			err = fmt.Errorf("trailing data after the JSON object")
		}
	} else {
		err = json.Unmarshal(data, p)
	}
	if err != nil {
		// A newer schema may have changed a field's shape: say so rather
		// than call it malformed.
		var v struct {
			V int `json:"v"`
		}
		if json.Unmarshal(data, &v) == nil && v.V > Version {
			return nil, fmt.Errorf("%w: v=%d, this build knows v=%d", ErrNewerVersion, v.V, Version)
		}
		// A user's own file (strict) is told in full; a stored event's
		// error keeps its head and tail.
		show := ErrorText
		if strict {
			show = Plain
		}
		return nil, fmt.Errorf("%w: %s: %s", ErrMalformed, k, show(err.Error()))
	}
	return checked(p)
}

// checked returns p once its version is known and it validates.
func checked(p Payload) (Payload, error) {
	if v := p.header().V; v > Version {
		return nil, fmt.Errorf("%w: v=%d, this build knows v=%d", ErrNewerVersion, v, Version)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// Stamp sets v to [Version] and at to t in UTC, truncated to the
// microsecond, and, on a *[Want], Gates (this build's wants set approval
// gates, DESIGN.md §4), and returns p. Publishers call it just before
// encoding.
func Stamp[P Payload](p P, t time.Time) P {
	h := p.header()
	h.V = Version
	h.At = t.UTC().Truncate(time.Microsecond)
	if w, ok := any(p).(*Want); ok {
		w.Gates = true
	}
	return p
}

// DecodeEvent decodes one stream message. It fails only when the subject
// names no node and kind; a payload that cannot be decoded or validated
// gives an Event with Err set and Payload nil, so that the fold can journal
// it for its node (DESIGN.md §3). So does an operator event on a named
// subject whose `by` is not the operator its subject names ([Attribute]).
func (s Subjects) DecodeEvent(subject string, data []byte, seq uint64, t time.Time) (Event, error) {
	node, kind, by, err := s.ParseBy(subject)
	if err != nil {
		return Event{}, err
	}
	ev := Event{Seq: seq, Time: t, Node: node, Kind: kind, Size: len(data)}
	ev.Payload, ev.Err = Decode(kind, data)
	if err := Attribute(ev.Payload, by); err != nil {
		ev.Payload, ev.Err = nil, err
	}
	ev.Checked = by != "" && ev.Err == nil
	return ev, nil
}
