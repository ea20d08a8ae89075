//go:build !unix

package benchcpu

import "time"

// Process returns 0: the CPU time of the process is not read on this
// system.
func Process() time.Duration { return 0 }
