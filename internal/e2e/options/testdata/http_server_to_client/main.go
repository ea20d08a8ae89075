// A server option given to a client: does not compile.
package main

import (
	"time"

	"github.com/lanesdev/lanes/laneshttp"
)

func main() {
	_ = laneshttp.NewClient(nil, laneshttp.WithTTL(time.Second))
}
