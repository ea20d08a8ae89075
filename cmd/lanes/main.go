// Command lanes is the lanes command line. The commands themselves live in
// internal/app/cli; this file only connects them to the process.
package main

import (
	"os"

	"github.com/lanesdev/lanes/internal/app/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
