package etcdstore

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// watchResponseSeeds are watch responses as etcd sends them, and others.
func watchResponseSeeds() [][]byte {
	kv := func(key, value string, mod int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: 2, ModRevision: mod, Version: 3, Lease: 7587}
	}
	var seeds [][]byte
	for _, r := range []*pb.WatchResponse{
		{},
		{Header: &pb.ResponseHeader{ClusterId: 1 << 63, MemberId: 9, Revision: 42, RaftTerm: 3}, WatchId: 0, Created: true},
		{Header: &pb.ResponseHeader{Revision: 43}, Events: []*mvccpb.Event{{Type: mvccpb.PUT, Kv: kv("/lanes/instances/orders/i00000", `{"id":"i00000","service":"orders","addr":"10.0.0.0:8080","weight":7}`, 43)}}},
		{Header: &pb.ResponseHeader{Revision: 45}, Events: []*mvccpb.Event{
			{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("/lanes/instances/orders/i1"), ModRevision: 44}},
			{Type: mvccpb.PUT, Kv: kv("/lanes/instances/orders/i2", "x", 45), PrevKv: kv("/lanes/instances/orders/i2", "", 40)},
			{Kv: &mvccpb.KeyValue{}},
			{},
		}},
		{Canceled: true, CancelReason: "mvcc: required revision has been compacted", CompactRevision: 10, WatchId: -1, Fragment: true},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			panic(err)
		}
		seeds = append(seeds, b)
	}
	// By hand: a repeated header and key-value (merged), unknown fields
	// of every wire type, a known field of another wire type, and broken
	// ones.
	var b []byte
	b = protowire.AppendTag(b, fieldHeader, protowire.BytesType)
	b = protowire.AppendBytes(b, protowire.AppendVarint(protowire.AppendTag(nil, fieldHeaderRevision, protowire.VarintType), 5))
	b = protowire.AppendTag(b, fieldHeader, protowire.BytesType)
	b = protowire.AppendBytes(b, protowire.AppendVarint(protowire.AppendTag(nil, fieldHeaderMemberID, protowire.VarintType), 6))
	b = protowire.AppendTag(b, 99, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, 1)
	b = protowire.AppendTag(b, 98, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, 1)
	b = protowire.AppendTag(b, 97, protowire.StartGroupType)
	b = protowire.AppendTag(b, 97, protowire.EndGroupType)
	b = protowire.AppendTag(b, fieldWatchID, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("x"))
	ev := protowire.AppendTag(nil, fieldEventKv, protowire.BytesType)
	ev = protowire.AppendBytes(ev, protowire.AppendBytes(protowire.AppendTag(nil, fieldKVKey, protowire.BytesType), []byte("k")))
	ev = protowire.AppendTag(ev, fieldEventKv, protowire.BytesType)
	ev = protowire.AppendBytes(ev, protowire.AppendVarint(protowire.AppendTag(nil, fieldKVVersion, protowire.VarintType), 2))
	b = protowire.AppendTag(b, fieldEvents, protowire.BytesType)
	b = protowire.AppendBytes(b, ev)
	seeds = append(seeds, b)
	reason := protowire.AppendTag(nil, fieldCancelReason, protowire.BytesType)
	seeds = append(seeds, protowire.AppendBytes(reason, []byte("\xff")))
	seeds = append(seeds, b[:len(b)-1], []byte{0}, []byte{0x5a}, []byte{0x80}, []byte{0x0c})
	return seeds
}

// decodeWatchResponse gives protobuf's answers, unknown fields aside.
func FuzzWatchResponse(f *testing.F) {
	for _, s := range watchResponseSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want pb.WatchResponse
		wantErr := proto.Unmarshal(data, &want)
		gotErr := decodeWatchResponse(append([]byte(nil), data...), &got)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("decode % x: error %v, protobuf's %v", data, gotErr, wantErr)
		}
		if wantErr != nil {
			return
		}
		dropUnknown(want.ProtoReflect())
		if !proto.Equal(&want, &got) {
			t.Fatalf("decode % x: %v, protobuf's %v", data, &got, &want)
		}
	})
}

// dropUnknown clears the unknown fields of m and of the messages in it.
func dropUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				dropUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			dropUnknown(v.Message())
		}
		return true
	})
}

// The decoder makes three allocations for a one-event response (its copy
// of the message is the codec's).
func TestWatchResponseAllocations(t *testing.T) {
	b := watchResponseSeeds()[2]
	n := testing.AllocsPerRun(100, func() {
		var r pb.WatchResponse
		if err := decodeWatchResponse(b, &r); err != nil {
			t.Fatal(err)
		}
	})
	// The response is the caller's here: the header, the event with its
	// key-value, the list of the events.
	if n > 3 {
		t.Errorf("decoding a one-event watch response: %.0f allocations, want at most 3", n)
	}
}
