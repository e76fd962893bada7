// Package bundle is the format of a module's build (DESIGN.md §8): a
// tar.gz holding a manifest, meshfold.json, at its root, and whatever the
// manifest's command needs. A build "sha256:<64 hex>" names a bundle by the
// SHA-256 of its bytes; bundles live in the JetStream object store bucket
// MESH_BUILDS under their build.
//
// The pieces, in the order a bundle meets them:
//
//   - [Manifest]: meshfold.json, the contract between `meshfold build
//     push` (which validates it before anything is stored) and the process
//     runtime (which runs it).
//   - [Pack]: an executable (with a generated manifest) or a directory
//     with a manifest, as a deterministic tar.gz: the same content gives
//     the same build, "sha256:<hex>" of the tar.gz bytes ([ParseBuild],
//     [BuildOf]).
//   - [Store]: the bucket (Push, List, Remove, Open) over jetstream's
//     ObjectStore. `build push` creates the bucket on first use; nodes
//     never create it, and fail their apply with [ErrNoBucket] while it is
//     missing.
//   - [Cache]: a node's bundles, fetched once, checked against their
//     build before unpacking ([ErrMismatch]), unpacked safely ([Unpack]:
//     no path or link out of the bundle, no device), kept by build and
//     deleted when no module uses them ([Cache.GC], [Cache.Prune]). It is
//     the process runtime's Fetcher (node/process).
//
// A build of another scheme ("img:…", "src2:…") is [ErrNotBundle]: the
// process runtime fails the apply with it, as a settle with op failed. A
// build of neither form ("garbage") is [ErrNoScheme] ([CheckForm]: the one
// rule of a build's form, which `want` and `apply` apply before
// publishing), and [Nearest] picks the stored builds an error names
// beside one that is not stored.
package bundle
