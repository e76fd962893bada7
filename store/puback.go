package store

import "github.com/nats-io/nats.go/jetstream"

// decodePubAck reads a publish's answer as the server writes it, without
// reflection: one JSON object of the keys "stream", "seq", "duplicate",
// "domain", "val" and "error" (an object of "code", "err_code" and
// "description"), strings of printable ASCII without escapes, numbers
// of digits alone. ok is false for anything else (another key, an
// escape, null, a float, a malformed answer): decodePubAckJSON reads
// those, so that the answer read is always what encoding/json reads
// (FuzzDecodePubAck checks it). stream is the stream name the last
// acknowledgement named: the same name is returned as that string, not
// a new one.
func decodePubAck(data []byte, stream string) (r pubAckReply, ok bool) {
	d := ackScanner{b: data}
	if !d.byte('{') {
		return r, false
	}
	if d.byte('}') {
		return r, d.end()
	}
	for {
		key, ok := d.str()
		if !ok || !d.byte(':') {
			return r, false
		}
		switch string(key) {
		case "stream":
			s, ok := d.str()
			if !ok {
				return r, false
			}
			if string(s) == stream {
				r.ack.Stream = stream
			} else {
				r.ack.Stream = string(s)
			}
		case "seq":
			n, ok := d.uint(1<<64 - 1)
			if !ok {
				return r, false
			}
			r.ack.Sequence = n
		case "duplicate":
			b, ok := d.bool()
			if !ok {
				return r, false
			}
			r.ack.Duplicate = b
		case "domain":
			s, ok := d.str()
			if !ok {
				return r, false
			}
			r.ack.Domain = string(s)
		case "val":
			s, ok := d.str()
			if !ok {
				return r, false
			}
			r.ack.Value = string(s)
		case "error":
			if r.apiErr != nil {
				return r, false // encoding/json merges a second into the first
			}
			e, ok := d.apiError()
			if !ok {
				return r, false
			}
			r.apiErr = e
		default:
			return r, false
		}
		if d.byte('}') {
			return r, d.end()
		}
		if !d.byte(',') {
			return r, false
		}
	}
}

// ackScanner reads the JSON of a publish's answer; each method skips
// the white space before its token.
type ackScanner struct {
	b []byte
	i int
}

func (d *ackScanner) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// byte consumes c if it comes next.
func (d *ackScanner) byte(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (d *ackScanner) end() bool {
	d.space()
	return d.i == len(d.b)
}

// str reads a string of printable ASCII without escapes; its bytes
// alias the answer's.
func (d *ackScanner) str() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start := d.i
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, false
		}
	}
	return nil, false
}

// uint reads a JSON integer of digits alone, at most limit.
func (d *ackScanner) uint(limit uint64) (uint64, bool) {
	d.space()
	start := d.i
	var n uint64
	for ; d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9'; d.i++ {
		c := uint64(d.b[d.i] - '0')
		if n > (limit-c)/10 {
			return 0, false
		}
		n = n*10 + c
	}
	switch {
	case d.i == start:
		return 0, false
	case d.b[start] == '0' && d.i-start > 1: // a leading zero: not JSON
		return 0, false
	case d.i < len(d.b) && (d.b[d.i] == '.' || d.b[d.i] == 'e' || d.b[d.i] == 'E'):
		return 0, false // a float: encoding/json's to judge
	}
	return n, true
}

func (d *ackScanner) bool() (bool, bool) {
	d.space()
	rest := d.b[d.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		d.i += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		d.i += 5
		return false, true
	}
	return false, false
}

// apiError reads the error object of an answer.
func (d *ackScanner) apiError() (*jetstream.APIError, bool) {
	if !d.byte('{') {
		return nil, false
	}
	e := &jetstream.APIError{}
	if d.byte('}') {
		return e, true
	}
	for {
		key, ok := d.str()
		if !ok || !d.byte(':') {
			return nil, false
		}
		switch string(key) {
		case "code":
			n, ok := d.uint(1<<31 - 1)
			if !ok {
				return nil, false
			}
			e.Code = int(n)
		case "err_code":
			n, ok := d.uint(1<<16 - 1)
			if !ok {
				return nil, false
			}
			e.ErrorCode = jetstream.ErrorCode(n)
		case "description":
			s, ok := d.str()
			if !ok {
				return nil, false
			}
			e.Description = string(s)
		default:
			return nil, false
		}
		if d.byte('}') {
			return e, true
		}
		if !d.byte(',') {
			return nil, false
		}
	}
}
