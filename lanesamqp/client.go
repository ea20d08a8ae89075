package lanesamqp

import (
	"context"
	"fmt"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Client is a service's RabbitMQ broker together with the registry and the
// routing engine that its consumers register in and follow: it makes the
// service's publishers and consumers. lanesenv.Open makes one from
// LANES_AMQP (Env.AMQP). A nil *Client makes nothing: each method returns
// ErrNoConnection.
type Client struct {
	// Dial opens connections to the broker; Addr is its host:port, the
	// address consumers register by default.
	Dial Dialer
	Addr string
	// Registry and Engine are what Consumer gives a ConsumerConfig that
	// does not set them.
	Registry registry.Registry
	Engine   *routing.Engine
}

// NewClient returns a Client on the broker of dial (at addr), for
// consumers that register in reg and follow engine.
func NewClient(dial Dialer, addr string, reg registry.Registry, engine *routing.Engine) (*Client, error) {
	switch {
	case dial == nil:
		return nil, fmt.Errorf("%w: no Dialer", ErrInvalidOption)
	case reg == nil:
		return nil, fmt.Errorf("%w: no registry", ErrInvalidOption)
	case engine == nil:
		return nil, fmt.Errorf("%w: no routing engine", ErrInvalidOption)
	}
	return &Client{Dial: dial, Addr: addr, Registry: reg, Engine: engine}, nil
}

// Publisher returns a publisher of topic (NewPublisher), with a connection
// of its own: Close it.
func (c *Client) Publisher(topic string, opts ...PublisherOpt) (*Publisher, error) {
	if c == nil {
		return nil, ErrNoConnection
	}
	return NewPublisher(c.Dial, topic, opts...)
}

// Consumer starts a consumer (NewConsumer) whose Dial, Addr, Registry and
// Engine are the Client's unless cfg sets them.
func (c *Client) Consumer(ctx context.Context, cfg ConsumerConfig, h Handler, opts ...ConsumerOpt) (*Consumer, error) {
	if c == nil {
		return nil, ErrNoConnection
	}
	if cfg.Dial == nil {
		cfg.Dial = c.Dial
	}
	if cfg.Addr == "" {
		cfg.Addr = c.Addr
	}
	if cfg.Registry == nil {
		cfg.Registry = c.Registry
	}
	if cfg.Engine == nil {
		cfg.Engine = c.Engine
	}
	return NewConsumer(ctx, cfg, h, opts...)
}
