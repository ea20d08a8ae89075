package laneskafka

// Abort stops c as a crash would: no commit, no goodbye to the group.
func (c *Consumer) Abort() { c.abort() }
