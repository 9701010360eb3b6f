package monitoring

import (
	"os"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
	"github.com/kvcluster/kvcluster-operator/deploy"
)

// monitor is what the ServiceMonitor and PodMonitor say about their targets.
type monitor struct {
	Spec struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port        string `json:"port"`
			Scheme      string `json:"scheme"`
			HonorLabels bool   `json:"honorLabels"`
		} `json:"endpoints"`
		PodMetricsEndpoints []struct {
			Port string `json:"port"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

func read(t *testing.T, path string, into any) {
	t.Helper()
	if err := yaml.Unmarshal(mustRead(t, path), into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func selects(sel metav1.LabelSelector, labels map[string]string) bool {
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return len(sel.MatchExpressions) == 0
}

// The monitors find what the operator and its manifests create: the ServiceMonitor the metrics
// Service (its labels, its port name, HTTPS, the series' own namespace kept); the PodMonitor the
// members' pods and their metrics port. The e2e scrape configuration is the same by hand.
func TestMonitorsSelectWhatTheOperatorCreates(t *testing.T) {
	var sm monitor
	read(t, "operator-servicemonitor.yaml", &sm)
	var svc corev1.Service
	read(t, "../manager/metrics_service.yaml", &svc)
	if !selects(sm.Spec.Selector, svc.Labels) {
		t.Errorf("the ServiceMonitor's selector %v does not select the Service's labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || len(svc.Spec.Ports) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
		t.Fatalf("the ServiceMonitor's endpoints %+v do not name the Service's port %+v", sm.Spec.Endpoints, svc.Spec.Ports)
	}
	if e := sm.Spec.Endpoints[0]; e.Scheme != "https" || !e.HonorLabels {
		t.Errorf("the ServiceMonitor scrapes with scheme %q, honorLabels %t: want https, and the series' own namespace kept", e.Scheme, e.HonorLabels)
	}
	// The Service's target port is a port of the operator's container, the one it serves on.
	d, c, err := deploy.Manager(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !selects(metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, d.Spec.Template.Labels) {
		t.Errorf("the metrics Service's selector %v does not select the operator's pods %v", svc.Spec.Selector, d.Spec.Template.Labels)
	}
	var served bool
	for _, p := range c.Ports {
		if p.Name == svc.Spec.Ports[0].TargetPort.StrVal && slices.Contains(c.Args, "--metrics-bind-address=:"+strconv.Itoa(int(p.ContainerPort))) {
			served = true
		}
	}
	if !served {
		t.Errorf("the Service's target port %q is not the port the operator's --metrics-bind-address serves on", svc.Spec.Ports[0].TargetPort.StrVal)
	}

	var pm monitor
	read(t, "members-podmonitor.yaml", &pm)
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", UID: "u1"}, Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3}}
	pod := specs.StatefulSet(kvc, specs.MemberSet{Replicas: 3}).Spec.Template
	if !selects(pm.Spec.Selector, pod.Labels) {
		t.Errorf("the PodMonitor's selector %v does not select the members' pods %v", pm.Spec.Selector.MatchLabels, pod.Labels)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("the PodMonitor has %d endpoints, want 1", len(pm.Spec.PodMetricsEndpoints))
	}
	var named bool
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			named = named || *p.Name == pm.Spec.PodMetricsEndpoints[0].Port && *p.ContainerPort == specs.MetricsPort
		}
	}
	if !named {
		t.Errorf("no member container port is named %q on the metrics port %d", pm.Spec.PodMetricsEndpoints[0].Port, specs.MetricsPort)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
