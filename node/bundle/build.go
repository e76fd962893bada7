package bundle

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
)

// BuildScheme is the scheme of a bundle's build: "sha256:<64 lowercase hex>",
// the SHA-256 of the bundle's tar.gz bytes (DESIGN.md §8).
const BuildScheme = "sha256:"

// Errors of build names.
var (
	// ErrNotBundle: the build has another scheme ("img:…", "src2:…"), one
	// the process runtime cannot run.
	ErrNotBundle = errors.New("bundle: not a bundle build")
	// ErrBadBuild: the build says sha256: but is not 64 lowercase hex digits.
	ErrBadBuild = errors.New("bundle: malformed build")
)

// ParseBuild checks that build names a bundle and returns its digest in
// hex (64 lowercase digits).
//
// Errors: ErrNotBundle for another scheme, ErrBadBuild for a malformed
// sha256 build, each wrapped with the build.
func ParseBuild(build string) (string, error) {
	hexd, ok := strings.CutPrefix(build, BuildScheme)
	if !ok {
		return "", fmt.Errorf("%w: %q is not %s<64 hex> (a bundle pushed with meshfold build push); this runtime runs only bundles",
			ErrNotBundle, clip(build), BuildScheme)
	}
	if len(hexd) != sha256.Size*2 {
		return "", fmt.Errorf("%w: %q: want %d hex digits after %s", ErrBadBuild, clip(build), sha256.Size*2, BuildScheme)
	}
	for _, c := range hexd {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", fmt.Errorf("%w: %q: want lowercase hex digits after %s", ErrBadBuild, clip(build), BuildScheme)
		}
	}
	return hexd, nil
}

// BuildOf returns the build of a bundle's bytes.
func BuildOf(data []byte) string {
	sum := sha256.Sum256(data)
	return BuildScheme + hex.EncodeToString(sum[:])
}

// buildOfHash returns the build of what h has hashed.
func buildOfHash(h hash.Hash) string { return BuildScheme + hex.EncodeToString(h.Sum(nil)) }

// Short returns a build cut to its scheme and first 12 digits, for tables
// and log lines ("sha256:9f1c2b3a4d5e").
func Short(build string) string {
	if len(build) > len(BuildScheme)+12 && strings.HasPrefix(build, BuildScheme) {
		return build[:len(BuildScheme)+12]
	}
	return clip(build)
}

// clip shortens a value quoted in an error (DESIGN.md §10: no value is
// quoted at full length when long).
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max-3] + "..."
}
