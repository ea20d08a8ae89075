package lanesnats

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
)

// BaselineToken is the lane token of the baseline in subjects and consumer
// names. It is not a valid lane name, so no lane can take it.
const BaselineToken = "_"

// CheckTopic checks a topic name: 1 to 64 characters of A-Z, a-z, 0-9, '-'
// and '_'. A topic is one subject token; it is also the default stream
// name.
func CheckTopic(topic string) error {
	if err := mqlane.CheckName(topic, true); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidTopic, topic, err)
	}
	return nil
}

// CheckGroup checks a consumer group name: 1 to 64 characters of A-Z, a-z,
// 0-9 and '-'. ('_' is kept out: it separates the group from the lane in
// consumer names.)
func CheckGroup(group string) error {
	if err := mqlane.CheckName(group, false); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidGroup, group, err)
	}
	return nil
}

// checkSubject checks the subject of a message within its topic: one or
// more non-empty tokens separated by '.', without wildcards or whitespace.
func checkSubject(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty (a message needs a subject within its topic, such as \"created\")", ErrInvalidSubject)
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			c := s[i]
			if c <= ' ' || c == 0x7f {
				return fmt.Errorf("%w %q: whitespace or control character", ErrInvalidSubject, s)
			}
			if c != '.' {
				continue
			}
		}
		tok := s[start:i]
		if tok == "" {
			return fmt.Errorf("%w %q: empty token", ErrInvalidSubject, s)
		}
		if tok == "*" || tok == ">" {
			return fmt.Errorf("%w %q: wildcards cannot be published", ErrInvalidSubject, s)
		}
		start = i + 1
	}
	return nil
}

// laneToken returns the subject token of a lane: the lane itself, or
// BaselineToken for the baseline. A name that is not a normalised lane is
// normalised with lane.Parse; an invalid one is the baseline, as on the wire.
func laneToken(laneName string) string {
	if l := normLane(laneName); l != "" {
		return l
	}
	return BaselineToken
}

// normLane normalises a lane as lane.Propagator.InjectLane does: an invalid
// name is the baseline.
func normLane(l string) string { return mqlane.Norm(l) }

// Subject returns the NATS subject of a message of topic, published in
// lane laneName ("" for the baseline), with the subject subject within the
// topic: "<topic>.<lane or _>.<subject>". Producers in other languages
// publish to it, with the lane in the x-lane and baggage headers too.
func Subject(topic, laneName, subject string) string {
	return topic + "." + laneToken(laneName) + "." + subject
}

// StreamSubjects returns the subjects of the stream of a topic: every lane
// and every subject, "<topic>.>".
func StreamSubjects(topic string) []string { return []string{topic + ".>"} }

// laneFilter returns the filter subject of the consumers of one lane token.
func laneFilter(topic, tok string) string { return topic + "." + tok + ".>" }

// splitSubject splits a subject of topic into its lane token and its
// subject within the topic. ok is false for a subject outside the topic or
// without a subject after the lane.
func splitSubject(topic, subj string) (tok, rest string, ok bool) {
	if len(subj) <= len(topic)+1 || subj[:len(topic)] != topic || subj[len(topic)] != '.' {
		return "", "", false
	}
	s := subj[len(topic)+1:]
	i := strings.IndexByte(s, '.')
	if i <= 0 || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// tokenLane returns the lane of a subject token: "" and true for the
// baseline token, the lane and true for a normalised lane name, and "" and
// false for anything else (an invalid lane, whose messages the baseline
// handles).
func tokenLane(tok string) (string, bool) {
	if tok == BaselineToken {
		return "", true
	}
	if lane.Valid(tok) {
		return tok, true
	}
	return "", false
}

// consumerName returns the name of the durable JetStream consumer of group
// for the messages of one lane token: "<group>_<lane>", "<group>__" for the
// baseline, and "<group>__x<hash>" for a token that is not a lane name
// (published by a foreign producer; the baseline handles it). Lane names
// have no '_' and groups none either, so names never collide.
func consumerName(group, tok string) string {
	if _, ok := tokenLane(tok); ok {
		return group + "_" + tok
	}
	h := fnv.New64a()
	h.Write([]byte(tok))
	return group + "__x" + strconv.FormatUint(h.Sum64(), 16)
}

// registryService returns the service name under which the consumers of
// group register in the registry, and which the routing engine resolves to
// decide ownership: "mq.<service>.<group>". Policy rules (tags, lane
// settings) that should apply to the consumers name this service.
func registryService(service, group string) string { return mqlane.RegistryService(service, group) }

// DeadLetterTopic is the default dead-letter topic of a topic:
// "<topic>-dlq". It is a topic like any other, so dead letters can be
// consumed with a Consumer, lane by lane.
func DeadLetterTopic(topic string) string { return topic + "-dlq" }

// StreamConfig returns the stream configuration lanes recommends for a
// topic, for jetstream.JetStream.CreateOrUpdateStream: the stream is named
// after the topic and captures every lane; it is on file storage, keeps
// messages by limits (consumers are created on demand, so a message must not
// depend on a consumer existing when it is published: no interest or
// work-queue retention), refuses new messages rather than dropping old ones
// when full, and deduplicates publishes by Nats-Msg-Id over two minutes.
//
// Set Replicas to 3 in a cluster, and MaxAge or MaxBytes to bound the
// stream. docs/mq.md lists the durability settings.
func StreamConfig(topic string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        topic,
		Description: "lanes topic " + topic + ": <topic>.<lane or _>.<subject>",
		Subjects:    StreamSubjects(topic),
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		Replicas:    1,
		Duplicates:  2 * time.Minute,
	}
}
