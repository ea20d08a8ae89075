package lanesnats

import "errors"

// Errors. Calls wrap them with details; test with errors.Is.
var (
	// ErrInvalidTopic: a topic name breaks CheckTopic's rule.
	ErrInvalidTopic = errors.New("lanesnats: invalid topic")
	// ErrInvalidGroup: a group name breaks CheckGroup's rule.
	ErrInvalidGroup = errors.New("lanesnats: invalid group")
	// ErrInvalidSubject: the subject of a message within its topic is empty,
	// has an empty token, a wildcard or whitespace.
	ErrInvalidSubject = errors.New("lanesnats: invalid subject")
	// ErrInvalidOption: an option or a ConsumerConfig field has a value it
	// cannot take.
	ErrInvalidOption = errors.New("lanesnats: invalid option")
	// ErrStreamNotFound: no stream of the topic exists; create it first
	// (StreamConfig).
	ErrStreamNotFound = errors.New("lanesnats: stream not found")
	// ErrClosed: the consumer was closed.
	ErrClosed = errors.New("lanesnats: consumer closed")
	// ErrNoConnection: a nil *Client was used: the service has no NATS
	// connection. With lanesenv, set LANES_NATS (lanes up prints it).
	ErrNoConnection = errors.New("lanesnats: no NATS connection: set LANES_NATS to the NATS server's URL (lanes up prints it with LANES_REGISTRY)")
	// ErrRegistrationLost: the consumer's registration in the registry was
	// lost; it stopped, since the other consumers no longer count on it.
	ErrRegistrationLost = errors.New("lanesnats: registration lost")
)

// Permanent wraps a handler error that retrying cannot fix: the message goes
// to the dead-letter topic at once instead of being delivered again.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err, or an error it wraps, came from
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
