// Package lanesamqp carries lanes through RabbitMQ (AMQP 0-9-1), with the
// contract of lanesnats (docs/mq.md). A Publisher publishes each message to
// the topic's fanout exchange "lanes.<topic>" with the lane in the x-lane
// header and the lane member of the W3C baggage header, and waits for the
// broker's confirm. Each consumer group has a headers exchange bound to it,
// "lanes.<topic>.<service>.<group>", which routes a message by its x-lane
// header (and RouteHeader) to the lane's queue ("lanes.<topic>.<service>.<group>.<lane>") and
// everything else (the baseline, lanes without a queue yet) through its
// alternate exchange to the baseline queue (".._"). A Consumer consumes,
// with manual acks after the handler returns, the queues of the lanes the
// routing engine gives it (internal/lib/mqlane): a lane's own consumers,
// else its fallback chain, else the baseline. A message of a lane that
// reaches the baseline queue makes the lane's queue exist, and is handled
// there or moved to the lane's queue, whichever the engine says. When a
// consumer dies the broker gives its unacknowledged messages back to the
// queue, for the lane's next owner.
package lanesamqp

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
)

// Errors. Calls wrap them with details; test with errors.Is.
var (
	// ErrInvalidName: a topic or group name breaks CheckName's rule.
	ErrInvalidName = errors.New("lanesamqp: invalid name")
	// ErrInvalidOption: an option or a ConsumerConfig field has a value it
	// cannot take.
	ErrInvalidOption = errors.New("lanesamqp: invalid option")
	// ErrClosed: the consumer was closed.
	ErrClosed = errors.New("lanesamqp: consumer closed")
	// ErrRegistrationLost: the consumer's registration was lost; it stopped.
	ErrRegistrationLost = errors.New("lanesamqp: registration lost")
	// ErrNotConfirmed: the broker refused (nacked) a published message.
	ErrNotConfirmed = errors.New("lanesamqp: the broker did not confirm the message")
	// ErrNoConnection: a nil *Client was used: the service has no broker
	// configured.
	ErrNoConnection = errors.New("lanesamqp: no RabbitMQ broker: set LANES_AMQP to the broker's amqp:// URL")
)

// BaselineQueueSuffix ends the name of a group's baseline queue ("_" is not
// a valid lane name).
const BaselineQueueSuffix = "_"

// CheckName checks a topic or group name: 1 to 64 characters of A-Z, a-z,
// 0-9, '-' and '_' ('.' separates the parts of exchange and queue names).
func CheckName(what, s string) error {
	if err := mqlane.CheckName(s, true); err != nil {
		return fmt.Errorf("%w: %s %q: %s", ErrInvalidName, what, s, err)
	}
	return nil
}

// Exchange is the fanout exchange that publishers of topic publish to.
func Exchange(topic string) string { return "lanes." + topic }

// GroupExchange is the headers exchange of a consumer group.
func GroupExchange(topic, service, group string) string {
	return "lanes." + topic + "." + service + "." + group
}

// Queue is the queue of lane l ("" the baseline) of a consumer group.
func Queue(topic, service, group, l string) string {
	if l == "" {
		l = BaselineQueueSuffix
	}
	return GroupExchange(topic, service, group) + "." + l
}

// indexQueue holds the names of the group's lane queues, so that a consumer
// that starts later learns of them.
func indexQueue(topic, service, group string) string {
	return GroupExchange(topic, service, group) + "..lanes"
}

// maxIndex bounds the index queue (drop-head: the oldest entries go first)
// and what one discovery reads of it.
const maxIndex = 1024

// A Dialer opens a connection to the broker. Consumers and publishers
// dial again after a connection is lost (a broker restart).
type Dialer func(ctx context.Context) (*amqp.Connection, error)

// DialURL returns a Dialer of url with cfg (amqp.DialConfig), bounding each
// dial by 10s (cfg.Dial, when nil) and by ctx.
func DialURL(url string, cfg amqp.Config) Dialer {
	if cfg.Dial == nil {
		cfg.Dial = amqp.DefaultDial(10 * time.Second)
	}
	return func(ctx context.Context) (*amqp.Connection, error) {
		type res struct {
			c   *amqp.Connection
			err error
		}
		ch := make(chan res, 1)
		go func() { // owned by the dial: it ends within cfg.Dial's bound
			c, err := amqp.DialConfig(url, cfg)
			ch <- res{c, err}
		}()
		select {
		case r := <-ch:
			return r.c, r.err
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.c != nil {
					r.c.Close()
				}
			}()
			return nil, ctx.Err()
		}
	}
}

// declareGroup declares the exchanges and queues of a group's baseline and
// of the lanes ls, idempotently.
func declareGroup(ch *amqp.Channel, topic, service, group string, ls ...string) error {
	x, gx := Exchange(topic), GroupExchange(topic, service, group)
	base := Queue(topic, service, group, "")
	if err := ch.ExchangeDeclare(x, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", x, err)
	}
	if err := ch.ExchangeDeclare(base, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", base, err)
	}
	if err := ch.ExchangeDeclare(gx, amqp.ExchangeHeaders, true, false, false, false, amqp.Table{"alternate-exchange": base}); err != nil {
		return fmt.Errorf("declare exchange %s: %w", gx, err)
	}
	if err := ch.ExchangeBind(gx, "", x, false, nil); err != nil {
		return fmt.Errorf("bind exchange %s to %s: %w", gx, x, err)
	}
	if _, err := ch.QueueDeclare(base, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", base, err)
	}
	if err := ch.QueueBind(base, "", base, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", base, err)
	}
	idx := indexQueue(topic, service, group)
	if _, err := ch.QueueDeclare(idx, true, false, false, false, amqp.Table{"x-max-length": int32(maxIndex), "x-overflow": "drop-head"}); err != nil {
		return fmt.Errorf("declare queue %s: %w", idx, err)
	}
	for _, l := range ls {
		if l == "" {
			continue
		}
		q := Queue(topic, service, group, l)
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
		if err := ch.QueueBind(q, "", gx, false, amqp.Table{"x-match": "all", RouteHeader: l}); err != nil {
			return fmt.Errorf("bind queue %s: %w", q, err)
		}
	}
	return nil
}
