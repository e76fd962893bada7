package bundle

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/meshfold/meshfold/internal/editdist"
)

// ErrNoScheme: the build has no scheme ("garbage", a bundle's name, a
// digest without its "sha256:"): neither a bundle build nor another
// runtime's "<scheme>:<id>". No runtime can run it.
var ErrNoScheme = fmt.Errorf("%w: no scheme", ErrBadBuild)

// ErrNearlyBundle: the build's scheme is a slip of "sha256" ("sh256",
// "sha265", "SHA256", "sha-256") or its id is a bundle's 64 hex digits
// under another scheme: a mistyped bundle build, not another runtime's.
// No runtime of this build runs it, and the apply of a want naming it
// would fail on every node, so the publishing verbs refuse it.
var ErrNearlyBundle = fmt.Errorf("%w: a mistyped bundle build", ErrBadBuild)

// CheckForm checks that build has a build's form, the one rule of it
// that `meshfold want` and `apply` apply before publishing (DESIGN.md
// §8): a bundle build, sha256: and 64 lowercase hex digits, or a build of
// another runtime, "<scheme>:<id>" with a scheme of a letter then
// letters, digits, "+", "-" or "." (as a URI's) and a non-empty id
// ("img:2.10", "src2:9f1c"), unless it is nearly a bundle build: a
// scheme one edit (a letter changed, added, dropped or two swapped) from
// "sha256" once lowercased and stripped of "-" and "_", or an id of 64
// hex digits (a bundle's digest) under a scheme other than sha256.
// Another runtime's build is not checked further: only its runtime knows
// what it names.
//
// Errors: [ErrNoScheme] (which matches [ErrBadBuild]) when build has no
// scheme; [ErrNearlyBundle] (which matches [ErrBadBuild]) when it is
// nearly a bundle build; [ErrBadBuild] for a malformed sha256 build;
// each wrapped with the build, clipped.
func CheckForm(build string) error {
	if strings.HasPrefix(build, BuildScheme) {
		_, err := ParseBuild(build)
		return err
	}
	scheme, id, ok := strings.Cut(build, ":")
	if !ok || !validScheme(scheme) || id == "" {
		return fmt.Errorf("%w: %q: a build is %s<64 hex> (what 'meshfold build push PATH' prints) or another runtime's <scheme>:<id> (img:2.10)",
			ErrNoScheme, clip(build), BuildScheme)
	}
	if nearlyBundle(scheme, id) {
		return fmt.Errorf("%w: %q: scheme %q is nearly %q: a bundle build is %s<64 lowercase hex> (what 'meshfold build push PATH' prints); another runtime's <scheme>:<id> (img:2.10) takes no scheme so close to it",
			ErrNearlyBundle, clip(build), clip(scheme), strings.TrimSuffix(BuildScheme, ":"), BuildScheme)
	}
	return nil
}

// nearlyBundle reports whether scheme:id, a build of another runtime's
// form, is nearly a bundle build (CheckForm's rule).
func nearlyBundle(scheme, id string) bool {
	if len(id) == 64 && strings.Trim(strings.ToLower(id), "0123456789abcdef") == "" {
		return true
	}
	s := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(scheme))
	want := strings.TrimSuffix(BuildScheme, ":")
	if s == want || editdist.Distance(s, want) <= 1 {
		return true
	}
	// Two neighbouring letters swapped ("sha265").
	for i := 0; i+1 < len(s) && len(s) == len(want); i++ {
		b := []byte(s)
		b[i], b[i+1] = b[i+1], b[i]
		if string(b) == want {
			return true
		}
	}
	return false
}

func validScheme(s string) bool {
	if s == "" || !isLetter(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isLetter(c) && !('0' <= c && c <= '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// Nearest returns at most n of known (as [Store.List] returns them,
// newest first) nearest to build, a build that is not among them: first
// those packed from what build names ("mesh-build-go" for the bundle
// pushed from ./mesh-build-go) or whose digest starts with build's (a
// build cut short, as [Short] prints it), then those whose digest is
// within a quarter of its digits of build's (a mistyped digit), nearest
// first; when none is near, the newest n. near says which: false means
// the list is only the newest, no guess.
func Nearest(build string, known []Info, n int) (out []Info, near bool) {
	if n <= 0 || len(known) == 0 {
		return nil, false
	}
	want := strings.ToLower(strings.TrimSpace(build))
	digits := strings.TrimPrefix(want, BuildScheme)
	if scheme, id, ok := strings.Cut(want, ":"); ok && scheme+":" != BuildScheme && nearlyBundle(scheme, id) {
		digits = id // a slip of the scheme ("sh256:…"): its digits are a bundle's
	}
	type scored struct {
		i    int
		rank int // 0: named or a prefix; 1: a close digest
		dist int
	}
	var cands []scored
	for i, k := range known {
		kd := strings.TrimPrefix(k.Build, BuildScheme)
		switch {
		case k.From != "" && strings.EqualFold(strings.TrimSuffix(k.From, "/"), strings.TrimSuffix(strings.TrimPrefix(want, "./"), "/")):
			cands = append(cands, scored{i, 0, 0})
		case len(digits) >= 6 && strings.HasPrefix(kd, digits):
			cands = append(cands, scored{i, 0, 0})
		default:
			if d := editdist.Distance(digits, kd); d <= len(kd)/4 {
				cands = append(cands, scored{i, 1, d})
			}
		}
	}
	if len(cands) == 0 {
		return known[:min(n, len(known))], false
	}
	slices.SortStableFunc(cands, func(a, b scored) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.dist, b.dist), cmp.Compare(a.i, b.i))
	})
	for _, s := range cands[:min(n, len(cands))] {
		out = append(out, known[s.i])
	}
	return out, true
}
