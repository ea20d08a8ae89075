// Package buftest gives tests a buffer that goroutines may write to while
// the test reads it: the destination of a logger, or of a child process's
// output, that a test checks as it runs.
package buftest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use. The zero value is an
// empty buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Contains reports whether what was written so far contains s.
func (b *Buffer) Contains(s string) bool {
	return strings.Contains(b.String(), s)
}
