package lanesnats

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Client is a service's connection to NATS JetStream together with the
// registry and the routing engine that its consumers register in and follow:
// it makes the service's publishers and consumers. lanesenv.Open makes one
// from LANES_NATS (Env.NATS). A nil *Client makes nothing: each method
// returns ErrNoConnection.
type Client struct {
	// Conn is the NATS connection.
	Conn *nats.Conn
	// JetStream is the JetStream context on Conn.
	JetStream jetstream.JetStream
	// Registry and Engine are what Consumer gives a ConsumerConfig that
	// does not set them.
	Registry registry.Registry
	Engine   *routing.Engine
}

// NewClient returns a Client on the connection nc, for consumers that
// register in reg and follow engine. A nil nc, reg or engine is an
// ErrInvalidOption error.
func NewClient(nc *nats.Conn, reg registry.Registry, engine *routing.Engine) (*Client, error) {
	switch {
	case nc == nil:
		return nil, fmt.Errorf("%w: no NATS connection (nil *nats.Conn)", ErrInvalidOption)
	case reg == nil:
		return nil, fmt.Errorf("%w: no registry", ErrInvalidOption)
	case engine == nil:
		return nil, fmt.Errorf("%w: no routing engine", ErrInvalidOption)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("lanesnats: JetStream: %w", err)
	}
	return &Client{Conn: nc, JetStream: js, Registry: reg, Engine: engine}, nil
}

// Publisher returns a publisher of topic (NewPublisher).
func (c *Client) Publisher(topic string, opts ...PublisherOpt) (*Publisher, error) {
	if c == nil {
		return nil, ErrNoConnection
	}
	return NewPublisher(c.JetStream, topic, opts...)
}

// Consumer starts a consumer (NewConsumer) whose Registry and Engine are
// the Client's unless cfg sets them.
func (c *Client) Consumer(ctx context.Context, cfg ConsumerConfig, h Handler, opts ...ConsumerOpt) (*Consumer, error) {
	if c == nil {
		return nil, ErrNoConnection
	}
	if cfg.Registry == nil {
		cfg.Registry = c.Registry
	}
	if cfg.Engine == nil {
		cfg.Engine = c.Engine
	}
	return NewConsumer(ctx, c.JetStream, cfg, h, opts...)
}

// CreateStreams creates the stream of topic and the stream of its dead
// letters with StreamConfig, or updates them to it. It is idempotent: every
// instance may call it at start.
func (c *Client) CreateStreams(ctx context.Context, topic string) error {
	if c == nil {
		return ErrNoConnection
	}
	if err := CheckTopic(topic); err != nil {
		return err
	}
	for _, t := range []string{topic, DeadLetterTopic(topic)} {
		if _, err := c.JetStream.CreateOrUpdateStream(ctx, StreamConfig(t)); err != nil {
			return fmt.Errorf("lanesnats: create the stream of %s: %w", t, err)
		}
	}
	return nil
}
