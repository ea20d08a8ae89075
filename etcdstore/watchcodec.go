package etcdstore

import (
	"errors"
	"unicode/utf8"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// watchCodec is the gRPC codec of the Store's watch streams. It decodes a
// watch response by hand, in four allocations whatever its events (the
// header, the events with their key-values, the list of the events, and
// one copy of the message that every key and value is a part of), where
// protobuf's generic decoder makes seven for one event and walks the
// message by reflection: a thousand watches in a
// process decode each change a thousand times. Anything else (the
// requests it sends) goes to gRPC's protobuf codec. decodeWatchResponse
// gives protobuf's answers (FuzzWatchResponse holds it to them), except
// that it keeps no unknown fields.
type watchCodec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

func (watchCodec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

func (watchCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*pb.WatchResponse)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	return decodeWatchResponse(data.Materialize(), r)
}

// Name is protobuf's, so that etcd sees the content type it knows.
func (watchCodec) Name() string { return proto.Name }

// The field numbers of etcd's watch response (rpc.proto, kv.proto).
const (
	fieldHeader          = 1
	fieldWatchID         = 2
	fieldCreated         = 3
	fieldCanceled        = 4
	fieldCompactRevision = 5
	fieldCancelReason    = 6
	fieldFragment        = 7
	fieldEvents          = 11

	fieldHeaderClusterID = 1
	fieldHeaderMemberID  = 2
	fieldHeaderRevision  = 3
	fieldHeaderRaftTerm  = 4

	fieldEventType   = 1
	fieldEventKv     = 2
	fieldEventPrevKv = 3

	fieldKVKey            = 1
	fieldKVCreateRevision = 2
	fieldKVModRevision    = 3
	fieldKVVersion        = 4
	fieldKVValue          = 5
	fieldKVLease          = 6
)

var errWatchResponse = errors.New("etcdstore: invalid watch response")

// decodeWatchResponse decodes b, which it keeps (keys and values are parts
// of it), into r, which must be new.
func decodeWatchResponse(b []byte, r *pb.WatchResponse) error {
	// The events first, to make them in one allocation.
	n := 0
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num == fieldEvents && typ == protowire.BytesType {
			n++
		}
		return nil
	})
	if err != nil {
		return err
	}
	type event struct {
		ev mvccpb.Event
		kv mvccpb.KeyValue
	}
	var evs []event
	if n > 0 {
		evs = make([]event, 0, n)
		r.Events = make([]*mvccpb.Event, 0, n)
	}
	var header *pb.ResponseHeader
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case typ == protowire.BytesType && num == fieldHeader:
			if header == nil {
				header = new(pb.ResponseHeader)
				r.Header = header
			}
			return decodeHeader(v, header)
		case typ == protowire.BytesType && num == fieldEvents:
			evs = append(evs, event{})
			e := &evs[len(evs)-1]
			r.Events = append(r.Events, &e.ev)
			return decodeEvent(v, &e.ev, &e.kv)
		case typ == protowire.BytesType && num == fieldCancelReason:
			if !utf8.Valid(v) {
				return errWatchResponse
			}
			r.CancelReason = string(v)
		case typ != protowire.VarintType:
		case num == fieldWatchID:
			r.WatchId = int64(x)
		case num == fieldCreated:
			r.Created = x != 0
		case num == fieldCanceled:
			r.Canceled = x != 0
		case num == fieldCompactRevision:
			r.CompactRevision = int64(x)
		case num == fieldFragment:
			r.Fragment = x != 0
		}
		return nil
	})
}

func decodeHeader(b []byte, h *pb.ResponseHeader) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
		if typ != protowire.VarintType {
			return nil
		}
		switch num {
		case fieldHeaderClusterID:
			h.ClusterId = x
		case fieldHeaderMemberID:
			h.MemberId = x
		case fieldHeaderRevision:
			h.Revision = int64(x)
		case fieldHeaderRaftTerm:
			h.RaftTerm = x
		}
		return nil
	})
}

// decodeEvent decodes b into ev, with kv as its key-value when it has one.
// A previous key-value (which the Store's watches never ask for) is made
// apart.
func decodeEvent(b []byte, ev *mvccpb.Event, kv *mvccpb.KeyValue) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case typ == protowire.VarintType && num == fieldEventType:
			ev.Type = mvccpb.Event_EventType(int32(x))
		case typ == protowire.BytesType && num == fieldEventKv:
			ev.Kv = kv
			return decodeKV(v, kv)
		case typ == protowire.BytesType && num == fieldEventPrevKv:
			if ev.PrevKv == nil {
				ev.PrevKv = new(mvccpb.KeyValue)
			}
			return decodeKV(v, ev.PrevKv)
		}
		return nil
	})
}

func decodeKV(b []byte, kv *mvccpb.KeyValue) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case typ == protowire.BytesType && num == fieldKVKey:
			kv.Key = part(v)
		case typ == protowire.BytesType && num == fieldKVValue:
			kv.Value = part(v)
		case typ != protowire.VarintType:
		case num == fieldKVCreateRevision:
			kv.CreateRevision = int64(x)
		case num == fieldKVModRevision:
			kv.ModRevision = int64(x)
		case num == fieldKVVersion:
			kv.Version = int64(x)
		case num == fieldKVLease:
			kv.Lease = int64(x)
		}
		return nil
	})
}

// part is v with its capacity cut to its length, so that an append cannot
// write over the rest of the message; nil when empty, as protobuf decodes
// an empty bytes field.
func part(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return v[:len(v):len(v)]
}

// fields calls fn with each field of the message b: its number, its type,
// and its bytes (of a length-delimited field) or its number (of a varint).
// Fixed-size fields and groups are skipped, as the watch response has none.
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || !num.IsValid() {
			return errWatchResponse
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errWatchResponse
		}
		b = b[n:]
		if typ == protowire.VarintType || typ == protowire.BytesType {
			if err := fn(num, typ, v, x); err != nil {
				return err
			}
		}
	}
	return nil
}
