//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/deploy/monitoring"
)

// prometheusConfig scrapes what deploy/monitoring's ServiceMonitor and PodMonitor select, the way
// the Prometheus Operator turns them into scrape configurations (target labels namespace and pod;
// honor_labels for the operator), and loads the shipped rules. Members are looked for in
// clusterNS only.
func prometheusConfig(clusterNS string) string {
	return fmt.Sprintf(`global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [/etc/prometheus/rules.yaml]
scrape_configs:
  - job_name: kvcluster-operator
    honor_labels: true
    scheme: https
    authorization: {credentials_file: /var/run/secrets/kubernetes.io/serviceaccount/token}
    tls_config: {insecure_skip_verify: true}
    kubernetes_sd_configs: [{role: endpointslice, namespaces: {names: [%s]}}]
    relabel_configs:
      - source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_name, __meta_kubernetes_service_label_app_kubernetes_io_component, __meta_kubernetes_endpointslice_port_name]
        regex: kvcluster-operator;metrics;https
        action: keep
      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
  - job_name: kvcluster-members
    kubernetes_sd_configs: [{role: pod, namespaces: {names: [%s]}}]
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name, __meta_kubernetes_pod_label_app_kubernetes_io_managed_by, __meta_kubernetes_pod_container_port_name]
        regex: kvcluster;kvcluster-operator;metrics
        action: keep
      - {source_labels: [__meta_kubernetes_pod_label_kvcluster_io_cluster], target_label: kvcluster}
      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
`, operatorNamespace, clusterNS)
}

// startPrometheus runs Prometheus in its own namespace ns with the shipped rules, allowed to
// discover targets and to read the operator's metrics (kvcluster-metrics-reader), scraping the
// members of clusterNS. Everything it creates is deleted when the test ends.
func startPrometheus(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, clusterNS string) {
	t.Helper()
	rules, err := monitoring.RuleFile()
	if err != nil {
		t.Fatal(err)
	}
	rbacName := "e2e-prometheus-" + ns
	objects := []k8s.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus", Namespace: ns}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: rbacName}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "services", "endpoints"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: rbacName},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: rbacName},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: rbacName + "-metrics"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kvcluster-metrics-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "prometheus", Namespace: ns},
			Data: map[string]string{"prometheus.yml": prometheusConfig(clusterNS), "rules.yaml": string(rules)}},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "prometheus", Namespace: ns},
			Spec: corev1.PodSpec{
				ServiceAccountName: "prometheus",
				SecurityContext:    &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532)},
				Containers: []corev1.Container{{
					Name: "prometheus", Image: prometheusImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Args:  []string{"--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", "--web.listen-address=:9090"},
					Ports: []corev1.ContainerPort{{ContainerPort: 9090}},
					VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/prometheus", ReadOnly: true},
						{Name: "data", MountPath: "/prometheus"}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
						Path: "/-/ready", Port: intstr.FromInt32(9090)}}, PeriodSeconds: 2},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				}},
				Volumes: []corev1.Volume{
					{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "prometheus"}}}},
					{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("256Mi"))}}},
				},
			},
		},
	}
	for _, o := range objects {
		if err := cfg.Client().Resources().Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
		if o.GetNamespace() == "" { // the namespace's go with it
			t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), o) })
		}
	}
	pod := objects[len(objects)-1].(*corev1.Pod)
	if err := wait.For(conditions.New(cfg.Client().Resources()).PodReady(pod), wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second)); err != nil {
		out, _ := kubectl(cfg, "-n", ns, "logs", "prometheus", "--tail=30")
		t.Fatalf("Prometheus not ready: %v\n%s", err, out)
	}
}

// prometheusAPI GETs one of Prometheus's HTTP API paths through the API server's pod proxy and
// decodes its data.
func prometheusAPI(ctx context.Context, cfg *envconf.Config, ns, path string, query url.Values, data any) error {
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		return err
	}
	params := map[string]string{}
	for k := range query {
		params[k] = query.Get(k)
	}
	raw, err := cs.CoreV1().Pods(ns).ProxyGet("http", "prometheus", "9090", path, params).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w: %s", path, err, raw)
	}
	var resp struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return err
	}
	if resp.Status != "success" {
		return fmt.Errorf("%s: %s", path, resp.Error)
	}
	return json.Unmarshal(resp.Data, data)
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alertsOf are the alerts the Prometheus of promNS holds (pending or firing) about clusterNS.
func alertsOf(ctx context.Context, cfg *envconf.Config, promNS, clusterNS string) ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := prometheusAPI(ctx, cfg, promNS, "/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(data.Alerts, func(a promAlert) bool { return a.Labels["namespace"] != clusterNS }), nil
}

// firing are the alerts of alerts that fire.
func firing(alerts []promAlert) []promAlert {
	return slices.DeleteFunc(slices.Clone(alerts), func(a promAlert) bool { return a.State != "firing" })
}

// queryValues runs an instant query and returns each series' value by the value of its label by.
func queryValues(ctx context.Context, cfg *envconf.Config, ns, query, by string) (map[string]string, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := prometheusAPI(ctx, cfg, ns, "/api/v1/query", url.Values{"query": {query}}, &data); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range data.Result {
		out[r.Metric[by]] = fmt.Sprint(r.Value[1])
	}
	return out, nil
}

// checkDashboard runs every query of the shipped dashboard, for kvc, on the Prometheus of promNS:
// each must be valid PromQL, and each must show kvc's data, but for those about backups (kvc has
// none). Rates need two scrapes of a new target: the check is retried for a while.
func checkDashboard(ctx context.Context, t *testing.T, cfg *envconf.Config, promNS string, kvc *kvv1.KVCluster) {
	t.Helper()
	queries, err := monitoring.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$namespace", kvc.Namespace, "$cluster", kvc.Name)
	var problems []string
	empty := 0
	_ = poll(ctx, 90*time.Second, func(ctx context.Context) (bool, error) {
		problems, empty = nil, 0
		for title, exprs := range queries {
			for _, expr := range exprs {
				var data struct {
					Result []json.RawMessage `json:"result"`
				}
				if err := prometheusAPI(ctx, cfg, promNS, "/api/v1/query", url.Values{"query": {vars.Replace(expr)}}, &data); err != nil {
					problems = append(problems, fmt.Sprintf("dashboard panel %q: %s: %v", title, expr, err))
					continue
				}
				if len(data.Result) == 0 {
					empty++
					if !strings.Contains(expr, "backup") {
						problems = append(problems, fmt.Sprintf("dashboard panel %q shows nothing for %s/%s: %s", title, kvc.Namespace, kvc.Name, expr))
					}
				}
			}
		}
		return len(problems) == 0, nil
	})
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("the dashboard's %d panels with queries all run; %d queries are empty, all about backups (the cluster has none)", len(queries), empty)
}

func describeAlerts(alerts []promAlert) string {
	var s []string
	for _, a := range alerts {
		s = append(s, fmt.Sprintf("%s{member=%q} %s", a.Labels["alertname"], a.Labels["member"], a.State))
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func TestAlertsOnARealCluster(t *testing.T) {
	var (
		kvc    *kvv1.KVCluster
		promNS string
		// cordoned are the nodes this test cordoned, to uncordon.
		cordoned []string
	)
	const down = "alerts-1"
	uncordon := func(cfg *envconf.Config) error {
		for len(cordoned) > 0 {
			if out, err := kubectl(cfg, "uncordon", cordoned[0]); err != nil {
				return fmt.Errorf("uncordon %s: %v: %s", cordoned[0], err, out)
			}
			cordoned = cordoned[1:]
		}
		return nil
	}
	f := features.New("the shipped alert rules, run by a real Prometheus on the shipped scrape configuration, fire when a member is down and resolve when it is back").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := envconf.RandomName("kvc-alerts", 16)
			promNS = ns + "-prom"
			for _, name := range []string{ns, promNS} {
				namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
				if err := cfg.Client().Resources().Create(ctx, namespace); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), namespace) })
			}
			// Prometheus runs in a namespace of its own, as usual: the cluster's NetworkPolicy
			// must admit it to the members' metrics port.
			kvc = &kvv1.KVCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "alerts", Namespace: ns},
				Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
					NetworkPolicy: &kvv1.NetworkPolicySpec{MetricsFrom: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
						MatchLabels: map[string]string{"kubernetes.io/metadata.name": promNS}}}}}},
			}
			if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			startPrometheus(ctx, t, cfg, promNS, ns)
			return ctx
		}).
		Assess("Prometheus scrapes the operator and every member, with the clusters' own namespace label, and nothing fires", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			ns := kvc.Namespace
			var healthy, leaders map[string]string
			var last error
			if err := poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
				healthy, last = queryValues(ctx, cfg, promNS, fmt.Sprintf(`kvcluster_member_healthy{namespace=%q,name="alerts"}`, ns), "member")
				if last != nil {
					return false, nil
				}
				leaders, last = queryValues(ctx, cfg, promNS, fmt.Sprintf(`etcd_server_has_leader{namespace=%q,kvcluster="alerts"}`, ns), "pod")
				return last == nil && len(healthy) == 3 && len(leaders) == 3 &&
					!slices.ContainsFunc(slices.Collect(maps.Values(healthy)), func(v string) bool { return v != "1" }) &&
					!slices.ContainsFunc(slices.Collect(maps.Values(leaders)), func(v string) bool { return v != "1" }), nil
			}); err != nil {
				targets := map[string]any{}
				_ = prometheusAPI(ctx, cfg, promNS, "/api/v1/targets", nil, &targets)
				t.Fatalf("Prometheus does not see the three members healthy through the operator and etcd: kvcluster_member_healthy %v, etcd_server_has_leader %v (%v); targets: %v",
					healthy, leaders, last, targets)
			}
			t.Logf("Prometheus reads kvcluster_member_healthy %v and etcd_server_has_leader %v", healthy, leaders)
			checkDashboard(ctx, t, cfg, promNS, kvc)
			// Not even pending (an alert with a long "for" could not have fired yet); the rules
			// are evaluated every 5 s, on what the last scrape said.
			var alerts []promAlert
			if err := poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
				var err error
				alerts, err = alertsOf(ctx, cfg, promNS, ns)
				return err == nil && len(alerts) == 0, nil
			}); err != nil {
				t.Errorf("alerts about a healthy cluster: %s", describeAlerts(alerts))
			}
			return ctx
		}).
		Assess("a member that cannot come back fires KVClusterMemberDown and KVClusterQuorumAtRisk, and nothing else", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := kvc.Namespace
			// No node takes a new pod: the StatefulSet's replacement stays Pending, as on a node
			// that is down or full. Only the nodes this test cordons are uncordoned, whatever
			// happens (e2e-framework skips Teardown after a failure with --fail-fast).
			t.Cleanup(func() { _ = uncordon(cfg) })
			var nodes corev1.NodeList
			if err := cfg.Client().Resources().List(ctx, &nodes); err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes.Items {
				if n.Spec.Unschedulable {
					continue
				}
				if out, err := kubectl(cfg, "cordon", n.Name); err != nil {
					t.Fatalf("cordon %s: %v\n%s", n.Name, err, out)
				}
				cordoned = append(cordoned, n.Name)
			}
			if err := cfg.Client().Resources().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: down, Namespace: ns}}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var alerts []promAlert
			fires := func(name, member string) bool {
				return slices.ContainsFunc(firing(alerts), func(a promAlert) bool {
					return a.Labels["alertname"] == name && (member == "" || a.Labels["member"] == member)
				})
			}
			if err := poll(ctx, 6*time.Minute, func(ctx context.Context) (bool, error) {
				var err error
				alerts, err = alertsOf(ctx, cfg, promNS, ns)
				return err == nil && fires("KVClusterMemberDown", down) && fires("KVClusterQuorumAtRisk", ""), nil
			}); err != nil {
				t.Fatalf("%s down for %s: alerts %s, want KVClusterMemberDown{member=%q} and KVClusterQuorumAtRisk firing",
					down, time.Since(start).Round(time.Second), describeAlerts(alerts), down)
			}
			t.Logf("%s down: %s %s after its pod was deleted", down, describeAlerts(alerts), time.Since(start).Round(time.Second))
			for _, a := range firing(alerts) {
				if name := a.Labels["alertname"]; name != "KVClusterMemberDown" && name != "KVClusterQuorumAtRisk" || a.Labels["member"] != "" && a.Labels["member"] != down {
					t.Errorf("%s{member=%q} fires too: one member of three down loses no leader and stalls nothing yet", name, a.Labels["member"])
				}
			}
			return ctx
		}).
		Assess("once the member is back, they resolve", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if err := uncordon(cfg); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			var alerts []promAlert
			// The alerts keep firing for 2 minutes after their condition clears.
			if err := poll(ctx, 5*time.Minute, func(ctx context.Context) (bool, error) {
				var err error
				alerts, err = alertsOf(ctx, cfg, promNS, kvc.Namespace)
				return err == nil && len(alerts) == 0, nil
			}); err != nil {
				t.Fatalf("alerts left %s after the member came back: %s", time.Since(start).Round(time.Second), describeAlerts(alerts))
			}
			t.Logf("every alert resolved %s after the nodes took pods again", time.Since(start).Round(time.Second))
			return ctx
		}).Feature()
	testenv.Test(t, f)
}
