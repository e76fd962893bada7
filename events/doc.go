// Package events is meshfold's vocabulary: the Go types of every event kind
// on the wire (DESIGN.md §3), the subjects they travel on, their validation,
// and the codec.
//
// Every payload type embeds [Header], which carries the schema version `v`
// and the publisher's `at`. JSON field names are snake_case exactly as
// DESIGN.md §3 writes them. [Decode] ignores fields it does not know, so a
// newer publisher may add some; [DecodeStrict] refuses them and is what the
// CLI verbs use on a user's file, so a typo is an error and never a silently
// dropped field.
//
// A decoded [Event] carries its stream metadata (sequence, stream time)
// beside its payload. [Subjects] builds and parses subjects in one place,
// both the plain form publishers use (`mesh.<node>.<kind>`) and the stored
// form with the partition token first (`<p>.mesh.<node>.<kind>`).
//
// The package is pure: no I/O, no clock, no NATS. It is imported by every
// other package of meshfold and imports none of them.
package events
