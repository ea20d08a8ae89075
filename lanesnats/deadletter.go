package lanesnats

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// Headers of a dead letter, besides the original message's own.
const (
	HeaderDLQGroup      = "Lanes-Dlq-Group"      // the consumer group that gave up
	HeaderDLQService    = "Lanes-Dlq-Service"    // its service
	HeaderDLQStream     = "Lanes-Dlq-Stream"     // the original stream
	HeaderDLQSeq        = "Lanes-Dlq-Seq"        // the original stream sequence
	HeaderDLQSubject    = "Lanes-Dlq-Subject"    // the original NATS subject
	HeaderDLQDeliveries = "Lanes-Dlq-Deliveries" // deliveries of the original
	HeaderDLQError      = "Lanes-Dlq-Error"      // the last handler error
)

// deadLetter publishes the message to the dead-letter topic in its lane,
// with its headers and the reason, then terminates it. When the publish
// fails the message is delivered again later instead: it is never dropped.
func (f *fetcher) deadLetter(d *Delivery, cause error) {
	c, m := f.c, d.Msg
	stream := c.stream.CachedInfo().Config.Name
	hdr := make(nats.Header, len(d.Header)+8)
	for k, v := range d.Header {
		hdr[k] = v
	}
	seq := strconv.FormatUint(d.Seq, 10)
	hdr[HeaderDLQGroup] = []string{c.group}
	hdr[HeaderDLQService] = []string{c.service}
	hdr[HeaderDLQStream] = []string{stream}
	hdr[HeaderDLQSeq] = []string{seq}
	hdr[HeaderDLQSubject] = []string{m.Subject()}
	hdr[HeaderDLQDeliveries] = []string{strconv.FormatUint(d.NumDelivered, 10)}
	msg := cause.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	hdr[HeaderDLQError] = []string{msg}
	// Publishing twice (a crash before Term) stores one dead letter.
	hdr[MsgIDHeader] = []string{"dlq:" + stream + ":" + seq + ":" + c.group}
	out := &nats.Msg{Subject: c.dlq + "." + f.tok + "." + d.Subject, Header: hdr, Data: d.Data}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := c.js.PublishMsg(ctx, out)
	cancel()
	if err != nil {
		c.log.Error("lanes: cannot publish a dead letter; the message will be delivered again", "dlq", out.Subject, "seq", d.Seq, "err", err)
		m.NakWithDelay(c.delay(uint64(len(c.o.retryDelays))))
		return
	}
	if err := m.Term(); err != nil {
		c.log.Warn("lanes: term failed after dead-lettering", "seq", d.Seq, "err", err)
	}
	c.deadLettered.Add(1)
	c.log.Error("lanes: message dead-lettered", "token", f.tok, "seq", d.Seq, "dlq", out.Subject, "deliveries", d.NumDelivered, "err", cause)
}
