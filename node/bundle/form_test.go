package bundle

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCheckForm(t *testing.T) {
	good := BuildScheme + strings.Repeat("ab", 32)
	for _, b := range []string{good, "img:2.10", "src2:9f1c", "web:1", "a:1", "oci+tar:x", "img:sha256:" + strings.Repeat("0", 64),
		"sha512:abc", "sha1:abc", "sha:abc", "shasum:1"} {
		if err := CheckForm(b); err != nil {
			t.Errorf("CheckForm(%q) = %v, want nil", b, err)
		}
	}
	for b, want := range map[string]error{
		"garbage":                ErrNoScheme,
		"mesh-build-go":          ErrNoScheme,
		strings.Repeat("ab", 32): ErrNoScheme, // a digest without its scheme
		":1":                     ErrNoScheme,
		"web:":                   ErrNoScheme,
		"1web:2":                 ErrNoScheme,
		"we b:2":                 ErrNoScheme,
		BuildScheme + "9f1c":     ErrBadBuild, // cut short, as Short prints it
		// A slip of the bundle scheme is no other runtime's build (a
		// fresh user's finding 1: "sh256:abc" was published, and every
		// node's apply failed).
		"sh256:abc":                       ErrNearlyBundle,
		"sha265:abc":                      ErrNearlyBundle,
		"sha2566:abc":                     ErrNearlyBundle,
		"sha-256:abc":                     ErrNearlyBundle,
		strings.ToUpper(good):             ErrNearlyBundle,
		"sha:" + strings.Repeat("ab", 32): ErrNearlyBundle, // a digest under another scheme
	} {
		err := CheckForm(b)
		if !errors.Is(err, want) || !errors.Is(err, ErrBadBuild) {
			t.Errorf("CheckForm(%q) = %v, want %v (an ErrBadBuild)", b, err, want)
		}
	}
	if err := CheckForm("sh256:abc"); err == nil || !strings.Contains(err.Error(), `nearly "sha256"`) || !strings.Contains(err.Error(), "meshfold build push PATH") {
		t.Errorf("CheckForm(sh256:abc) = %v: want the nearest valid form and how to make one", err)
	}
	if err := CheckForm("garbage"); err == nil || !strings.Contains(err.Error(), `"garbage"`) || !strings.Contains(err.Error(), "meshfold build push PATH") {
		t.Errorf("CheckForm(garbage) = %v: want the build quoted and how to make one", err)
	}
}

func TestNearest(t *testing.T) {
	at := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	b := func(c byte) string { return BuildScheme + strings.Repeat(string(c), 64) }
	known := []Info{ // newest first, as List returns them
		{Build: b('c'), From: "web", Pushed: at.Add(3 * time.Minute)},
		{Build: b('b'), From: "mesh-build-go", Pushed: at.Add(2 * time.Minute)},
		{Build: b('a'), From: "idle", Pushed: at.Add(time.Minute)},
	}
	builds := func(in []Info) (out []string) {
		for _, i := range in {
			out = append(out, i.Build)
		}
		return out
	}
	oneOff := b('a')[:len(b('a'))-1] + "0"
	for _, c := range []struct {
		build string
		want  []string
		near  bool
	}{
		{"mesh-build-go", []string{b('b')}, true},          // its name
		{BuildScheme + "aaaaaaaa", []string{b('a')}, true}, // cut short
		{oneOff, []string{b('a')}, true},                   // a digit off
		{strings.Repeat("a", 64), []string{b('a')}, true},  // no scheme
		{"garbage", []string{b('c'), b('b')}, false},       // nothing near: the newest
	} {
		got, near := Nearest(c.build, known, 2)
		if strings.Join(builds(got), ",") != strings.Join(c.want, ",") || near != c.near {
			t.Errorf("Nearest(%q) = %v %v, want %v %v", c.build, builds(got), near, c.want, c.near)
		}
	}
	if got, _ := Nearest("x", nil, 3); got != nil {
		t.Errorf("Nearest of none = %v", got)
	}
}
