// Package e2e holds meshfold's end-to-end tests: the incidents of
// DESIGN.md §2 played over a real embedded NATS server with the
// reconciler loop, node agents and provisioner clients running in
// process, and the upgrade tests: a golden stream and snapshot bucket
// (testdata/golden) that every later build must fold, replay and read
// on the wire as the build that wrote it did (upgrade_test.go,
// wire_test.go). It has no code of its own; see its _test.go files.
package e2e
