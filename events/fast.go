package events

import "time"

// A fast path for the kinds the reconciler folds most (have, settle,
// refusal, filled, want, plan, knock): it reads the JSON that [Encode]
// writes (known keys, each once, in any order; no escapes, no null but a
// module's files (Encode writes a row without files as null), no
// non-ASCII byte, integers without sign, fraction or exponent, `at` and
// `since` as RFC 3339 in UTC) straight into the payload, without
// reflection. Anything else, valid or not, it declines, and [Decode]
// reads the data with the general decoder, whose results and errors stay
// the only ones: the fast path gives exactly the payload the general one
// would, or nothing (FuzzFastDecode holds it to that).

// scan is one payload being read: b from i.
type scan struct {
	b []byte
	i int
	d *Decoder // its strings, when not nil
}

func (s *scan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips white space and reports whether the next byte is c, taking
// it if so.
func (s *scan) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// raw reads a string of printable ASCII without escapes and returns its
// bytes (aliasing b: copy before keeping).
func (s *scan) raw() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			return v, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
		s.i++
	}
	return nil, false
}

// str reads a string as [scan.raw] does and returns a copy of it (one
// equal string of d's, when d keeps one).
func (s *scan) str(dst *string) bool {
	v, ok := s.raw()
	if !ok {
		return false
	}
	*dst = s.d.text(v)
	return true
}

// num reads an unsigned integer of at most 18 digits, without a leading
// zero, followed by a delimiter.
func (s *scan) num() (uint64, bool) {
	s.ws()
	start := s.i
	var n uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		n = n*10 + uint64(s.b[s.i]-'0')
		s.i++
	}
	d := s.i - start
	if d == 0 || d > 18 || (d > 1 && s.b[start] == '0') {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
		default:
			return 0, false
		}
	}
	return n, true
}

func (s *scan) u64(dst *uint64) bool {
	n, ok := s.num()
	*dst = n
	return ok
}

func (s *scan) int(dst *int) bool {
	n, ok := s.num()
	*dst = int(n)
	return ok
}

// null reads the literal null, followed by a delimiter, when it comes
// next; it takes nothing otherwise.
func (s *scan) null() bool {
	s.ws()
	if len(s.b)-s.i < 4 || string(s.b[s.i:s.i+4]) != "null" {
		return false
	}
	if j := s.i + 4; j < len(s.b) {
		switch s.b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
		default:
			return false
		}
	}
	s.i += 4
	return true
}

func (s *scan) bool(dst *bool) bool {
	s.ws()
	switch {
	case len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "true":
		s.i += 4
		*dst = true
	case len(s.b)-s.i >= 5 && string(s.b[s.i:s.i+5]) == "false":
		s.i += 5
		*dst = false
	default:
		return false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
		default:
			return false
		}
	}
	return true
}

// time reads "YYYY-MM-DDTHH:MM:SS[.fraction]Z" with every field in its
// range.
func (s *scan) time(dst *time.Time) bool {
	v, ok := s.raw()
	if !ok || len(v) < 20 || v[len(v)-1] != 'Z' ||
		v[4] != '-' || v[7] != '-' || v[10] != 'T' || v[13] != ':' || v[16] != ':' {
		return false
	}
	digits := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := digits(v[0:4])
	month, ok2 := digits(v[5:7])
	day, ok3 := digits(v[8:10])
	hour, ok4 := digits(v[11:13])
	minute, ok5 := digits(v[14:16])
	sec, ok6 := digits(v[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 ||
		day > daysIn(time.Month(month), year) || hour > 23 || minute > 59 || sec > 59 {
		return false
	}
	nsec := 0
	if len(v) > 20 {
		frac := v[19 : len(v)-1]
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return false
		}
		f, ok := digits(frac[1:])
		if !ok {
			return false
		}
		for range 10 - len(frac) {
			f *= 10
		}
		nsec = f
	}
	*dst = time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return true
}

func daysIn(m time.Month, year int) int {
	return time.Date(year, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// object reads an object, calling field for each key, which reads the
// value. Each key may come once: field's index for it marks it seen.
func (s *scan) object(field func(key []byte) (int, bool)) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	var seen uint64
	for {
		key, ok := s.raw()
		if !ok || !s.next(':') {
			return false
		}
		n, ok := field(key)
		if !ok || seen&(1<<n) != 0 {
			return false
		}
		seen |= 1 << n
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// array reads an array, calling elem for each element, and reports
// whether it held any.
func (s *scan) array(elem func() bool) bool {
	if !s.next('[') {
		return false
	}
	if s.next(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.next(']') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// header reads the header's keys; n continues after them.
func (s *scan) header(h *Header, key []byte) (int, bool) {
	switch string(key) {
	case "v":
		return 0, s.int(&h.V)
	case "at":
		return 1, s.time(&h.At)
	}
	return 0, false
}

// end reports whether only white space is left.
func (s *scan) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// files reads a module's files: an array, or null (a nil slice, as the
// general decoder gives), which is how Encode writes a plan's row without
// files (the provisioner client's, a module that declares none). Every
// such plan took the general decoder until then (issue 27, item 1).
func (s *scan) files(dst *[]File) bool {
	if s.null() {
		*dst = nil
		return true
	}
	var buf [MaxFilesPerModule]File
	fs := buf[:0]
	ok := s.array(func() bool {
		var f File
		if len(fs) == len(buf) {
			return false
		}
		ok := s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "path":
				return 0, s.str(&f.Path)
			case "mode":
				return 1, s.str((*string)(&f.Mode))
			}
			return 0, false
		})
		fs = append(fs, f)
		return ok
	})
	*dst = append(make([]File, 0, len(fs)), fs...)
	return ok
}

// fastDecode reads data as a payload of kind k on the fast path, or
// reports false.
func fastDecode(k Kind, data []byte, d *Decoder) (Payload, bool) {
	s := &scan{b: data, d: d}
	var p Payload
	var ok bool
	switch k {
	case KindHave:
		v := new(Have)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "modules":
				return 2, s.haveModules(&v.Modules)
			case "no_plan":
				return 3, s.bool(&v.NoPlan)
			case "looked_before":
				return 4, s.u64(&v.LookedBefore)
			}
			return s.header(&v.Header, key)
		})
	case KindWant:
		v := new(Want)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "modules":
				return 2, s.wantModules(&v.Modules)
			case "gates":
				return 3, s.bool(&v.Gates)
			}
			return s.header(&v.Header, key)
		})
	case KindPlan:
		v := new(Plan)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "cause":
				return 2, s.u64(&v.Cause)
			case "want":
				return 3, s.u64(&v.Want)
			case "provisioner_account":
				return 4, s.str(&v.ProvisionerAccount)
			case "modules":
				return 5, s.planModules(&v.Modules)
			}
			return s.header(&v.Header, key)
		})
	case KindSettle:
		v := new(Settle)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "module":
				return 2, s.str(&v.Module)
			case "op":
				return 3, s.str((*string)(&v.Op))
			case "plan":
				return 4, s.u64(&v.Plan)
			case "error":
				return 5, s.str(&v.Error)
			case "untrusted":
				return 6, s.bool(&v.Untrusted)
			}
			return s.header(&v.Header, key)
		})
	case KindRefusal:
		v := new(Refusal)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "module":
				return 2, s.str(&v.Module)
			case "path":
				return 3, s.str(&v.Path)
			case "reason":
				return 4, s.str((*string)(&v.Reason))
			case "plan":
				return 5, s.u64(&v.Plan)
			case "writer":
				return 6, s.str(&v.Writer)
			case "error":
				return 7, s.str(&v.Error)
			}
			return s.header(&v.Header, key)
		})
	case KindFilled:
		v := new(Filled)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "module":
				return 2, s.str(&v.Module)
			case "path":
				return 3, s.str(&v.Path)
			case "plan":
				return 4, s.u64(&v.Plan)
			case "digest":
				return 5, s.str(&v.Digest)
			case "claim":
				return 6, s.str(&v.Claim)
			}
			return s.header(&v.Header, key)
		})
	case KindKnock:
		v := new(Knock)
		p, ok = v, s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "cause":
				return 2, s.u64(&v.Cause)
			case "reasons":
				return 3, s.knockReasons(&v.Reasons)
			case "owed":
				return 4, s.owed(&v.Owed)
			}
			return s.header(&v.Header, key)
		})
	default:
		return nil, false
	}
	if !ok || !s.end() {
		return nil, false
	}
	return p, true
}

func (s *scan) haveModules(dst *[]HaveModule) bool {
	var buf [8]HaveModule
	ms := buf[:0]
	ok := s.array(func() bool {
		var m HaveModule
		ok := s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "name":
				return 0, s.str(&m.Name)
			case "build":
				return 1, s.str(&m.Build)
			case "state":
				return 2, s.str((*string)(&m.State))
			case "account":
				return 3, s.str(&m.Account)
			case "restarts":
				return 4, s.int(&m.Restarts)
			case "fill_restarts":
				return 5, s.int(&m.FillRestarts)
			case "exit":
				return 6, s.str(&m.Exit)
			case "since":
				t := new(time.Time)
				m.Since = t
				return 7, s.time(t)
			case "health":
				return 8, s.str((*string)(&m.Health))
			}
			return 0, false
		})
		ms = append(ms, m)
		return ok
	})
	*dst = append(make([]HaveModule, 0, len(ms)), ms...)
	return ok
}

func (s *scan) wantModules(dst *[]WantModule) bool {
	var buf [8]WantModule
	ms := buf[:0]
	ok := s.array(func() bool {
		var m WantModule
		ok := s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "name":
				return 0, s.str(&m.Name)
			case "build":
				return 1, s.str(&m.Build)
			case "runs_as":
				return 2, s.str(&m.RunsAs)
			case "files":
				return 3, s.files(&m.Files)
			case "provisioner":
				return 4, s.bool(&m.Provisioner)
			case "requires_approval":
				return 5, s.bool(&m.RequiresApproval)
			case "hold":
				return 6, s.bool(&m.Hold)
			}
			return 0, false
		})
		ms = append(ms, m)
		return ok
	})
	*dst = append(make([]WantModule, 0, len(ms)), ms...)
	return ok
}

func (s *scan) planModules(dst *[]PlanModule) bool {
	var buf [8]PlanModule
	ms := buf[:0]
	ok := s.array(func() bool {
		var m PlanModule
		ok := s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "name":
				return 0, s.str(&m.Name)
			case "build":
				return 1, s.str(&m.Build)
			case "runs_as":
				return 2, s.str(&m.RunsAs)
			case "files":
				return 3, s.files(&m.Files)
			case "provisioner":
				return 4, s.bool(&m.Provisioner)
			case "held":
				return 5, s.bool(&m.Held)
			case "why":
				return 6, s.str((*string)(&m.Why))
			case "pending":
				return 7, s.str(&m.Pending)
			}
			return 0, false
		})
		ms = append(ms, m)
		return ok
	})
	*dst = append(make([]PlanModule, 0, len(ms)), ms...)
	return ok
}

func (s *scan) knockReasons(dst *[]KnockReason) bool {
	var buf [4]KnockReason
	rs := buf[:0]
	ok := s.array(func() bool {
		var r string
		ok := s.str(&r)
		rs = append(rs, KnockReason(r))
		return ok
	})
	*dst = append(make([]KnockReason, 0, len(rs)), rs...)
	return ok
}

func (s *scan) owed(dst *[]Owed) bool {
	var buf [4]Owed
	os := buf[:0]
	ok := s.array(func() bool {
		var o Owed
		ok := s.object(func(key []byte) (int, bool) {
			switch string(key) {
			case "module":
				return 0, s.str(&o.Module)
			case "path":
				return 1, s.str(&o.Path)
			case "reason":
				return 2, s.str((*string)(&o.Reason))
			case "plan":
				return 3, s.u64(&o.Plan)
			case "writer":
				return 4, s.str(&o.Writer)
			}
			return 0, false
		})
		os = append(os, o)
		return ok
	})
	*dst = append(make([]Owed, 0, len(os)), os...)
	return ok
}
