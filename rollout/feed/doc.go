// Package feed joins the pure rollout core (package rollout) to the
// stream: the one conversion of a stored message into the fold's input,
// the replay of a fleet's rollout from its newest start (what the
// controller refolds and `meshfold rollout status` shows), the fleets the
// stream holds a rollout of, and apply: the start of a rollout computed
// from a fleet file and the nodes' newest wants (DESIGN.md §11). It is
// shell code: it reads and writes the stream; the rules stay in rollout.
package feed
