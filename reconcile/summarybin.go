package reconcile

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"

	"github.com/meshfold/meshfold/events"
)

// The fleet summary's format 3 ([SummaryFormat]): "3:" then, in
// base64 without padding (std alphabet: a NATS header's printable
// ASCII), the summary's fields in a fixed order as varints and strings,
// each string once (a repeat is a reference to the first: a module's
// name and a file's path come back in the owed items, the unfilled files
// and the runtime), each time as its Unix seconds, nanoseconds and zone
// offset. A reader decodes it with no reflection and no time parsing: at
// 100,000 nodes format 1's JSON, with RFC 3339 times, was a quarter of
// `meshfold fleet -o json`'s CPU (issue 27), and a third larger.
//
// The order, after the number of distinct strings and the snapshot
// format it summarizes: node, seq, want,
// emitted plan, settled plan, unsettled, modules, files, held, flags
// (account warning, then which of last knock, withheld, paused, retire,
// agent, ack and provisioner follow), the last knock's cause, have seq and time, the
// holds, the owed items and their times, the runtime, the pause, the
// retirement, the unfilled files, the failed applies, the agent, the ack,
// the provisioner (format 3; format 2 is the same without it, and counts
// no files), the missing files (format 4; format 3 is the same without
// them), each with its at_start (format 5; format 4 is the same without
// it), the noisy episode (format 6, when flagged; format 5 is the same
// without it, and a summary without an episode is written in format 5).
// A count precedes each list. TestSummaryBinaryCoversView fails when the
// view gains a field this order leaves out: add it here and bump
// [SummaryFormat].

// summaryPrefix starts a format 6 summary, summaryPrefix5 one of format 5
// (the same fields but the noisy episode), summaryPrefix4 one of format 4
// (the same fields but each missing file's at_start), summaryPrefix3 one of format
// 3 (the same fields but the missing files), summaryPrefix2 one of format
// 2 (those of format 3 but the provisioner's record, and no files
// counted); a format 1 summary is JSON: '{'.
const (
	summaryPrefix  = "6:"
	summaryPrefix5 = "5:"
	summaryPrefix4 = "4:"
	summaryPrefix3 = "3:"
	summaryPrefix2 = "2:"
)

const (
	flagAccountWarning = 1 << iota
	flagLastKnock
	flagWithheld
	flagPaused
	flagRetire
	flagAgent
	flagAck
	flagAgentUp
	flagRetireForce
	flagRetireRetired
	flagProv   // format 3
	flagProvUp // format 3
	flagNoisy  // format 6
)

// Time kinds: a zero time, a time in UTC, a time at a zone offset.
const (
	timeZero = iota
	timeUTC
	timeOffset
)

// The Unix seconds of 0000-01-01T00:00:00 and 9999-12-31T23:59:59 (at
// the time's own offset): RFC 3339's years.
const (
	minRFC3339 = -62167219200
	maxRFC3339 = 253402300799
)

// errSummaryShort: a format 2 summary ends before its fields do.
var errSummaryShort = errors.New("reconcile: fleet summary cut short")

// summaryEncoder writes format 2's fields.
type summaryEncoder struct {
	b    []byte
	seen map[string]int // strings written, by index
}

func (e *summaryEncoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *summaryEncoder) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }

// bool writes v as a varint, 0 or 1.
func (e *summaryEncoder) bool(v bool) {
	if v {
		e.uint(1)
	} else {
		e.uint(0)
	}
}

// str writes s as 2·len+0 then its bytes the first time, 2·index+1 after.
func (e *summaryEncoder) str(s string) {
	if s != "" {
		if i, ok := e.seen[s]; ok {
			e.uint(uint64(i)<<1 | 1)
			return
		}
		if e.seen == nil {
			e.seen = map[string]int{}
		}
		e.seen[s] = len(e.seen)
	}
	e.uint(uint64(len(s)) << 1)
	e.b = append(e.b, s...)
}

func (e *summaryEncoder) time(t time.Time) {
	if t.IsZero() {
		e.uint(timeZero)
		return
	}
	if _, off := t.Zone(); off != 0 {
		e.uint(timeOffset)
		e.int(int64(off))
	} else {
		e.uint(timeUTC)
	}
	e.int(t.Unix())
	e.uint(uint64(t.Nanosecond()))
}

func (e *summaryEncoder) timePtr(t *time.Time) {
	if t == nil {
		e.uint(0)
		return
	}
	e.uint(1)
	e.time(*t)
}

// marshalSummaryBinary encodes v (a fleet summary: View.FleetSummary) in
// format 2, as a summary of a snapshot of format snapshot (stateFormat):
// a reader that refuses that snapshot refuses its summary too.
func marshalSummaryBinary(v View, snapshot int) []byte {
	e := summaryEncoder{b: make([]byte, 0, 512)}
	e.uint(uint64(snapshot))
	e.str(v.Node)
	for _, u := range []uint64{v.Seq, v.Want, v.EmittedPlan, v.SettledPlan} {
		e.uint(u)
	}
	for _, n := range []int{v.Unsettled, v.Modules, v.Files, v.Held} {
		e.int(int64(n))
	}
	var flags uint64
	set := func(cond bool, f uint64) {
		if cond {
			flags |= f
		}
	}
	set(v.AccountWarning, flagAccountWarning)
	set(v.LastKnock != nil, flagLastKnock)
	set(v.Withheld != nil, flagWithheld)
	set(v.Paused != nil, flagPaused)
	set(v.Retire != nil, flagRetire)
	set(v.Agent != nil, flagAgent)
	set(v.Ack != nil, flagAck)
	set(v.Agent != nil && v.Agent.Up, flagAgentUp)
	set(v.Retire != nil && v.Retire.Force, flagRetireForce)
	set(v.Retire != nil && v.Retire.Retired, flagRetireRetired)
	set(v.Provisioner != nil, flagProv)
	set(v.Provisioner != nil && v.Provisioner.Up, flagProvUp)
	set(v.Noisy != nil, flagNoisy)
	e.uint(flags)
	if v.LastKnock != nil {
		e.uint(v.LastKnock.Cause)
	}
	e.uint(v.HaveSeq)
	e.time(v.HaveTime)
	e.uint(uint64(len(v.Holds)))
	for _, h := range v.Holds {
		e.str(h.Module)
		e.str(string(h.Why))
		e.str(h.Build)
		e.str(h.Pending)
	}
	e.uint(uint64(len(v.Owed)))
	for _, o := range v.Owed {
		e.str(o.Module)
		e.str(o.Path)
		e.str(string(o.Reason))
		e.uint(o.Plan)
		e.str(o.Writer)
	}
	e.uint(uint64(len(v.OwedAt)))
	for _, t := range v.OwedAt {
		e.time(t)
	}
	e.uint(uint64(len(v.OwedWhy)))
	for _, s := range v.OwedWhy {
		e.str(s)
	}
	e.uint(uint64(len(v.Runtime)))
	for _, r := range v.Runtime {
		e.str(r.Module)
		e.str(r.Build)
		e.str(string(r.State))
		e.str(r.Account)
		e.int(int64(r.Restarts))
		e.int(int64(r.FillRestarts))
		e.str(r.Exit)
		e.timePtr(r.Since)
		e.str(string(r.Health))
		e.timePtr(r.HealthSince)
		e.uint(uint64(len(r.Crashes)))
		for _, t := range r.Crashes {
			e.time(t)
		}
		e.uint(uint64(len(r.Unfilled)))
		for _, s := range r.Unfilled {
			e.str(s)
		}
	}
	if p := v.Paused; p != nil {
		e.uint(p.Seq)
		e.time(p.Time)
		e.str(p.By)
		e.str(p.Reason)
	}
	if r := v.Retire; r != nil {
		e.uint(r.Seq)
		e.time(r.Time)
		e.str(r.By)
		e.uint(r.RetiredSeq)
		e.time(r.RetiredTime)
	}
	e.uint(uint64(len(v.Unfilled)))
	for _, u := range v.Unfilled {
		e.str(u.Module)
		e.str(u.Path)
		e.uint(u.Plan)
		e.time(u.Since)
	}
	e.uint(uint64(len(v.Failed)))
	for _, f := range v.Failed {
		e.str(f.Module)
		e.uint(f.Plan)
		e.uint(f.Seq)
		e.time(f.Time)
		e.str(f.Error)
	}
	if a := v.Agent; a != nil {
		e.uint(a.Seq)
		e.time(a.Time)
		e.str(a.Claim)
		e.str(a.Host)
		e.int(int64(a.PID))
		e.str(string(a.Why))
	}
	if a := v.Ack; a != nil {
		e.uint(a.Seq)
		e.time(a.Time)
		e.str(a.By)
		e.uint(a.Upto)
	}
	if p := v.Provisioner; p != nil {
		e.uint(p.Seq)
		e.time(p.Time)
		e.str(p.Claim)
		e.str(p.Host)
		e.int(int64(p.PID))
		e.str(string(p.Why))
	}
	e.uint(uint64(len(v.Missing)))
	for _, m := range v.Missing {
		e.str(m.Module)
		e.str(m.Path)
		e.uint(m.Seq)
		e.time(m.Time)
		e.bool(m.AtStart) // format 5
	}
	prefix := summaryPrefix5
	if n := v.Noisy; n != nil {
		prefix = summaryPrefix
		e.uint(n.Seq)
		e.time(n.Since)
		e.uint(n.SinceSeq)
		e.uint(n.LastSeq)
		e.time(n.Last)
		for _, c := range []int{n.Haves, n.Settles, n.Refusals, n.Filled} {
			e.int(int64(c))
		}
		e.int(n.Bytes)
	}
	// How many strings the table holds comes first: a reader makes it
	// once.
	body := binary.AppendUvarint(make([]byte, 0, len(e.b)+2), uint64(len(e.seen)))
	body = append(body, e.b...)
	out := make([]byte, len(prefix)+base64.RawStdEncoding.EncodedLen(len(body)))
	copy(out, prefix)
	base64.RawStdEncoding.Encode(out[len(prefix):], body)
	return out
}

// summaryDecoder reads format 2's fields from s, the decoded bytes
// copied once: strings are slices of it, one allocation a summary, not
// one a string.
type summaryDecoder struct {
	s    string
	err  error
	seen []string
	// zone is the fixed zone of offset off, made by the first time at an
	// offset: one Location a summary, not one a time.
	off  int
	zone *time.Location
}

func (d *summaryDecoder) fail() {
	if d.err == nil {
		d.err = errSummaryShort
	}
	d.s = ""
}

// uint reads a uvarint (encoding/binary's).
func (d *summaryDecoder) uint() uint64 {
	var v uint64
	for i := 0; i < len(d.s) && i < binary.MaxVarintLen64; i++ {
		c := d.s[i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				break // overflow
			}
			d.s = d.s[i+1:]
			return v | uint64(c)<<(7*i)
		}
		v |= uint64(c&0x7f) << (7 * i)
	}
	d.fail()
	return 0
}

// int reads a varint (encoding/binary's: zig-zag).
// bool reads a varint, 0 or 1.
func (d *summaryDecoder) bool() bool {
	switch d.uint() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail()
	return false
}

func (d *summaryDecoder) int() int64 {
	u := d.uint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

// count reads a list's length, no more than the bytes left could hold
// at size bytes an element, the shortest an element is written in: a
// list is made before its elements are read, and a count taken on trust
// let a summary make its reader allocate over a hundred times its size
// (TestSummaryDecodeAllocationBounded).
func (d *summaryDecoder) count(size uint64) int {
	n := d.uint()
	if n > uint64(len(d.s))/size {
		d.fail()
		return 0
	}
	return int(n)
}

// The shortest encodings of a list's element, in bytes: one a string (its
// length, or a reference), a varint and a time (a zero time's kind); two
// a string of the table (a length and a byte at least).
const (
	minTableString = 2
	minHeld        = 4  // module, why, build, pending
	minOwed        = 5  // module, path, reason, plan, writer
	minTime        = 1  // a time
	minString      = 1  // a string
	minRuntime     = 12 // 6 strings, 2 varints, 2 optional times, 2 counts
	minUnfilled    = 4  // module, path, plan, since
	minFailed      = 5  // module, plan, seq, time, error
	minMissing     = 4  // module, path, seq, time
)

func (d *summaryDecoder) str() string {
	v := d.uint()
	if v&1 == 1 {
		i := v >> 1
		if i >= uint64(len(d.seen)) {
			d.fail()
			return ""
		}
		return d.seen[i]
	}
	n := v >> 1
	if n > uint64(len(d.s)) {
		d.fail()
		return ""
	}
	if n == 0 {
		return ""
	}
	s := d.s[:n]
	d.s = d.s[n:]
	d.seen = append(d.seen, s)
	return s
}

func (d *summaryDecoder) time() time.Time {
	kind := d.uint()
	if kind == timeZero {
		return time.Time{}
	}
	var off int64
	if kind == timeOffset {
		off = d.int()
	} else if kind != timeUTC {
		d.fail()
		return time.Time{}
	}
	sec, nsec := d.int(), d.uint()
	// What RFC 3339 can say, as a format 1 summary held it: a year of
	// four digits, a zone within a day. A row's JSON could not print
	// another time, and the whole of fleet's output would fail.
	if nsec >= 1e9 || off <= -86400 || off >= 86400 || sec+off < minRFC3339 || sec+off > maxRFC3339 {
		d.fail()
		return time.Time{}
	}
	t := time.Unix(sec, int64(nsec))
	if kind == timeUTC {
		return t.UTC()
	}
	if d.zone == nil || d.off != int(off) {
		d.off, d.zone = int(off), time.FixedZone("", int(off))
	}
	return t.In(d.zone)
}

func (d *summaryDecoder) timePtr() *time.Time {
	if d.uint() == 0 {
		return nil
	}
	t := d.time()
	return &t
}

// unmarshalSummaryBinary decodes a summary of format 2, 3 or 4 (after its
// prefix): the view, and the snapshot format it summarizes. Only format 4
// holds the missing files.
func unmarshalSummaryBinary(data []byte, format int) (View, int, error) {
	var stack [1024]byte
	buf := stack[:]
	if m := base64.RawStdEncoding.DecodedLen(len(data)); m > len(buf) {
		buf = make([]byte, m)
	}
	n, err := base64.RawStdEncoding.Decode(buf, data)
	if err != nil {
		return View{}, 0, err
	}
	d := summaryDecoder{s: string(buf[:n])}
	d.seen = make([]string, 0, d.count(minTableString))
	snapshot := int(d.uint())
	var v View
	v.Node = d.str()
	v.Seq, v.Want, v.EmittedPlan, v.SettledPlan = d.uint(), d.uint(), d.uint(), d.uint()
	v.Unsettled, v.Modules, v.Files, v.Held = int(d.int()), int(d.int()), int(d.int()), int(d.int())
	flags := d.uint()
	v.AccountWarning = flags&flagAccountWarning != 0
	if flags&flagLastKnock != 0 {
		v.LastKnock = &KnockRecord{Cause: d.uint()}
	}
	if flags&flagWithheld != 0 {
		v.Withheld = &PlanDiff{}
	}
	v.HaveSeq = d.uint()
	v.HaveTime = d.time()
	if n := d.count(minHeld); n > 0 {
		v.Holds = make([]Held, n)
		for i := range v.Holds {
			h := &v.Holds[i]
			h.Module, h.Why, h.Build, h.Pending = d.str(), events.HoldReason(d.str()), d.str(), d.str()
		}
	}
	if n := d.count(minOwed); n > 0 {
		v.Owed = make([]events.Owed, n)
		for i := range v.Owed {
			o := &v.Owed[i]
			o.Module, o.Path, o.Reason = d.str(), d.str(), events.Reason(d.str())
			o.Plan, o.Writer = d.uint(), d.str()
		}
	}
	if n := d.count(minTime); n > 0 {
		v.OwedAt = make([]time.Time, n)
		for i := range v.OwedAt {
			v.OwedAt[i] = d.time()
		}
	}
	if n := d.count(minString); n > 0 {
		v.OwedWhy = make([]string, n)
		for i := range v.OwedWhy {
			v.OwedWhy[i] = d.str()
		}
	}
	if n := d.count(minRuntime); n > 0 {
		v.Runtime = make([]ModuleRuntime, n)
		for i := range v.Runtime {
			r := &v.Runtime[i]
			r.Module, r.Build, r.State, r.Account = d.str(), d.str(), events.RunState(d.str()), d.str()
			r.Restarts, r.FillRestarts = int(d.int()), int(d.int())
			r.Exit = d.str()
			r.Since = d.timePtr()
			r.Health = events.Health(d.str())
			r.HealthSince = d.timePtr()
			if n := d.count(minTime); n > 0 {
				r.Crashes = make([]time.Time, n)
				for k := range r.Crashes {
					r.Crashes[k] = d.time()
				}
			}
			if n := d.count(minString); n > 0 {
				r.Unfilled = make([]string, n)
				for k := range r.Unfilled {
					r.Unfilled[k] = d.str()
				}
			}
		}
	}
	if flags&flagPaused != 0 {
		v.Paused = &PauseRecord{Seq: d.uint(), Time: d.time(), By: d.str(), Reason: d.str()}
	}
	if flags&flagRetire != 0 {
		v.Retire = &RetireRecord{Seq: d.uint(), Time: d.time(), By: d.str(),
			Force: flags&flagRetireForce != 0, Retired: flags&flagRetireRetired != 0}
		v.Retire.RetiredSeq, v.Retire.RetiredTime = d.uint(), d.time()
	}
	if n := d.count(minUnfilled); n > 0 {
		v.Unfilled = make([]Unfilled, n)
		for i := range v.Unfilled {
			u := &v.Unfilled[i]
			u.Module, u.Path, u.Plan, u.Since = d.str(), d.str(), d.uint(), d.time()
		}
	}
	if n := d.count(minFailed); n > 0 {
		v.Failed = make([]FailedApply, n)
		for i := range v.Failed {
			f := &v.Failed[i]
			f.Module, f.Plan, f.Seq, f.Time, f.Error = d.str(), d.uint(), d.uint(), d.time(), d.str()
		}
	}
	if flags&flagAgent != 0 {
		v.Agent = &AgentRecord{Up: flags&flagAgentUp != 0, Seq: d.uint(), Time: d.time(), Claim: d.str(), Host: d.str(),
			PID: int(d.int()), Why: events.AgentWhy(d.str())}
	}
	if flags&flagAck != 0 {
		v.Ack = &AckRecord{Seq: d.uint(), Time: d.time(), By: d.str(), Upto: d.uint()}
	}
	if flags&flagProv != 0 {
		v.Provisioner = &AgentRecord{Up: flags&flagProvUp != 0, Seq: d.uint(), Time: d.time(), Claim: d.str(), Host: d.str(),
			PID: int(d.int()), Why: events.AgentWhy(d.str())}
	}
	if format >= 4 {
		if n := d.count(minMissing); n > 0 {
			v.Missing = make([]MissingFile, n)
			for i := range v.Missing {
				m := &v.Missing[i]
				m.Module, m.Path, m.Seq, m.Time = d.str(), d.str(), d.uint(), d.time()
				if format >= 5 {
					m.AtStart = d.bool()
				}
			}
		}
	}
	if format >= 6 && flags&flagNoisy != 0 {
		n := &NoisyRecord{Seq: d.uint(), Since: d.time(), SinceSeq: d.uint(), LastSeq: d.uint(), Last: d.time()}
		n.Haves, n.Settles, n.Refusals, n.Filled = int(d.int()), int(d.int()), int(d.int()), int(d.int())
		n.Bytes = d.int()
		v.Noisy = n
	}
	if d.err == nil && len(d.s) != 0 {
		d.err = errors.New("reconcile: fleet summary longer than its fields")
	}
	if d.err != nil {
		return View{}, 0, d.err
	}
	return v, snapshot, nil
}
