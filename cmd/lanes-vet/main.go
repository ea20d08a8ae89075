// Command lanes-vet runs the lanes analyzers (docs/vet.md) as a multichecker, and as a vet tool:
//
//	go install github.com/lanesdev/lanes/cmd/lanes-vet
//	go vet -vettool=$(which lanes-vet) ./...
//	lanes-vet ./...
//
// With go vet, analyzer flags are given as -lanebypass.allow=...; gopls and other drivers that
// take analysis.Analyzers can use the same analyzers.
package main

import (
	"golang.org/x/tools/go/analysis/multichecker"

	"github.com/lanesdev/lanes/internal/lib/vet"
)

func main() { multichecker.Main(vet.Analyzers()...) }
