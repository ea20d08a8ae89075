package laneskafka

// Abort stops c as a crash would: no commit, no goodbye to the group.
func (c *Consumer) Abort() { c.abort() }

// SetMaxKnownTopics bounds the publishers' memory of lane topics to n, for
// a test, until its cleanup.
func SetMaxKnownTopics(t interface{ Cleanup(func()) }, n int) {
	old := maxKnownTopics
	maxKnownTopics = n
	t.Cleanup(func() { maxKnownTopics = old })
}
