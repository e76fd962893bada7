package process

import "github.com/meshfold/meshfold/node/process/shim"

// Status is what a shim reports of its module (see [shim.Status]).
type Status = shim.Status

// Backoff paces the restarts of a module whose process exited (see
// [shim.Backoff]).
type Backoff = shim.Backoff

// DefaultBackoff is DESIGN.md §8's restart pacing.
var DefaultBackoff = shim.DefaultBackoff

// DefaultCgroupParent is where modules' cgroups are made by default, under
// the root of each hierarchy.
const DefaultCgroupParent = shim.DefaultCgroupParent
