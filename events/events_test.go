package events_test

import (
	"errors"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/meshfold/meshfold/events"
)

const at = `"at":"2026-11-03T20:50:00Z"`

func TestDecodeValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  events.Kind
		json  string
		err   error  // nil: valid
		field string // the field the error names
	}{
		{"want ok", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/etc/pg","mode":"0600"}]}]}`, nil, ""},
		{"unknown field ignored", events.KindWant, `{"v":1,` + at + `,"modules":[],"extra":1}`, nil, ""},
		{"missing v", events.KindWant, `{` + at + `,"modules":[]}`, events.ErrVersion, "v"},
		{"missing at", events.KindWant, `{"v":1,"modules":[]}`, events.ErrMissing, "at"},
		{"newer v", events.KindWant, `{"v":2,` + at + `,"modules":[]}`, events.ErrNewerVersion, ""},
		{"newer v, other shape", events.KindWant, `{"v":3,` + at + `,"modules":"all"}`, events.ErrNewerVersion, ""},
		{"not json", events.KindHave, `{"v":1,`, events.ErrMalformed, ""},
		{"bad module name", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"Pg","build":"b"}]}`, events.ErrBadName, "modules[0].name"},
		{"name too long", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"` + strings.Repeat("a", 64) + `","build":"b"}]}`, events.ErrBadName, "modules[0].name"},
		{"name starts with dash", events.KindApprove, `{"v":1,` + at + `,"module":"-x","build":"b","by":"o"}`, events.ErrBadName, "module"},
		{"empty build", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":""}]}`, events.ErrMissing, "modules[0].build"},
		{"relative path", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"etc/pg","mode":"0600"}]}]}`, events.ErrBadPath, "modules[0].files[0].path"},
		{"dotdot path", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/etc/../pg","mode":"0600"}]}]}`, events.ErrBadPath, "modules[0].files[0].path"},
		{"trailing slash", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/etc/pg/","mode":"0600"}]}]}`, events.ErrBadPath, "modules[0].files[0].path"},
		{"NUL in path", events.KindRefusal, `{"v":1,` + at + `,"module":"pg","path":"/etc/p\u0000g","reason":"undeclared","plan":0,"writer":"w"}`, events.ErrControl, "path"},
		{"mode not octal", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/p","mode":"0800"}]}]}`, events.ErrBadMode, "modules[0].files[0].mode"},
		{"mode too long", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/p","mode":"00600"}]}]}`, events.ErrBadMode, "modules[0].files[0].mode"},
		{"two provisioners", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"a","build":"b","provisioner":true},{"name":"c","build":"b","provisioner":true}]}`, events.ErrProvisioners, "modules[1].provisioner"},
		{"duplicate module", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"a","build":"b"},{"name":"a","build":"c"}]}`, events.ErrDuplicate, "modules[1].name"},
		{"path declared twice", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"a","build":"b","files":[{"path":"/p","mode":"600"}]},{"name":"c","build":"b","files":[{"path":"/p","mode":"600"}]}]}`, events.ErrDuplicate, "modules[1].files[0].path"},
		{"approve without by", events.KindApprove, `{"v":1,` + at + `,"module":"a","build":"b"}`, events.ErrMissing, "by"},
		{"have running without build", events.KindHave, `{"v":1,` + at + `,"modules":[{"name":"a","build":"","state":"running"}]}`, events.ErrMissing, "modules[0].build"},
		{"have stopped without build", events.KindHave, `{"v":1,` + at + `,"modules":[{"name":"a","build":"","state":"stopped"}]}`, nil, ""},
		{"have bad state", events.KindHave, `{"v":1,` + at + `,"modules":[{"name":"a","build":"b","state":"dead"}]}`, events.ErrBadValue, "modules[0].state"},
		{"settle empty module", events.KindSettle, `{"v":1,` + at + `,"module":"","op":"apply","plan":3}`, nil, ""},
		{"settle without plan", events.KindSettle, `{"v":1,` + at + `,"module":"a","op":"apply","plan":0}`, events.ErrMissing, "plan"},
		{"settle bad op", events.KindSettle, `{"v":1,` + at + `,"module":"a","op":"done","plan":3}`, events.ErrBadValue, "op"},
		{"refusal plan 0", events.KindRefusal, `{"v":1,` + at + `,"module":"a","path":"/p","reason":"no-account","plan":0,"writer":"w"}`, nil, ""},
		{"refusal without writer", events.KindRefusal, `{"v":1,` + at + `,"module":"a","path":"/p","reason":"no-account","plan":0}`, events.ErrMissing, "writer"},
		{"refusal bad reason", events.KindRefusal, `{"v":1,` + at + `,"module":"a","path":"/p","reason":"nope","plan":0,"writer":"w"}`, events.ErrBadValue, "reason"},
		{"filled without digest", events.KindFilled, `{"v":1,` + at + `,"module":"a","path":"/p","plan":1}`, events.ErrMissing, "digest"},
		{"filled with a claim", events.KindFilled, `{"v":1,` + at + `,"module":"a","path":"/p","plan":1,"digest":"d","claim":"c1"}`, nil, ""},
		{"filled with a claim of two lines", events.KindFilled, `{"v":1,` + at + `,"module":"a","path":"/p","plan":1,"digest":"d","claim":"c\n1"}`, events.ErrControl, "claim"},
		{"have gone at start", events.KindHave, `{"v":1,` + at + `,"modules":[],"missing":[{"module":"a","path":"/p","at_start":true}],"started":"c1"}`, nil, ""},
		{"have gone at start without started", events.KindHave, `{"v":1,` + at + `,"modules":[],"missing":[{"module":"a","path":"/p","at_start":true}]}`, events.ErrMissing, "missing[0].started"},
		{"have missing twice, once at start", events.KindHave, `{"v":1,` + at + `,"modules":[],"missing":[{"module":"a","path":"/p"},{"module":"a","path":"/p","at_start":true}],"started":"c1"}`, events.ErrDuplicate, "missing[1].path"},
		{"journal bad level", events.KindJournal, `{"v":1,` + at + `,"level":"debug","msg":"m","cause":1}`, events.ErrBadValue, "level"},
		{"want without modules", events.KindWant, `{"v":1,` + at + `}`, events.ErrMissing, "modules"},
		{"want with null modules", events.KindWant, `{"v":1,` + at + `,"modules":null}`, events.ErrMissing, "modules"},
		{"want with no module", events.KindWant, `{"v":1,` + at + `,"modules":[]}`, nil, ""},
		{"at not UTC", events.KindWant, `{"v":1,"at":"2026-11-03T20:50:00+02:00","modules":[]}`, events.ErrNotUTC, "at"},
		{"at UTC as +00:00", events.KindWant, `{"v":1,"at":"2026-11-03T20:50:00+00:00","modules":[]}`, nil, ""},
		{"build with newline", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b\n2026 forged"}]}`, events.ErrControl, "modules[0].build"},
		{"build too long", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"` + strings.Repeat("b", events.MaxBuild+1) + `"}]}`, events.ErrTooLong, "modules[0].build"},
		{"build at the limit", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"` + strings.Repeat("b", events.MaxBuild) + `"}]}`, nil, ""},
		{"runs_as a shell command", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","runs_as":"root; rm -rf /"}]}`, events.ErrBadAccount, "modules[0].runs_as"},
		{"runs_as too long", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","runs_as":"` + strings.Repeat("u", events.MaxAccount+1) + `"}]}`, events.ErrTooLong, "modules[0].runs_as"},
		{"runs_as starting with a digit", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","runs_as":"1u"}]}`, events.ErrBadAccount, "modules[0].runs_as"},
		{"runs_as underscore and dash", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","runs_as":"_pg-2"}]}`, nil, ""},
		{"path too long", events.KindRefusal, `{"v":1,` + at + `,"module":"pg","path":"/` + strings.Repeat("p", events.MaxPath) + `","reason":"undeclared","plan":0,"writer":"w"}`, events.ErrTooLong, "path"},
		{"path with newline", events.KindFilled, `{"v":1,` + at + `,"module":"pg","path":"/a\nb","plan":1,"digest":"d"}`, events.ErrControl, "path"},
		{"path in the reserved dir", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/.meshfold/modules/x","mode":"0600"}]}]}`, events.ErrReserved, "modules[0].files[0].path"},
		{"the reserved dir itself", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/.meshfold","mode":"0600"}]}]}`, events.ErrReserved, "modules[0].files[0].path"},
		{"a sibling of the reserved dir", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[{"path":"/.meshfolder/x","mode":"0600"}]}]}`, nil, ""},
		{"too many files in a module", events.KindWant, `{"v":1,` + at + `,"modules":[{"name":"pg","build":"b","files":[` + files(0, events.MaxFilesPerModule+1) + `]}]}`, events.ErrTooMany, "modules[0].files"},
		{"too many modules", events.KindWant, `{"v":1,` + at + `,"modules":[` + modules(events.MaxModules+1, 0) + `]}`, events.ErrTooMany, "modules"},
		{"too many files in a want", events.KindWant, `{"v":1,` + at + `,"modules":[` + modules(events.MaxFilesPerWant/events.MaxFilesPerModule+1, events.MaxFilesPerModule) + `]}`, events.ErrTooMany, "modules[16].files"},
		{"approve by with newline", events.KindApprove, `{"v":1,` + at + `,"module":"a","build":"b","by":"o\nx"}`, events.ErrControl, "by"},
		{"settle error too long", events.KindSettle, `{"v":1,` + at + `,"module":"a","op":"failed","plan":3,"error":"` + strings.Repeat("e", events.MaxText+1) + `"}`, events.ErrTooLong, "error"},
		{"settle error with newlines", events.KindSettle, `{"v":1,` + at + `,"module":"a","op":"failed","plan":3,"error":"line 1\nline 2"}`, nil, ""},
		// Free text a node reports is folded with its control characters,
		// and escaped where shown (DESIGN.md §10).
		{"settle error with control characters", events.KindSettle, `{"v":1,` + at + `,"module":"a","op":"failed","plan":3,"error":"a\u001b[31m\u0000\tb"}`, nil, ""},
		{"refusal error with newline and control", events.KindRefusal, `{"v":1,` + at + `,"module":"a","path":"/p","reason":"write-failed","plan":3,"writer":"w","error":"disk\nfull\u001b[0m\u007f"}`, nil, ""},
		{"refusal error too long", events.KindRefusal, `{"v":1,` + at + `,"module":"a","path":"/p","reason":"write-failed","plan":3,"writer":"w","error":"` + strings.Repeat("e", events.MaxText+1) + `"}`, events.ErrTooLong, "error"},
		{"have account not a user", events.KindHave, `{"v":1,` + at + `,"modules":[{"name":"a","build":"b","state":"running","account":"A B"}]}`, events.ErrBadAccount, "modules[0].account"},
		{"payload too big", events.KindWant, `{"v":1,` + at + `,"modules":[],"pad":"` + strings.Repeat(" ", events.MaxEventBytes) + `"}`, events.ErrTooLong, "payload"},
		{"unknown kind", events.Kind("fill"), `{}`, events.ErrUnknownKind, ""},
		{"knock operator", events.KindKnock, `{"v":1,` + at + `,"cause":3,"reasons":["operator"],"owed":[]}`, nil, ""},
		// Operator events (DESIGN.md §9): by is required in every one.
		{"pause ok", events.KindPause, `{"v":1,` + at + `,"by":"alice","reason":"disk swap"}`, nil, ""},
		{"pause without reason", events.KindPause, `{"v":1,` + at + `,"by":"alice"}`, nil, ""},
		{"pause without by", events.KindPause, `{"v":1,` + at + `,"reason":"x"}`, events.ErrMissing, "by"},
		{"pause reason with newline", events.KindPause, `{"v":1,` + at + `,"by":"alice","reason":"a\nb"}`, events.ErrControl, "reason"},
		{"pause by with escape", events.KindPause, `{"v":1,` + at + `,"by":"al\u001bice"}`, events.ErrControl, "by"},
		{"pause without at", events.KindPause, `{"v":1,"by":"alice"}`, events.ErrMissing, "at"},
		{"resume ok", events.KindResume, `{"v":1,` + at + `,"by":"alice"}`, nil, ""},
		{"resume without by", events.KindResume, `{"v":1,` + at + `}`, events.ErrMissing, "by"},
		{"poke ok", events.KindPoke, `{"v":1,` + at + `,"by":"alice","reason":"new secret source"}`, nil, ""},
		{"poke without by", events.KindPoke, `{"v":1,` + at + `}`, events.ErrMissing, "by"},
		{"poke reason with tab", events.KindPoke, `{"v":1,` + at + `,"by":"a","reason":"a\tb"}`, events.ErrControl, "reason"},
		{"revoke ok", events.KindRevoke, `{"v":1,` + at + `,"module":"nats","build":"img:2","by":"alice"}`, nil, ""},
		{"revoke without by", events.KindRevoke, `{"v":1,` + at + `,"module":"nats","build":"img:2"}`, events.ErrMissing, "by"},
		{"revoke bad module", events.KindRevoke, `{"v":1,` + at + `,"module":"Nats","build":"img:2","by":"a"}`, events.ErrBadName, "module"},
		{"revoke without build", events.KindRevoke, `{"v":1,` + at + `,"module":"nats","by":"a"}`, events.ErrMissing, "build"},
		{"ack ok", events.KindAck, `{"v":1,` + at + `,"by":"alice","upto":12}`, nil, ""},
		{"ack without upto", events.KindAck, `{"v":1,` + at + `,"by":"alice"}`, nil, ""},
		{"ack without by", events.KindAck, `{"v":1,` + at + `,"upto":12}`, events.ErrMissing, "by"},
		{"waive ok", events.KindWaive, `{"v":1,` + at + `,"module":"app","path":"/etc/app/key","by":"alice"}`, nil, ""},
		{"waive without by", events.KindWaive, `{"v":1,` + at + `,"module":"app","path":"/etc/app/key"}`, events.ErrMissing, "by"},
		{"waive relative path", events.KindWaive, `{"v":1,` + at + `,"module":"app","path":"etc/key","by":"a"}`, events.ErrBadPath, "path"},
		{"waive without module", events.KindWaive, `{"v":1,` + at + `,"path":"/k","by":"a"}`, events.ErrMissing, "module"},
		{"retire ok", events.KindRetire, `{"v":1,` + at + `,"by":"alice"}`, nil, ""},
		{"retire force", events.KindRetire, `{"v":1,` + at + `,"by":"alice","force":true}`, nil, ""},
		{"retire reason with newline", events.KindRetire, `{"v":1,` + at + `,"by":"a","reason":"x\ny"}`, events.ErrControl, "reason"},
		{"resume reason", events.KindResume, `{"v":1,` + at + `,"by":"a","reason":"disk swapped"}`, nil, ""},
		{"retire without by", events.KindRetire, `{"v":1,` + at + `,"force":true}`, events.ErrMissing, "by"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := events.Decode(tc.kind, []byte(tc.json))
			if tc.err == nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if p.Kind() != tc.kind {
					t.Fatalf("kind %s, want %s", p.Kind(), tc.kind)
				}
				return
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("Decode: %v, want %v", err, tc.err)
			}
			if tc.field != "" {
				var fe *events.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, events.ErrInvalid) {
					t.Fatalf("error %v: want a field error on %s matching ErrInvalid", err, tc.field)
				}
			}
		})
	}
}

func TestDecodeStrictRefusesUnknownFields(t *testing.T) {
	data := []byte(`{"v":1,` + at + `,"modules":[{"name":"a","build":"b","runs_ass":"x"}]}`)
	if _, err := events.Decode(events.KindWant, data); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	_, err := events.DecodeStrict(events.KindWant, data)
	if !errors.Is(err, events.ErrMalformed) || !strings.Contains(err.Error(), "runs_ass") {
		t.Fatalf("DecodeStrict: %v, want the unknown field named", err)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "nats", Build: "n:1", RunsAs: "nats",
		Files: []events.File{{Path: "/etc/nats/creds", Mode: "0600"}}, RequiresApproval: true}}}, time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", 3600)))
	b, err := events.Encode(w)
	if err != nil {
		t.Fatal(err)
	}
	// snake_case names exactly as DESIGN.md §3; at in UTC.
	for _, want := range []string{`"v":1`, `"at":"2026-01-02T02:04:05.000006Z"`, `"runs_as":"nats"`, `"requires_approval":true`, `"mode":"0600"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	p, err := events.Decode(events.KindWant, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.(*events.Want); got.Modules[0].Files[0] != w.Modules[0].Files[0] || !got.At.Equal(w.At) {
		t.Fatalf("round trip: %+v", got)
	}
}

func TestSubjects(t *testing.T) {
	s := events.Subjects{}
	if got := s.Event("ace", events.KindWant); got != "mesh.ace.want" {
		t.Errorf("Event = %s", got)
	}
	if got := s.Fill("ace"); got != "mesh.ace.fill" {
		t.Errorf("Fill = %s", got)
	}
	for _, sub := range s.Input() {
		if strings.HasSuffix(sub, ".fill") {
			t.Errorf("the stream must never capture fill requests: %s", sub)
		}
	}
	if len(s.Input()) != len(events.Kinds) {
		t.Errorf("Input = %v", s.Input())
	}
	src, dst := s.Transform()
	if src != "mesh.*.*" || dst != "{{partition(16,1)}}.mesh.{{wildcard(1)}}.{{wildcard(2)}}" {
		t.Errorf("Transform = %s → %s", src, dst)
	}
	// The partition is FNV-1a 32 of the node name mod N, as the server's
	// transform computes it.
	h := fnv.New32a()
	h.Write([]byte("shanks"))
	if got, want := events.Partition("shanks", 16), int(h.Sum32()%16); got != want {
		t.Errorf("Partition = %d, want %d", got, want)
	}
	p := events.Partition("ace", 16)
	stored := s.Stored("ace", events.KindKnock)
	for _, subject := range []string{"mesh.ace.knock", stored} {
		node, kind, err := s.Parse(subject)
		if err != nil || node != "ace" || kind != events.KindKnock {
			t.Errorf("Parse(%s) = %s %s %v", subject, node, kind, err)
		}
	}
	if want := strconv.Itoa(p) + ".mesh.ace.knock"; stored != want {
		t.Errorf("Stored = %s, partition %d", stored, p)
	}
	for _, bad := range []string{"mesh.ACE.want", "x.mesh.ace.want", "other.ace.want", "mesh.ace", "mesh.ace.want.x"} {
		if _, _, err := s.Parse(bad); !errors.Is(err, events.ErrBadSubject) {
			t.Errorf("Parse(%s): %v, want ErrBadSubject", bad, err)
		}
	}
	if _, _, err := s.Parse("mesh.ace.fill"); !errors.Is(err, events.ErrUnknownKind) {
		t.Errorf("Parse(fill): %v, want ErrUnknownKind", err)
	}
	if got := (events.Subjects{Prefix: "prod"}).Event("ace", events.KindHave); got != "prod.ace.have" {
		t.Errorf("prefixed Event = %s", got)
	}
}

func TestDecodeEventKeepsBadPayloads(t *testing.T) {
	ev, err := events.Subjects{}.DecodeEvent("3.mesh.ace.have", []byte(`nope`), 7, time.Unix(5, 0))
	if err != nil {
		t.Fatalf("DecodeEvent: %v", err)
	}
	if ev.Payload != nil || !errors.Is(ev.Err, events.ErrMalformed) || ev.Node != "ace" || ev.Seq != 7 || !ev.At().Equal(time.Unix(5, 0)) {
		t.Fatalf("event %+v", ev)
	}
	if _, err := (events.Subjects{}).DecodeEvent("mesh.A.have", nil, 1, time.Time{}); !errors.Is(err, events.ErrBadSubject) {
		t.Fatalf("bad subject: %v", err)
	}
}

// TestKindLists keeps the kind lists, New and the subjects in step: every
// kind decodes, parses from its subject, and is captured by the stream;
// every operator kind is an input of the fold.
func TestKindLists(t *testing.T) {
	s := events.Subjects{}
	inputs := map[events.Kind]bool{}
	for _, k := range events.InputKinds {
		inputs[k] = true
	}
	for _, k := range events.Kinds {
		if !k.Known() {
			t.Errorf("%s: not Known", k)
		}
		p := events.New(k)
		if p == nil || p.Kind() != k {
			t.Errorf("New(%s) = %v", k, p)
		}
		if _, kind, err := s.Parse(s.Event("ace", k)); err != nil || kind != k {
			t.Errorf("Parse(%s) = %s, %v", s.Event("ace", k), kind, err)
		}
		if !slices.Contains(s.Input(), "mesh.*."+string(k)) {
			t.Errorf("the stream does not capture %s", k)
		}
	}
	for _, k := range events.OperatorKinds {
		if !inputs[k] {
			t.Errorf("operator kind %s is not an input of the fold", k)
		}
	}
	for _, k := range []events.Kind{events.KindPause, events.KindResume, events.KindPoke, events.KindRevoke, events.KindWaive, events.KindRetire, events.KindAck} {
		if !slices.Contains(events.OperatorKinds, k) {
			t.Errorf("%s missing from OperatorKinds", k)
		}
	}
}

func TestOperatorEventsRoundTrip(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range []events.Payload{
		&events.Pause{By: "alice", Reason: "disk swap"},
		&events.Resume{By: "alice"},
		&events.Poke{By: "bob"},
		&events.Revoke{Module: "nats", Build: "img:2", By: "carol"},
		&events.Waive{Module: "app", Path: "/etc/app/key", By: "dave"},
		&events.Retire{By: "erin", Force: true},
		&events.Ack{By: "frank", Upto: 41, Reason: "read them"},
		&events.Ack{By: "frank"},
	} {
		events.Stamp(p, now)
		b, err := events.Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := events.Decode(p.Kind(), b)
		if err != nil {
			t.Fatalf("%s: %v", p.Kind(), err)
		}
		b2, _ := events.Encode(got)
		if string(b) != string(b2) {
			t.Errorf("%s: %s round-trips as %s", p.Kind(), b, b2)
		}
		if !strings.Contains(string(b), `"by":`) {
			t.Errorf("%s: %s lacks by", p.Kind(), b)
		}
	}
}

func TestModePerm(t *testing.T) {
	for mode, want := range map[events.Mode]uint32{"0600": 0o600, "644": 0o644, "4755": 0o4755} {
		if got := mode.Perm(); got != want {
			t.Errorf("%s.Perm() = %o, want %o", mode, got, want)
		}
	}
}

// files returns n file declarations, paths /f<from>.. /f<from+n-1>.
func files(from, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"path":"/f` + strconv.Itoa(from+i) + `","mode":"0600"}`)
	}
	return b.String()
}

// modules returns n module declarations with nfiles files each.
func modules(n, nfiles int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"name":"m` + strconv.Itoa(i) + `","build":"b","files":[` + files(i*nfiles, nfiles) + `]}`)
	}
	return b.String()
}

func TestFleetSubject(t *testing.T) {
	var s events.Subjects
	if node, kind, err := s.Parse("3.mesh._fleet.journal"); err != nil || node != events.FleetNode || kind != events.KindJournal {
		t.Fatalf("Parse of the fleet journal: %s %s %v", node, kind, err)
	}
	if _, _, err := s.Parse("mesh._fleet.want"); !errors.Is(err, events.ErrBadSubject) {
		t.Fatalf("Parse of a want on the fleet token: %v", err)
	}
}

func TestLimitErrorNamesTheLimit(t *testing.T) {
	_, err := events.Decode(events.KindWant, []byte(`{"v":1,`+at+`,"modules":[`+modules(events.MaxModules+1, 0)+`]}`))
	var le *events.LimitError
	if !errors.As(err, &le) || le.Got != events.MaxModules+1 || le.Limit != events.MaxModules {
		t.Fatalf("err %v: want a LimitError with got %d, limit %d", err, events.MaxModules+1, events.MaxModules)
	}
	if msg := err.Error(); !strings.Contains(msg, "events.MaxModules") || !strings.Contains(msg, strconv.Itoa(events.MaxModules)) {
		t.Fatalf("error %q does not name the limit", msg)
	}
}

func TestShort(t *testing.T) {
	long := "/" + strings.Repeat("a", 270000)
	got := events.Short(long)
	if len(got) > 100 || !strings.Contains(got, "(270001 bytes)") {
		t.Fatalf("Short of a long value: %q", got)
	}
	if got := events.Short("a\nb\x1b[31m"); strings.ContainsAny(got, "\n\x1b") {
		t.Fatalf("Short let a control character through: %q", got)
	}
	if got := events.Short("pg"); got != `"pg"` {
		t.Fatalf("Short(pg) = %s", got)
	}
	// A cut never splits a rune.
	if got := events.Short(strings.Repeat("é", 100)); !strings.Contains(got, "(200 bytes)") || strings.Contains(got, "\\x") {
		t.Fatalf("Short of runes: %s", got)
	}
	if got := events.Cut(strings.Repeat("e", 5000), events.MaxText); len(got) > events.MaxText || !strings.HasSuffix(got, "(5000 bytes)") {
		t.Fatalf("Cut: %d bytes, %q", len(got), got[len(got)-20:])
	}
	if got := events.Text("exit status 1"); got != "exit status 1" {
		t.Fatalf("Text of a plain message: %q", got)
	}
	if got := events.Text("line 1\nline 2"); got != `"line 1\nline 2"` {
		t.Fatalf("Text of two lines: %s", got)
	}
	if got := events.Cut("short", events.MaxText); got != "short" {
		t.Fatalf("Cut of a short value: %q", got)
	}
	// A field error quotes its value through Short.
	_, err := events.Decode(events.KindRefusal, []byte(`{"v":1,`+at+`,"module":"pg","path":"`+long+`","reason":"undeclared","plan":0,"writer":"w"}`))
	if err == nil || len(err.Error()) > 200 {
		t.Fatalf("error of a long path is %d bytes", len(err.Error()))
	}
}

// An error's text keeps a longer budget than a value and, when cut, its
// head and its tail, where the cause is; control characters are quoted
// either way, and a cut never splits a rune.
func TestErrorText(t *testing.T) {
	demo := "apply mesh-build-go: bundle sha256:2267110a3fb464bd2077a311377b0c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b: no such bundle in bucket MESH_BUILDS: push it with meshfold build push"
	if got := events.ErrorText(demo); got != demo {
		t.Errorf("ErrorText of a %d-byte error cut it: %q", len(demo), got)
	}
	long := "apply x: " + strings.Repeat("é", 500) + ": no such bundle: push it with meshfold build push"
	got := events.ErrorText(long)
	if !strings.HasPrefix(got, `"apply x: `) || !strings.Contains(got, `push it with meshfold build push" (`+strconv.Itoa(len(long))+" bytes)") ||
		len(got) > 240 || strings.Contains(got, `\x`) {
		t.Errorf("ErrorText of a long error: %q", got)
	}
	if got := events.ErrorText("a\nb\x1b[31m"); got != `"a\nb\x1b[31m"` {
		t.Errorf("ErrorText let a control character through: %q", got)
	}
	if got := events.ErrorText(strings.Repeat("\n", 300)); strings.Contains(got, "\n") {
		t.Errorf("ErrorText of a long error let a newline through")
	}
	if got := events.Plain(strings.Repeat("x", 5000)); len(got) != 5000 {
		t.Errorf("Plain cut a long text to %d bytes", len(got))
	}
	if got := events.Plain("a\tb"); got != `"a\tb"` {
		t.Errorf("Plain(a tab) = %s", got)
	}
	// A user's own file (strict decoding) is told in full: a JSON error
	// naming a long field is not cut.
	field := strings.Repeat("f", 300)
	_, err := events.DecodeStrict(events.KindWant, []byte(`{"v":1,`+at+`,"modules":[],"`+field+`":1}`))
	if err == nil || !strings.Contains(err.Error(), field) {
		t.Errorf("DecodeStrict of a file with an unknown long field: %v", err)
	}
}

// CutMiddle keeps an error's end, where its cause is, within its budget,
// and never splits a rune.
func TestCutMiddle(t *testing.T) {
	if got := events.CutMiddle("short: cause", 96); got != "short: cause" {
		t.Errorf("CutMiddle of a short text = %q", got)
	}
	long := "/run/app/key: write: write /var/lib/" + strings.Repeat("é", 60) + "/.key.meshfold-1: no space left on device"
	got := events.CutMiddle(long, 96)
	if len(got) > 96 || !strings.HasPrefix(got, "/run/app/key") || !strings.HasSuffix(got, ": no space left on device ("+strconv.Itoa(len(long))+" bytes)") ||
		!strings.Contains(got, "…") || !utf8.ValidString(got) {
		t.Errorf("CutMiddle(%d bytes, 96) = %q (%d bytes)", len(long), got, len(got))
	}
}
