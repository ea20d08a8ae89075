// Package laneskafka carries lanes through Kafka, with the contract of
// lanesnats (docs/mq.md): a Publisher writes each message to the topic of
// its lane ("<topic>.<lane>", the baseline's is "<topic>") with the lane in
// the x-lane and baggage headers, and a Consumer consumes, per lane it owns,
// that lane's topic in that lane's consumer group ("<service>.<group>.<lane>",
// the baseline's "<service>.<group>._"), committing offsets only after the
// handler returns. Which consumer owns which lane is the routing engine's
// answer, as for calls (internal/lib/mqlane): a lane's own consumers, else
// its fallback chain, else the baseline; a baseline message never reaches a
// lane consumer. The group's committed offsets hand a lane from one owner to
// the next without loss.
package laneskafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
)

// Errors. Calls wrap them with details; test with errors.Is.
var (
	// ErrInvalidTopic: a topic name breaks CheckTopic's rule.
	ErrInvalidTopic = errors.New("laneskafka: invalid topic")
	// ErrInvalidGroup: a group name breaks CheckGroup's rule.
	ErrInvalidGroup = errors.New("laneskafka: invalid group")
	// ErrInvalidOption: an option or a ConsumerConfig field has a value it
	// cannot take.
	ErrInvalidOption = errors.New("laneskafka: invalid option")
	// ErrClosed: the consumer was closed.
	ErrClosed = errors.New("laneskafka: consumer closed")
	// ErrRegistrationLost: the consumer's registration in the registry was
	// lost; it stopped.
	ErrRegistrationLost = errors.New("laneskafka: registration lost")
	// ErrNoConnection: a nil *Client was used: the service has no Kafka
	// brokers configured.
	ErrNoConnection = errors.New("laneskafka: no Kafka brokers: set LANES_KAFKA to the brokers' host:port list")
)

// BaselineGroupSuffix names the baseline's consumer group of a group:
// "<service>.<group>._" ("_" is not a valid lane name).
const BaselineGroupSuffix = "_"

// CheckTopic checks a topic name: 1 to 64 characters of A-Z, a-z, 0-9, '-'
// and '_' ('.' separates the lane).
func CheckTopic(topic string) error {
	if err := mqlane.CheckName(topic, true); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidTopic, topic, err)
	}
	return nil
}

// CheckGroup checks a consumer group name: 1 to 64 characters of A-Z, a-z,
// 0-9 and '-'.
func CheckGroup(group string) error {
	if err := mqlane.CheckName(group, false); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidGroup, group, err)
	}
	return nil
}

// LaneTopic is the Kafka topic of topic's messages in lane l: topic itself
// for the baseline, "<topic>.<l>" for a lane. An invalid lane is the
// baseline.
func LaneTopic(topic, l string) string {
	if l = mqlane.Norm(l); l == "" {
		return topic
	}
	return topic + "." + l
}

// topicLane returns the lane of the Kafka topic kt of topic: "" and true for
// the baseline, the lane and true for a lane's topic, false for a topic that
// is neither.
func topicLane(topic, kt string) (string, bool) {
	if kt == topic {
		return "", true
	}
	rest, ok := strings.CutPrefix(kt, topic+".")
	if !ok || !lane.Valid(rest) {
		return "", false
	}
	return rest, true
}

// GroupID is the Kafka consumer group of group of service in lane l.
func GroupID(service, group, l string) string {
	if l == "" {
		l = BaselineGroupSuffix
	}
	return service + "." + group + "." + l
}
