package lanesamqp

// Abort stops c as a crash would: nothing more is acknowledged.
func (c *Consumer) Abort() { c.abort() }
