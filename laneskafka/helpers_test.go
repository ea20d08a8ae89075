package laneskafka_test

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// quiet is the logger of the tests; LANESKAFKA_DEBUG=1 shows the consumers'
// logs.
func quiet() *slog.Logger {
	if os.Getenv("LANESKAFKA_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// brokerEnv names the variable that points the tests at a real Kafka broker.
const brokerEnv = "LANES_TEST_KAFKA"

// brokers returns the seed brokers of the tests: kfake, in-process, unless
// LANES_TEST_KAFKA names a real broker (host:port[,...]).
func brokers(t testing.TB) []string {
	t.Helper()
	if v := os.Getenv(brokerEnv); v != "" {
		return splitComma(v)
	}
	return fakeBrokers(t)
}

// realBrokers returns the brokers of LANES_TEST_KAFKA, or skips the test.
func realBrokers(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(brokerEnv)
	if v == "" {
		t.Skipf("no Kafka broker process on this machine: set %s=host:port to run this test against one", brokerEnv)
	}
	return splitComma(v)
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// fakeBrokers starts a kfake cluster of one broker on 127.0.0.1:0, closed
// at cleanup. Its groups accept session timeouts from 100ms, so that a
// killed member leaves its group within a second.
func fakeBrokers(t testing.TB) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// groupOpts are the group settings of the tests: a dead member is noticed
// within a second.
func groupOpts() []kgo.Opt {
	return []kgo.Opt{kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond), kgo.MetadataMinAge(100 * time.Millisecond), kgo.RetryTimeout(5 * time.Second)}
}

// brokerKind names what the tests run on.
func brokerKind() string {
	if os.Getenv(brokerEnv) != "" {
		return "broker " + os.Getenv(brokerEnv)
	}
	return "kfake"
}
