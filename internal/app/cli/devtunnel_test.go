package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func printed(stream []byte) []string {
	var out []string
	parseRequests(bufio.NewReader(bytes.NewReader(stream)), func(proto, method, path, l, trace string) {
		out = append(out, fmt.Sprintf("%s %s %s %s %s", proto, method, path, l, trace))
	})
	return out
}

// TestPrintsHTTP1: every request of a kept-alive connection is printed, past
// bodies of either framing.
func TestPrintsHTTP1(t *testing.T) {
	stream := "POST /a HTTP/1.1\r\nHost: web\r\nX-Lane: alice\r\nTraceparent: " + tp + "\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5\r\nhello\r\n0\r\n\r\n" +
		"PUT /b HTTP/1.1\r\nHost: web\r\nX-Lane: alice\r\nContent-Length: 3\r\n\r\nabc" +
		"GET /c?x=1 HTTP/1.1\r\nHost: web\r\n\r\n"
	got := printed([]byte(stream))
	want := []string{
		"HTTP/1.1 POST /a alice 0af7651916cd43dd8448eb211c80319c",
		"HTTP/1.1 PUT /b alice ",
		"HTTP/1.1 GET /c?x=1  ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPrintsGRPC: the HEADERS of each HTTP/2 stream are printed, gRPC named.
func TestPrintsGRPC(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&buf, nil)
	fr.WriteSettings()
	for i, path := range []string{"/greeter.Greeter/Hello", "/greeter.Greeter/Bye"} {
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "greeter"},
			{"content-type", "application/grpc"}, {"x-lane", "alice"}, {"traceparent", tp}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true})
		fr.WriteData(uint32(2*i+1), true, []byte("\x00\x00\x00\x00\x00"))
	}
	got := printed(buf.Bytes())
	want := []string{
		"gRPC POST /greeter.Greeter/Hello alice 0af7651916cd43dd8448eb211c80319c",
		"gRPC POST /greeter.Greeter/Bye alice 0af7651916cd43dd8448eb211c80319c",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestTapNeverBlocks: a tap that falls behind stops reading its connection
// rather than holding it back.
func TestTapNeverBlocks(t *testing.T) {
	block := make(chan struct{})
	tp := newTap(func(proto, method, path, l, trace string) { <-block })
	req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	for range 10 * tapDepth {
		tp.feed(req) // returns at once even though the printer is stuck
	}
	if !tp.full {
		t.Error("the tap did not give up on a stuck printer")
	}
	close(block)
	tp.close()
}
