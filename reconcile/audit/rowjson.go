package audit

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/meshfold/meshfold/reconcile"
)

// AppendJSON appends r's JSON, byte for byte what encoding/json.Marshal
// writes for it, to b. The fields most rows carry are written directly,
// the rest by encoding/json: at 100,000 rows, encoding/json's reflection
// was a quarter of `meshfold fleet -o json`'s CPU (issue 27).
// TestFleetRowAppendJSON compares the two over rows with every field set
// and with none.
//
// Errors: encoding/json's, for a value it cannot encode (a time outside
// years 0–9999, a NaN age).
func (r *FleetRow) AppendJSON(b []byte) ([]byte, error) {
	var err error
	b = append(b, `{"node":`...)
	b = appendJSONString(b, r.Node)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	if r.Behind {
		b = append(b, `,"behind":true`...)
	}
	if r.NewestSeq != 0 {
		b = append(b, `,"newest_seq":`...)
		b = strconv.AppendUint(b, r.NewestSeq, 10)
	}
	b = append(b, `,"want":`...)
	b = strconv.AppendUint(b, r.Want, 10)
	b = append(b, `,"settled_plan":`...)
	b = strconv.AppendUint(b, r.SettledPlan, 10)
	b = append(b, `,"emitted_plan":`...)
	b = strconv.AppendUint(b, r.EmittedPlan, 10)
	b = append(b, `,"unsettled":`...)
	b = strconv.AppendInt(b, int64(r.Unsettled), 10)
	b = append(b, `,"modules":`...)
	b = strconv.AppendInt(b, int64(r.Modules), 10)
	b = append(b, `,"held":`...)
	b = strconv.AppendInt(b, int64(r.Held), 10)
	if len(r.Pending) > 0 {
		b = append(b, `,"pending":[`...)
		for i, h := range r.Pending {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"module":`...)
			b = appendJSONString(b, h.Module)
			b = append(b, `,"why":`...)
			b = appendJSONString(b, string(h.Why))
			b = append(b, `,"build":`...)
			b = appendJSONString(b, h.Build)
			if h.Pending != "" {
				b = append(b, `,"pending":`...)
				b = appendJSONString(b, h.Pending)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"owed":`...)
	b = strconv.AppendInt(b, int64(r.Owed), 10)
	if r.LastKnockCause != 0 {
		b = append(b, `,"last_knock_cause":`...)
		b = strconv.AppendUint(b, r.LastKnockCause, 10)
	}
	if !r.HaveTime.IsZero() {
		if b, err = appendTime(b, `,"have_time":`, r.HaveTime); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"have_age_s":`...)
	if b, err = appendFloat(b, r.HaveAge); err != nil {
		return nil, err
	}
	b = append(b, `,"stale_have":`...)
	b = strconv.AppendBool(b, r.StaleHave)
	b = append(b, `,"account_warning":`...)
	b = strconv.AppendBool(b, r.AccountWarning)
	if r.Agent != "" {
		b = append(b, `,"agent":`...)
		b = appendJSONString(b, r.Agent)
	}
	if !r.AgentSince.IsZero() {
		if b, err = appendTime(b, `,"agent_since":`, r.AgentSince); err != nil {
			return nil, err
		}
	}
	if !r.FeedLost.IsZero() {
		if b, err = appendTime(b, `,"feed_lost":`, r.FeedLost); err != nil {
			return nil, err
		}
	}
	if len(r.Failed) > 0 {
		if b, err = appendRuntimes(b, `,"failed":`, r.Failed); err != nil {
			return nil, err
		}
	}
	if len(r.FailedApplies) > 0 {
		if b, err = appendMarshal(b, `,"failed_applies":`, r.FailedApplies); err != nil {
			return nil, err
		}
	}
	if len(r.Missing) > 0 {
		if b, err = appendMarshal(b, `,"missing":`, r.Missing); err != nil {
			return nil, err
		}
	}
	if r.Noisy != nil {
		if b, err = appendMarshal(b, `,"noisy":`, r.Noisy); err != nil {
			return nil, err
		}
	}
	if len(r.Unhealthy) > 0 {
		if b, err = appendRuntimes(b, `,"unhealthy":`, r.Unhealthy); err != nil {
			return nil, err
		}
	}
	if len(r.Flapping) > 0 {
		if b, err = appendRuntimes(b, `,"flapping":`, r.Flapping); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"journal_warnings":`...)
	b = strconv.AppendInt(b, int64(r.Warnings), 10)
	if r.ClearedWarnings != 0 {
		b = append(b, `,"journal_warnings_cleared":`...)
		b = strconv.AppendInt(b, int64(r.ClearedWarnings), 10)
	}
	if r.AckedWarnings != 0 {
		b = append(b, `,"journal_warnings_acked":`...)
		b = strconv.AppendInt(b, int64(r.AckedWarnings), 10)
	}
	if r.Ack != nil {
		if b, err = appendMarshal(b, `,"ack":`, r.Ack); err != nil {
			return nil, err
		}
	}
	if len(r.Sources) > 0 {
		if b, err = appendMarshal(b, `,"source_problems":`, r.Sources); err != nil {
			return nil, err
		}
	}
	if r.ProvisionerDown != nil {
		if b, err = appendMarshal(b, `,"provisioner_down":`, r.ProvisionerDown); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"attention":`...)
	if r.Attention == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, a := range r.Attention {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, a)
		}
		b = append(b, ']')
	}
	if r.Error != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, r.Error)
	}
	if b, err = appendStuck(b, &r.Stuck); err != nil {
		return nil, err
	}
	if r.Retired {
		b = append(b, `,"retired":true`...)
	}
	return append(b, '}'), nil
}

// appendStuck appends k as the "stuck" field, in encoding/json's field
// order: the pause, its age, the retirement's state, the files never
// filled, the owed items waiting, withheld, the retirement.
func appendStuck(b []byte, k *reconcile.Stuck) ([]byte, error) {
	var err error
	b = append(b, `,"stuck":{`...)
	sep := ""
	field := func(key string) {
		b = append(b, sep...)
		b = append(b, key...)
		sep = ","
	}
	if p := k.Paused; p != nil {
		field(`"paused":{"seq":`)
		b = strconv.AppendUint(b, p.Seq, 10)
		if b, err = appendTime(b, `,"time":`, p.Time); err != nil {
			return nil, err
		}
		b = append(b, `,"by":`...)
		b = appendJSONString(b, p.By)
		if p.Reason != "" {
			b = append(b, `,"reason":`...)
			b = appendJSONString(b, p.Reason)
		}
		b = append(b, '}')
	}
	if k.PausedFor != 0 {
		field(`"paused_for_s":`)
		if b, err = appendFloat(b, k.PausedFor); err != nil {
			return nil, err
		}
	}
	if k.Retiring {
		field(`"retiring":true`)
	}
	if k.Retired {
		field(`"retired":true`)
	}
	if len(k.Unfilled) > 0 {
		field(`"unfilled":[`)
		for i := range k.Unfilled {
			f := &k.Unfilled[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"module":`...)
			b = appendJSONString(b, f.Module)
			b = append(b, `,"path":`...)
			b = appendJSONString(b, f.Path)
			b = append(b, `,"plan":`...)
			b = strconv.AppendUint(b, f.Plan, 10)
			if b, err = appendTime(b, `,"since":`, f.Since); err != nil {
				return nil, err
			}
			b = append(b, `,"for_s":`...)
			if b, err = appendFloat(b, f.For); err != nil {
				return nil, err
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(k.Owed) > 0 {
		field(`"owed":[`)
		for i := range k.Owed {
			o := &k.Owed[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"module":`...)
			b = appendJSONString(b, o.Module)
			b = append(b, `,"path":`...)
			b = appendJSONString(b, o.Path)
			b = append(b, `,"reason":`...)
			b = appendJSONString(b, string(o.Reason))
			b = append(b, `,"plan":`...)
			b = strconv.AppendUint(b, o.Plan, 10)
			b = append(b, `,"writer":`...)
			b = appendJSONString(b, o.Writer)
			if b, err = appendTime(b, `,"since":`, o.Since); err != nil {
				return nil, err
			}
			b = append(b, `,"for_s":`...)
			if b, err = appendFloat(b, o.For); err != nil {
				return nil, err
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if k.Withheld {
		field(`"withheld":true`)
	}
	if r := k.Retire; r != nil {
		field(`"retire":{"seq":`)
		b = strconv.AppendUint(b, r.Seq, 10)
		if b, err = appendTime(b, `,"time":`, r.Time); err != nil {
			return nil, err
		}
		b = append(b, `,"by":`...)
		b = appendJSONString(b, r.By)
		if r.Force {
			b = append(b, `,"force":true`...)
		}
		if r.Retired {
			b = append(b, `,"retired":true`...)
		}
		if r.RetiredSeq != 0 {
			b = append(b, `,"retired_seq":`...)
			b = strconv.AppendUint(b, r.RetiredSeq, 10)
		}
		if !r.RetiredTime.IsZero() {
			if b, err = appendTime(b, `,"retired_time":`, r.RetiredTime); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

// appendRuntimes appends key and rs as encoding/json encodes them: a
// fifth of the bench's nodes have a failed module, and encoding/json's
// reflection over them was a quarter of the rows' encoding.
func appendRuntimes(b []byte, key string, rs []reconcile.ModuleRuntime) ([]byte, error) {
	var err error
	b = append(b, key...)
	b = append(b, '[')
	for i := range rs {
		r := &rs[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"module":`...)
		b = appendJSONString(b, r.Module)
		b = append(b, `,"build":`...)
		b = appendJSONString(b, r.Build)
		b = append(b, `,"state":`...)
		b = appendJSONString(b, string(r.State))
		if r.Account != "" {
			b = append(b, `,"account":`...)
			b = appendJSONString(b, r.Account)
		}
		b = append(b, `,"restarts":`...)
		b = strconv.AppendInt(b, int64(r.Restarts), 10)
		if r.FillRestarts != 0 {
			b = append(b, `,"fill_restarts":`...)
			b = strconv.AppendInt(b, int64(r.FillRestarts), 10)
		}
		if r.Exit != "" {
			b = append(b, `,"exit":`...)
			b = appendJSONString(b, r.Exit)
		}
		if r.Since != nil {
			if b, err = appendTime(b, `,"since":`, *r.Since); err != nil {
				return nil, err
			}
		}
		if r.Health != "" {
			b = append(b, `,"health":`...)
			b = appendJSONString(b, string(r.Health))
		}
		if r.HealthSince != nil {
			if b, err = appendTime(b, `,"health_since":`, *r.HealthSince); err != nil {
				return nil, err
			}
		}
		if len(r.Crashes) > 0 {
			b = append(b, `,"crashes":[`...)
			for k, t := range r.Crashes {
				sep := ","
				if k == 0 {
					sep = ""
				}
				if b, err = appendTime(b, sep, t); err != nil {
					return nil, err
				}
			}
			b = append(b, ']')
		}
		if len(r.Unfilled) > 0 {
			b = append(b, `,"unfilled":[`...)
			for k, p := range r.Unfilled {
				if k > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, p)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	return append(b, ']'), nil
}

// appendMarshal appends key and v as encoding/json encodes it.
func appendMarshal(b []byte, key string, v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(append(b, key...), j...), nil
}

// appendTime appends key and t as encoding/json encodes it (time.Time's
// MarshalJSON: RFC 3339 with nanoseconds, quoted). A time of years
// 0–9999 at an offset within a day is written by appendRFC3339, the
// others by time.Time.AppendText (which refuses some).
func appendTime(b []byte, key string, t time.Time) ([]byte, error) {
	b = append(b, key...)
	b = append(b, '"')
	_, off := t.Zone()
	if sec := t.Unix() + int64(off); sec >= minRFC3339 && sec <= maxRFC3339 && off > -86400 && off < 86400 {
		b = appendRFC3339(b, sec, t.Nanosecond(), off)
		return append(b, '"'), nil
	}
	b, err := t.AppendText(b)
	if err != nil {
		return nil, fmt.Errorf("json: error calling MarshalJSON for type time.Time: %w", err)
	}
	return append(b, '"'), nil
}

// The Unix seconds of 0000-01-01T00:00:00 and 9999-12-31T23:59:59: the
// years RFC 3339 can write.
const (
	minRFC3339 = -62167219200
	maxRFC3339 = 253402300799
)

// appendRFC3339 appends the time sec seconds after 1970-01-01T00:00:00
// in its own zone (minRFC3339 ≤ sec ≤ maxRFC3339), nsec nanoseconds on,
// at off seconds east of UTC (|off| < 86,400), byte for byte as
// time.Time.AppendText writes it: fixed-width fields, the nanoseconds
// without their trailing zeros (none when 0), Z for a zero offset and
// ±hh:mm of its whole minutes otherwise. time's own writer, which finds
// the zone and the date its general way, was a fifth of a fleet row's
// encoding (issue 27: five times a row at 100,000 rows);
// TestAppendRFC3339MatchesTime compares the two.
func appendRFC3339(b []byte, sec int64, nsec, off int) []byte {
	days := sec / 86400
	secs := int(sec - days*86400)
	if secs < 0 {
		days--
		secs += 86400
	}
	// The civil date of a day count (H. Hinnant's days_from_civil,
	// inverted), eras of 400 years from 0000-03-01.
	z := days + 719468
	era := z
	if era < 0 {
		era -= 146096
	}
	era /= 146097
	doe := z - era*146097                                  // [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // [0, 399]
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // [0, 365]
	mp := (5*doy + 2) / 153                                // [0, 11], from March
	day := doy - (153*mp+2)/5 + 1
	month := mp + 3
	if month > 12 {
		month -= 12
	}
	year := yoe + era*400
	if month <= 2 {
		year++
	}
	y := int(year)
	b = append(b, byte('0'+y/1000), byte('0'+y/100%10), byte('0'+y/10%10), byte('0'+y%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T')
	h, m, s := secs/3600, secs/60%60, secs%60
	b = append(b, byte('0'+h/10), byte('0'+h%10), ':', byte('0'+m/10), byte('0'+m%10), ':', byte('0'+s/10), byte('0'+s%10))
	if nsec != 0 {
		var frac [10]byte
		frac[0] = '.'
		for i, v := 9, nsec; i > 0; i-- {
			frac[i] = byte('0' + v%10)
			v /= 10
		}
		n := 10
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	if off == 0 {
		return append(b, 'Z')
	}
	zone := off / 60 // whole minutes, as time writes them
	if zone < 0 {
		b = append(b, '-')
		zone = -zone
	} else {
		b = append(b, '+')
	}
	zh, zm := zone/60, zone%60
	return append(b, byte('0'+zh/10), byte('0'+zh%10), ':', byte('0'+zm/10), byte('0'+zm%10))
}

// appendFloat appends f as encoding/json encodes a float64.
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, fmt.Errorf("json: unsupported value: %s", strconv.FormatFloat(f, 'g', -1, 64))
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 → e-9, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

// plainJSON[c]: encoding/json copies byte c into a string as it is.
var plainJSON = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendJSONString appends s quoted as encoding/json quotes it: printable
// ASCII other than the quote, the backslash and <, >, & (escaped for
// HTML) is copied; a string holding anything else goes through
// encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if !plainJSON[s[i]] {
			j, _ := json.Marshal(s) // a string always encodes
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
