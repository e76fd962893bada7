// Package rolloutstest is a light stand-in for a fleet's node agents, for
// rollout tests and benchmarks: it answers every plan with a settle per
// module and a have of the plan's modules running at their builds, as an
// agent whose applies all succeed would, without a process or a runtime.
package rolloutstest
