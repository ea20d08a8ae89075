package controlplane

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestServiceVariablesDoNotMoveUp: a shell set up for a service
// (LANES_REGISTRY, LANES_ETCD_CA, ...) leaves lanes up on its embedded etcd;
// the old name of the external-etcd switch is refused with the new one.
func TestServiceVariablesDoNotMoveUp(t *testing.T) {
	c := Defaults()
	err := c.ApplyEnv(env(map[string]string{
		"LANES_REGISTRY": "etcd://10.0.0.1:2379", "LANES_ETCD_CA": "ca.pem",
		"LANES_ETCD_USERNAME": "svc", "LANES_ETCD_PASSWORD": "pw", "LANES_TOKEN": "t",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil || len(c.Etcd.Endpoints) != 0 {
		t.Errorf("service variables: %v, endpoints %v", err, c.Etcd.Endpoints)
	}
	c = Defaults()
	err = c.ApplyEnv(env(map[string]string{"LANES_ETCD_ENDPOINTS": "10.0.0.1:2379"}))
	var se *SettingError
	if !errors.As(err, &se) || se.Source != "LANES_ETCD_ENDPOINTS" || !strings.Contains(err.Error(), "renamed LANES_EXTERNAL_ETCD") {
		t.Errorf("old name: %v", err)
	}
	c = Defaults()
	if err := c.ApplyEnv(env(map[string]string{"LANES_EXTERNAL_ETCD": "10.0.0.1:2379,10.0.0.2:2379"})); err != nil || len(c.Etcd.Endpoints) != 2 {
		t.Errorf("LANES_EXTERNAL_ETCD: %v, %v", err, c.Etcd.Endpoints)
	}
	c = Defaults()
	c.Set("log-format", []string{"xml"})
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `--log-format: "xml": want text or json`) {
		t.Errorf("log format: %v", err)
	}
}

func TestServiceEnv(t *testing.T) {
	cfg := Defaults()
	if got := serviceEnv(cfg, EtcdInfo{Endpoints: []string{"http://127.0.0.1:7701"}, Embedded: true}); !reflect.DeepEqual(got, []string{"LANES_REGISTRY=etcd://127.0.0.1:7701"}) {
		t.Errorf("embedded: %q", got)
	}
	cfg.Etcd.Prefix = "/shop/"
	if got := serviceEnv(cfg, EtcdInfo{Endpoints: []string{"https://etcd-1:2379", "etcd-2:2379"}}); !reflect.DeepEqual(got, []string{"LANES_REGISTRY=etcd://etcd-1:2379,etcd-2:2379", "LANES_ETCD_PREFIX=/shop/"}) {
		t.Errorf("external: %q", got)
	}
}

// TestMQEnv: --mq-kafka and --mq-amqp (or LANES_MQ_KAFKA, LANES_MQ_AMQP)
// name the users' brokers, printed as LANES_KAFKA and LANES_AMQP with the
// AMQP credentials hidden; bad values are refused with the setting named.
func TestMQEnv(t *testing.T) {
	c := Defaults()
	if err := c.ApplyEnv(env(map[string]string{"LANES_MQ_KAFKA": "k1:9092, k2:9092"})); err != nil {
		t.Fatal(err)
	}
	c.Set("mq-amqp", []string{"amqp://app:s3cret@rabbit:5672/shop"})
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := mqEnv(c), []string{"LANES_KAFKA=k1:9092,k2:9092", "LANES_AMQP=amqp://xxxxx@rabbit:5672/shop"}; !reflect.DeepEqual(got, want) {
		t.Errorf("mqEnv = %q, want %q", got, want)
	}
	if got := mqEnv(Defaults()); len(got) != 0 {
		t.Errorf("without brokers: %q", got)
	}
	for _, tc := range []struct{ flag, value, want string }{
		{"mq-kafka", "k1:9092,k2", `--mq-kafka: "k1:9092,k2": broker 2 "k2": want host:port`},
		{"mq-amqp", "http://app:s3cret@rabbit:5672/", `--mq-amqp: "http://xxxxx@rabbit:5672/": want amqp://`},
	} {
		c := Defaults()
		c.Set(tc.flag, []string{tc.value})
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s: %v, want %q", tc.flag, tc.value, err, tc.want)
		}
	}
}
