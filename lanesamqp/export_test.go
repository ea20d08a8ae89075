package lanesamqp

// Abort stops c as a crash would: nothing more is acknowledged.
func (c *Consumer) Abort() { c.abort() }

// DeclareGroup declares the exchanges and queues of a group's baseline and
// of lanes ls, as consumers do.
var DeclareGroup = declareGroup
