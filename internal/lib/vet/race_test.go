//go:build race

package vet_test

const raceEnabled = true
