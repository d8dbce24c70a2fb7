// Command vigil keeps watch over fleets of always-on agent processes. See
// `vigil --help` and README.md.
package main

import (
	"os"

	"github.com/vigil-fleet/vigil/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
