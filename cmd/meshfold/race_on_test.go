//go:build race

package main

// raceBuild: the test binary has the race detector, so a meshfold built
// for a test is built with it too (and reuses the packages just compiled).
const raceBuild = true
