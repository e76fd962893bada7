package process

import (
	"context"

	"github.com/meshfold/meshfold/node/bundle"
)

// Fetcher gives the runtime a build's unpacked bundle (see the package
// documentation for the contract an implementation keeps).
type Fetcher interface {
	// Fetch returns the directory holding build's unpacked bundle and its
	// validated manifest. Errors name what failed (unknown scheme,
	// missing bundle, digest mismatch) and fail the apply.
	Fetch(ctx context.Context, build string) (dir string, m bundle.Manifest, err error)
}

// Pruner is optionally implemented by a [Fetcher]: after every Apply and
// Remove the runtime calls Prune with the sorted builds its modules still
// use (running, failed or stopped), and the fetcher may delete every other
// bundle it keeps. An error is logged and otherwise ignored.
type Pruner interface {
	Prune(ctx context.Context, keep []string) error
}
