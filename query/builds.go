package query

import (
	"context"
	"errors"
	"strings"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
)

// MissingBuilds returns, in the want's order, each module of w whose
// build is a bundle build ("sha256:…") the builds bucket
// (<stream>_BUILDS) does not hold, with why: a node would fail to apply
// it (DESIGN.md §8). Other builds (another runtime's images) are not
// checked. It reads bundles' metadata only.
//
// Errors: a build that is no valid bundle build is reported as missing
// with bundle's error; the server's other errors are returned.
func (r *Reader) MissingBuilds(ctx context.Context, w *events.Want) ([]MissingBuild, error) {
	st := bundle.NewStore(r.js, r.c.Stream.Name)
	var out []MissingBuild
	seen := map[string]bool{}
	for _, m := range w.Modules {
		if !strings.HasPrefix(m.Build, bundle.BuildScheme) || seen[m.Build] {
			continue
		}
		seen[m.Build] = true
		_, err := st.Stat(ctx, m.Build)
		switch {
		case err == nil:
		case errors.Is(err, bundle.ErrNotFound), errors.Is(err, bundle.ErrNoBucket), errors.Is(err, bundle.ErrBadBuild):
			out = append(out, MissingBuild{Module: m.Name, Build: m.Build, Err: err})
		default:
			return nil, err
		}
	}
	return out, nil
}

// MissingBuild is a module whose build the builds bucket does not hold,
// and why (bundle.ErrNotFound, bundle.ErrNoBucket or bundle.ErrBadBuild).
type MissingBuild struct {
	Module string
	Build  string
	Err    error
}
