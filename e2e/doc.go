// Package e2e holds meshfold's end-to-end tests: the incidents of
// DESIGN.md §2 played over a real embedded NATS server with the
// reconciler loop, node agents and provisioner clients running in
// process. It has no code of its own; see its _test.go files.
package e2e
