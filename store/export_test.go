package store

// ProvablyDead exports provablyDead to the tests of package store_test.
var ProvablyDead = provablyDead
