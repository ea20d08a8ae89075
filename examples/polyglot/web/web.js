// web: the edge service of the polyglot example, plain node:http. It calls orders through the
// lanes sidecar's outbound proxy (HTTP_PROXY). It has no lanes code: otel.js's auto-instrumentation
// reads the baggage that arrives and sends it on with the call, and the lane with it.
const http = require('node:http');
const { propagation, context } = require('@opentelemetry/api');

const proxy = new URL(process.env.HTTP_PROXY); // the sidecar's outbound proxy
const hop = () => ({
  service: 'web',
  lane: process.env.LANES_LANE ?? '',
  request: propagation.getBaggage(context.active())?.getEntry('lane')?.value ?? '',
});

// callOrders asks orders for the rest of the chain: an absolute URL to the proxy, as HTTP_PROXY
// clients send it; the proxy picks the instance of orders by the request's lane.
function callOrders(order) {
  return new Promise((resolve, reject) => {
    const req = http.get({
      host: proxy.hostname, port: proxy.port, path: `http://orders/order?id=${encodeURIComponent(order)}`,
      headers: { host: 'orders' }, timeout: 5000,
    }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk) => { body += chunk; });
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(body))
        : reject(new Error(`orders answered ${res.statusCode}: ${body.trim()}`))));
    });
    req.on('timeout', () => req.destroy(new Error('orders: no answer within 5 s')));
    req.on('error', reject);
  });
}

const server = http.createServer(async (req, res) => {
  if (req.url === '/healthz') {
    res.end('ok\n');
    return;
  }
  try {
    const hops = await callOrders(new URL(req.url, 'http://web').searchParams.get('id') ?? '1');
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ hops: [hop(), ...hops] }) + '\n');
  } catch (err) {
    res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`web: ${err.message}\n`);
  }
});
// PORT, or LISTEN_FD: a listening socket the parent opened (its port known before web starts).
const listen = process.env.LISTEN_FD ? { fd: Number(process.env.LISTEN_FD) }
  : { host: '127.0.0.1', port: Number(process.env.PORT ?? 8081) };
server.listen(listen, () => console.log(`web: listening on 127.0.0.1:${server.address().port}`));
