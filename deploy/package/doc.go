// Command package builds meshfold's .deb and .rpm packages from a built
// binary: the binary, the systemd units of serve, node@, provision@,
// reconcile@ (an instance of a reconciler group) and console, the default
// settings under /etc/meshfold and the postinstall that creates the
// meshfold user (docs/operations.md, "Install from a package").
//
// It is its own Go module, so that nfpm (the packager library it drives)
// never enters the meshfold binary's dependencies. `make package` runs it:
//
//	go run . -binary ../../dist/meshfold -version v0.3.0 -out ../../dist
package main
