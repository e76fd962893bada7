//go:build !race

package main

// raceBuild: see race_on_test.go.
const raceBuild = false
