"""orders: an HTTP service of the polyglot example, Python's standard library only, behind the
lanes sidecar. It calls payments over gRPC with proxyless xDS: grpc.insecure_channel("xds:///payments")
with GRPC_XDS_BOOTSTRAP naming lanes' xDS server, so that the channel routes each call by the lane
in its metadata. orders has no OpenTelemetry: it forwards the lane (x-lane, baggage) and the trace
(traceparent, tracestate) by hand.

The messages are google.protobuf.StringValue (proto/polyglot.proto), whose class comes with
python3-protobuf: orders calls the method by name with its serializers, with no generated stubs and
no code-generation step (grpc_tools is not installed with python3-grpcio).
"""
import http.server
import json
import os
import urllib.parse

import grpc
from google.protobuf.wrappers_pb2 import StringValue

FORWARDED = ("x-lane", "baggage", "traceparent", "tracestate")

channel = grpc.insecure_channel("xds:///payments")
pay = channel.unary_unary(
    "/polyglot.Payments/Pay",
    request_serializer=StringValue.SerializeToString,
    response_deserializer=StringValue.FromString,
)


def lane_of(headers):
    """The lane a request carries: x-lane, else the lane member of baggage (the last one)."""
    if headers.get("x-lane") is not None:
        return headers["x-lane"].strip().lower()
    lane = ""
    for member in ",".join(headers.get_all("baggage") or []).split(","):
        key, _, value = member.split(";")[0].partition("=")
        if key.strip() == "lane":
            lane = urllib.parse.unquote(value).strip().lower()
    return lane


class Orders(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/healthz":
            return self.answer(200, "text/plain", b"ok\n")
        order = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("id", ["1"])[0]
        metadata = [(k, v) for k in FORWARDED for v in self.headers.get_all(k) or []]
        me = {"service": "orders", "lane": os.environ.get("LANES_LANE", ""), "request": lane_of(self.headers)}
        try:
            reply = pay(StringValue(value=order), metadata=metadata, timeout=5)
        except grpc.RpcError as err:
            return self.answer(502, "text/plain", f"orders: payments: {err.code().name} {err.details()}\n".encode())
        self.answer(200, "application/json", json.dumps([me] + json.loads(reply.value)).encode())

    def answer(self, status, content_type, body):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # one line per request is too many for the example's output


if __name__ == "__main__":
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8082"))), Orders)
    print(f"orders: listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
