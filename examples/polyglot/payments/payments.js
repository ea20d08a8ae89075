// payments: a gRPC service of the polyglot example, @grpc/grpc-js with the proto loaded at run
// time. It calls ledger over proxyless xDS (xds:///ledger, GRPC_XDS_BOOTSTRAP naming lanes' xDS
// server): the channel routes each call by the lane in its metadata, which payments passes on
// from the call it serves (x-lane and baggage; traceparent for the trace).
require('@grpc/grpc-js-xds').register();
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const path = require('node:path');

const proto = grpc.loadPackageDefinition(protoLoader.loadSync(
  path.join(__dirname, '..', 'proto', 'polyglot.proto'), { includeDirs: [path.join(__dirname, '..', 'proto')] },
)).polyglot;
const ledger = new proto.Ledger('xds:///ledger', grpc.credentials.createInsecure());
const forwarded = ['x-lane', 'baggage', 'traceparent', 'tracestate'];

// laneOf reads the lane a call carries: x-lane, else the lane member of baggage.
function laneOf(md) {
  const header = md.get('x-lane')[0];
  if (header !== undefined) return String(header).trim().toLowerCase();
  const member = md.get('baggage').join(',').split(',').map((m) => m.split(';')[0].trim())
    .filter((m) => m.startsWith('lane=')).pop();
  return member ? decodeURIComponent(member.slice(5)).trim().toLowerCase() : '';
}

function pay(call, callback) {
  const out = new grpc.Metadata();
  for (const key of forwarded) {
    for (const v of call.metadata.get(key)) out.add(key, v);
  }
  const me = { service: 'payments', lane: process.env.LANES_LANE ?? '', request: laneOf(call.metadata) };
  ledger.Record({ value: call.request.value }, out, { deadline: Date.now() + 5000 }, (err, reply) => {
    if (err) {
      callback({ code: grpc.status.UNAVAILABLE, details: `payments: ledger: ${err.details || err.message}` });
      return;
    }
    callback(null, { value: JSON.stringify([me, ...JSON.parse(reply.value)]) });
  });
}

const server = new grpc.Server();
server.addService(proto.Payments.service, { Pay: pay });
server.bindAsync(`127.0.0.1:${process.env.PORT ?? 0}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) throw err;
  console.log(`payments: listening on 127.0.0.1:${port}`);
});
process.once('SIGTERM', () => server.tryShutdown(() => process.exit(0)));
