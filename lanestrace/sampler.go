package lanestrace

import (
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lane"
)

// Sampler returns the sampler of lanes: at the entry (a span with no parent), every lane request
// is sampled, and a baseline request with probability baselineRatio (0 to 1); a span with a
// parent follows its parent's decision, so the choice made at the entry is honoured on every hop
// downstream.
func Sampler(baselineRatio float64) sdktrace.Sampler {
	return sdktrace.ParentBased(rootSampler{baseline: sdktrace.TraceIDRatioBased(baselineRatio), ratio: baselineRatio})
}

type rootSampler struct {
	baseline sdktrace.Sampler
	ratio    float64
}

func (s rootSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if lane.FromContext(p.ParentContext) != "" {
		return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	}
	return s.baseline.ShouldSample(p)
}

func (s rootSampler) Description() string {
	return fmt.Sprintf("LanesSampler{lane requests: always, baseline: %g}", s.ratio)
}
