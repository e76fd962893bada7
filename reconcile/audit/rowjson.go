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
	for _, f := range []struct {
		key string
		v   any
		set bool
	}{
		{`,"failed":`, r.Failed, len(r.Failed) > 0},
		{`,"failed_applies":`, r.FailedApplies, len(r.FailedApplies) > 0},
		{`,"unhealthy":`, r.Unhealthy, len(r.Unhealthy) > 0},
		{`,"flapping":`, r.Flapping, len(r.Flapping) > 0},
	} {
		if f.set {
			if b, err = appendMarshal(b, f.key, f.v); err != nil {
				return nil, err
			}
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

// appendStuck appends k as the "stuck" field. What most nodes have (files
// never filled, owed items waiting) is written directly; a pause or a
// retirement by encoding/json.
func appendStuck(b []byte, k *reconcile.Stuck) ([]byte, error) {
	if k.Paused != nil || k.PausedFor != 0 || k.Retiring || k.Retired || k.Withheld || k.Retire != nil {
		return appendMarshal(b, `,"stuck":`, *k)
	}
	var err error
	b = append(b, `,"stuck":{`...)
	sep := ""
	if len(k.Unfilled) > 0 {
		b = append(b, `"unfilled":[`...)
		for i, f := range k.Unfilled {
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
		sep = ","
	}
	if len(k.Owed) > 0 {
		b = append(b, sep...)
		b = append(b, `"owed":[`...)
		for i, o := range k.Owed {
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
	return append(b, '}'), nil
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
// MarshalJSON: RFC 3339 with nanoseconds, quoted).
func appendTime(b []byte, key string, t time.Time) ([]byte, error) {
	b = append(b, key...)
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return nil, fmt.Errorf("json: error calling MarshalJSON for type time.Time: %w", err)
	}
	return append(b, '"'), nil
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

// appendJSONString appends s quoted as encoding/json quotes it: printable
// ASCII other than the quote, the backslash and <, >, & (escaped for
// HTML) is copied; a string holding anything else goes through
// encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, _ := json.Marshal(s) // a string always encodes
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
