// OpenTelemetry for the Node services, loaded before the service with `node --require ./otel.js`.
// The SDK's defaults do the rest: W3C trace context and baggage propagators (the lane travels as
// the baggage member "lane"), spans sent over OTLP/HTTP to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT with
// OTEL_EXPORTER_OTLP_TRACES_HEADERS, the service named by OTEL_SERVICE_NAME.
const { NodeSDK } = require('@opentelemetry/sdk-node');
const { getNodeAutoInstrumentations } = require('@opentelemetry/auto-instrumentations-node');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-http');
const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { propagation, SpanKind } = require('@opentelemetry/api');

// What lanes reads on a span: on a server span, lane.requested, the lane the request carries (the
// baggage member "lane"), and lane.instance.lane, the lane of the instance serving it (LANES_LANE;
// "" on the baseline). The service's other spans stay its own, without lanes' attributes.
const laneAttributes = {
  onStart(span, parent) {
    if (span.kind !== SpanKind.SERVER) return;
    span.setAttributes({
      'lane.requested': propagation.getBaggage(parent)?.getEntry('lane')?.value ?? '',
      'lane.instance.lane': process.env.LANES_LANE ?? '',
    });
  },
  onEnd() {},
  forceFlush: async () => {},
  shutdown: async () => {},
};

const sdk = new NodeSDK({
  spanProcessors: [laneAttributes, new BatchSpanProcessor(new OTLPTraceExporter())],
  instrumentations: [getNodeAutoInstrumentations({ '@opentelemetry/instrumentation-fs': { enabled: false } })],
});
sdk.start();
process.once('SIGTERM', () => sdk.shutdown().finally(() => process.exit(0)));
