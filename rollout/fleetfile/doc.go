// Package fleetfile reads a fleet file (DESIGN.md §11): the nodes a fleet
// owns with their labels, groups of modules selected by label, and the
// rollout block; and computes each owned node's want, a pure function of
// the file. It reads bytes (YAML, or JSON, which YAML reads too) and does
// no I/O.
//
// Every error names the line and the field: a module in two of a node's
// groups (both named), a want over the limits of DESIGN.md §10 (events'
// own validation), an unknown field (a typo is an error, never a silently
// dropped field), a bad value, a group whose selector matches no owned
// node (a typo would remove its modules fleet-wide; [Options] can make it
// a warning).
package fleetfile
