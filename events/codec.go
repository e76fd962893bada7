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

// Encode returns the payload's JSON. It does not validate.
func Encode(p Payload) ([]byte, error) { return json.Marshal(p) }

// Decode parses data as a payload of kind k and validates it. Unknown
// fields are ignored (a newer publisher may add some).
//
// Errors: ErrUnknownKind for a kind not in [Kinds]; a *FieldError wrapping
// ErrTooLong (and ErrInvalid) when data is over [MaxEventBytes];
// ErrNewerVersion when
// `v` is newer than [Version]; ErrMalformed when data is not JSON of the
// kind's shape; a *FieldError (matching ErrInvalid) when validation fails.
func Decode(k Kind, data []byte) (Payload, error) { return decode(k, data, false) }

// DecodeStrict is [Decode] that also refuses fields it does not know. The
// CLI verbs that read a user's file use it, so a typo is an error.
func DecodeStrict(k Kind, data []byte) (Payload, error) { return decode(k, data, true) }

func decode(k Kind, data []byte, strict bool) (Payload, error) {
	p := New(k)
	if p == nil {
		return nil, fmt.Errorf("%w %s", ErrUnknownKind, Short(string(k)))
	}
	if len(data) > MaxEventBytes {
		return nil, fieldErr("payload", "", &LimitError{Err: ErrTooLong, Got: len(data), Limit: MaxEventBytes, Name: "MaxEventBytes"})
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
	if v := p.header().V; v > Version {
		return nil, fmt.Errorf("%w: v=%d, this build knows v=%d", ErrNewerVersion, v, Version)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// Stamp sets v to [Version] and at to t in UTC, truncated to the
// microsecond, and returns p. Publishers call it just before encoding.
func Stamp[P Payload](p P, t time.Time) P {
	h := p.header()
	h.V = Version
	h.At = t.UTC().Truncate(time.Microsecond)
	return p
}

// DecodeEvent decodes one stream message. It fails only when the subject
// names no node and kind; a payload that cannot be decoded or validated
// gives an Event with Err set and Payload nil, so that the fold can journal
// it for its node (DESIGN.md §3).
func (s Subjects) DecodeEvent(subject string, data []byte, seq uint64, t time.Time) (Event, error) {
	node, kind, err := s.Parse(subject)
	if err != nil {
		return Event{}, err
	}
	ev := Event{Seq: seq, Time: t, Node: node, Kind: kind}
	ev.Payload, ev.Err = Decode(kind, data)
	return ev, nil
}
