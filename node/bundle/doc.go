// Package bundle is the format of a module's build (DESIGN.md §8): a
// tar.gz holding a manifest, meshfold.json, at its root, and whatever the
// manifest's command needs. A build "sha256:<64 hex>" names a bundle by the
// SHA-256 of its bytes; bundles live in the JetStream object store bucket
// MESH_BUILDS under their build.
//
// This file set starts with the manifest, the contract between
// `meshfold build push` (which validates it before anything is stored) and
// the process runtime (which runs it).
package bundle
