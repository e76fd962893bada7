package events

import (
	"strconv"
	"time"

	"github.com/segmentio/encoding/json"
)

// The reconciler's effects (plans, knocks, journal entries) are written
// here without reflection: segmentio's Marshal was ~3 % of an
// effect-dense first refold's CPU (issue 27). Each writer is byte for
// byte what json.Marshal writes for the same value (the signatures, the
// golden streams and the keyed message ids are of these bytes): a
// string goes through json.AppendEscape with json.Marshal's flag (HTML
// escaping, U+2028/9, invalid UTF-8 as \ufffd), a time through
// time.Time.AppendFormat with RFC 3339 and nanoseconds (what segmentio
// calls for a time.Time), the fields in declaration order with their
// omitempty. FuzzEncodeEffects holds each writer to json.Marshal, and
// TestEncodeEveryField fails when a field is added to these types
// without its writer.

// appendString appends s quoted as json.Marshal quotes it.
func appendString(b []byte, s string) []byte { return json.AppendEscape(b, s, json.EscapeHTML) }

// appendHeader appends `{"v":…,"at":"…"`: a payload's first fields.
func appendHeader(b []byte, h *Header) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(h.V), 10)
	b = append(b, `,"at":"`...)
	b = h.At.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// digits is the length of u in decimal.
func digits(u uint64) int {
	n := 1
	for ; u >= 10; u /= 10 {
		n++
	}
	return n
}

// quoted is the length of s quoted as appendString quotes it, exact
// for ASCII (a journal entry's message quotes names: `module "db"`);
// U+2028/9 and invalid UTF-8, which grow when escaped, are counted as
// their bytes, and the append grows for them.
func quoted(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		n += int(escapeGrowth[s[i]])
	}
	return n
}

// escapeGrowth[c] is how many bytes more than one json.AppendEscape
// writes for the ASCII byte c: \" and \\ and the short escapes of
// control bytes one, \u00XX six less one for <, >, & (HTML) and the
// other control bytes.
var escapeGrowth = func() (t [256]uint8) {
	for c := 0; c < 0x20; c++ {
		t[c] = 5
	}
	for _, c := range []byte{'"', '\\', '\b', '\f', '\n', '\r', '\t'} {
		t[c] = 1
	}
	for _, c := range []byte{'<', '>', '&'} {
		t[c] = 5
	}
	return t
}()

// list is the length of a list of n items of l bytes in all: null for a
// nil one.
func list(isNil bool, n, l int) int {
	if isNil {
		return len("null")
	}
	return len("[]") + max(n-1, 0) + l
}

func (p *Plan) appendBody(b []byte) []byte {
	b = append(b, `,"cause":`...)
	b = strconv.AppendUint(b, p.Cause, 10)
	b = append(b, `,"want":`...)
	b = strconv.AppendUint(b, p.Want, 10)
	b = append(b, `,"provisioner_account":`...)
	b = appendString(b, p.ProvisionerAccount)
	b = append(b, `,"modules":`...)
	if p.Modules == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range p.Modules {
			if i > 0 {
				b = append(b, ',')
			}
			b = p.Modules[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// size is the length of p's JSON after its header (exact when its
// strings are ASCII).
func (p *Plan) size() int {
	rows := 0
	for i := range p.Modules {
		rows += p.Modules[i].size()
	}
	return len(`,"cause":`) + digits(p.Cause) + len(`,"want":`) + digits(p.Want) +
		len(`,"provisioner_account":`) + quoted(p.ProvisionerAccount) +
		len(`,"modules":`) + list(p.Modules == nil, len(p.Modules), rows) + len(`}`)
}

func (m *PlanModule) size() int {
	files := 0
	for _, f := range m.Files {
		files += len(`{"path":`) + quoted(f.Path) + len(`,"mode":`) + quoted(string(f.Mode)) + len(`}`)
	}
	n := len(`{"name":`) + quoted(m.Name) + len(`,"build":`) + quoted(m.Build) + len(`,"runs_as":`) + quoted(m.RunsAs) +
		len(`,"files":`) + list(m.Files == nil, len(m.Files), files) + len(`}`)
	if m.Provisioner {
		n += len(`,"provisioner":true`)
	}
	if m.Held {
		n += len(`,"held":true`)
	}
	if m.Why != "" {
		n += len(`,"why":`) + quoted(string(m.Why))
	}
	if m.Pending != "" {
		n += len(`,"pending":`) + quoted(m.Pending)
	}
	return n
}

func (m *PlanModule) appendJSON(b []byte) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, m.Name)
	b = append(b, `,"build":`...)
	b = appendString(b, m.Build)
	b = append(b, `,"runs_as":`...)
	b = appendString(b, m.RunsAs)
	b = append(b, `,"files":`...)
	if m.Files == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, f := range m.Files {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"path":`...)
			b = appendString(b, f.Path)
			b = append(b, `,"mode":`...)
			b = appendString(b, string(f.Mode))
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if m.Provisioner {
		b = append(b, `,"provisioner":true`...)
	}
	if m.Held {
		b = append(b, `,"held":true`...)
	}
	if m.Why != "" {
		b = append(b, `,"why":`...)
		b = appendString(b, string(m.Why))
	}
	if m.Pending != "" {
		b = append(b, `,"pending":`...)
		b = appendString(b, m.Pending)
	}
	return append(b, '}')
}

func (k *Knock) appendBody(b []byte) []byte {
	b = append(b, `,"cause":`...)
	b = strconv.AppendUint(b, k.Cause, 10)
	b = append(b, `,"reasons":`...)
	if k.Reasons == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, r := range k.Reasons {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, string(r))
		}
		b = append(b, ']')
	}
	b = append(b, `,"owed":`...)
	if k.Owed == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range k.Owed {
			o := &k.Owed[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"module":`...)
			b = appendString(b, o.Module)
			b = append(b, `,"path":`...)
			b = appendString(b, o.Path)
			b = append(b, `,"reason":`...)
			b = appendString(b, string(o.Reason))
			b = append(b, `,"plan":`...)
			b = strconv.AppendUint(b, o.Plan, 10)
			b = append(b, `,"writer":`...)
			b = appendString(b, o.Writer)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// size: as Plan.size.
func (k *Knock) size() int {
	reasons, owed := 0, 0
	for _, r := range k.Reasons {
		reasons += quoted(string(r))
	}
	for i := range k.Owed {
		o := &k.Owed[i]
		owed += len(`{"module":`) + quoted(o.Module) + len(`,"path":`) + quoted(o.Path) +
			len(`,"reason":`) + quoted(string(o.Reason)) + len(`,"plan":`) + digits(o.Plan) +
			len(`,"writer":`) + quoted(o.Writer) + len(`}`)
	}
	return len(`,"cause":`) + digits(k.Cause) + len(`,"reasons":`) + list(k.Reasons == nil, len(k.Reasons), reasons) +
		len(`,"owed":`) + list(k.Owed == nil, len(k.Owed), owed) + len(`}`)
}

func (j *Journal) appendBody(b []byte) []byte {
	b = append(b, `,"level":`...)
	b = appendString(b, string(j.Level))
	b = append(b, `,"msg":`...)
	b = appendString(b, j.Msg)
	b = append(b, `,"cause":`...)
	b = strconv.AppendUint(b, j.Cause, 10)
	return append(b, '}')
}

// size: as Plan.size.
func (j *Journal) size() int {
	return len(`,"level":`) + quoted(string(j.Level)) + len(`,"msg":`) + quoted(j.Msg) +
		len(`,"cause":`) + digits(j.Cause) + len(`}`)
}
