// Package examples holds example module bundles, as directories a user
// pushes (`meshfold build push examples/mesh-build-go`) and as files the
// demo and the end-to-end tests write out ([WriteMeshBuildGo]).
//
// mesh-build-go is incident 1's module (DESIGN.md §2): a shell script that
// exits 1, saying "missing broker credential", while its filled file
// /run/mesh-build-go/broker.creds is missing under the node's root, and
// runs once it is there.
//
// idle is a module that runs and does nothing: a stand-in for a module
// whose real work happens elsewhere, such as the provisioner client that
// the README's walkthrough runs in its own terminal.
package examples
