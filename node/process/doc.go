// Package process is the node agent's process runtime (DESIGN.md §8): a
// [node.Runtime] that runs each module's bundle as a real process, as the
// module's Unix account, supervised by a per-module shim that outlives the
// agent.
//
// # Where builds come from: the Fetcher
//
// The runtime does not know the object store. It asks a [Fetcher] for a
// build's unpacked bundle:
//
//	type Fetcher interface {
//		Fetch(ctx context.Context, build string) (dir string, m bundle.Manifest, err error)
//	}
//
// Fetch returns the directory holding the unpacked bundle of build
// (meshfold.json at its root) and its parsed, validated manifest. It is
// called on every Apply, so it must be cheap for a build already cached.
// The directory must stay in place, unchanged, while a module runs that
// build, and every file the command needs must be readable (and the
// command executable) by the module's account: the runtime runs the
// command as that account with its working directory set to dir, and
// changes no ownership or mode. Any error fails the apply, and its text
// becomes the settle's error, so it must say what went wrong (a build of
// another scheme, a missing bundle, a digest mismatch) and never contain a
// secret. The implementation is package node/bundle's cache; tests use a
// fake that returns a directory they made.
//
// A Fetcher may also implement [Pruner]: after every Apply and Remove the
// runtime calls Prune with every build its modules still use, and the
// fetcher may delete the bundles of the others.
package process
