// Package nats is a stub of nats.go for the analyzers' tests.
package nats

type Conn struct{}
type Msg struct{ Subject string }

func (c *Conn) Publish(subj string, data []byte) error { return nil }
func (c *Conn) PublishMsg(m *Msg) error                { return nil }
func (c *Conn) Subscribe(subj string, cb func(*Msg)) error {
	return nil
}
