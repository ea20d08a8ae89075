package mqlane

import "fmt"

// MaxNameLen bounds the topic, service and group names of every backend,
// so that the names built from them (NATS consumer names, Kafka lane
// topics "<topic>.<lane>", AMQP exchanges and queues) stay within each
// broker's limits.
const MaxNameLen = 64

// CheckName checks a topic or group name: 1 to MaxNameLen characters of
// A-Z, a-z, 0-9 and '-', and '_' when underscore is set. The error says
// which rule s breaks, without s: the caller names the field and the value.
func CheckName(s string, underscore bool) error {
	if s == "" || len(s) > MaxNameLen {
		return fmt.Errorf("must be 1 to %d characters", MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
		case c == '_' && underscore:
		default:
			allowed := "A-Z a-z 0-9 -"
			if underscore {
				allowed += " _"
			}
			return fmt.Errorf("character %q at %d: only %s", c, i, allowed)
		}
	}
	return nil
}
