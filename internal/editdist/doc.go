// Package editdist measures how far two names are apart, for the "did you
// mean X?" of a mistyped name: a build's form (node/bundle) and a module
// or path the node's want does not declare (cmd/meshfold).
package editdist
