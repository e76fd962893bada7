package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/meshfold/meshfold/node/bundle"
)

// minBuildPrefix is the fewest hex digits a build prefix takes: the 12 of
// the short form every message prints (bundle.Short, "sha256:9f1c2b3a4d5e").
const minBuildPrefix = 12

// resolveBuildPrefix returns build whole when it is the short form of a
// stored bundle build: sha256: and 12 to 63 lowercase hex digits (a
// trailing "…", as a table prints it, is dropped) that begin exactly one
// build of the builds bucket, said in a note on stderr. Any other build
// is returned as it is, for the command's own checks. The verbs that take
// a build that names a stored bundle (approve, revoke, build rm) resolve
// it before they check or publish anything, so the event holds the whole
// build (a fresh user's finding L14: the short builds every message
// prints were refused as input).
//
// Errors (exit 2, nothing published): no stored build begins with the
// prefix, or several do (each named); the connection's and the bucket's
// errors.
func (a *app) resolveBuildPrefix(ctx context.Context, build string) (string, error) {
	s := strings.TrimSuffix(build, "…")
	hexd, ok := strings.CutPrefix(s, bundle.BuildScheme)
	if !ok || len(hexd) < minBuildPrefix || len(hexd) >= 64 || strings.Trim(hexd, "0123456789abcdef") != "" {
		return build, nil
	}
	nc, js, err := a.connectJS("meshfold-cli")
	if err != nil {
		return "", err
	}
	defer nc.Close()
	known, err := listBuilds(ctx, bundle.NewStore(js, a.stream.name))
	if err != nil {
		return "", fmt.Errorf("reading the stored builds to find the one %s begins: %w", s, err)
	}
	var found []string
	for _, k := range known {
		if strings.HasPrefix(k.Build, s) {
			found = append(found, k.Build)
		}
	}
	switch len(found) {
	case 1:
		fmt.Fprintf(a.stderr, "note: %s is %s, the one stored build it begins\n", s, found[0])
		return found[0], nil
	case 0:
		return "", withCode(exitUsage, fmt.Errorf("%s: no stored build begins with it ('meshfold build ls' lists them); a build is named whole, or by a prefix of %d hex digits or more of one stored build; nothing was published", s, minBuildPrefix))
	}
	return "", withCode(exitUsage, fmt.Errorf("%s begins %d stored builds: %s; give more digits; nothing was published", s, len(found), strings.Join(found, ", ")))
}
