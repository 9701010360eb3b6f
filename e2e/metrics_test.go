//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
	"github.com/kvcluster/kvcluster-operator/deploy/monitoring"
)

// portForward forwards a free loopback port to port of target (svc/NAME or pod/NAME) in
// namespace ns, through the API server, until stop is called.
func portForward(cfg *envconf.Config, ns, target string, port int) (addr string, stop func(), err error) {
	cmd := exec.Command(envOr("KUBECTL", "kubectl"), "--kubeconfig", cfg.KubeconfigFile(), "-n", ns, "port-forward", target, fmt.Sprintf(":%d", port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`127\.0\.0\.1:(\d+)`).FindStringSubmatch(line)
	if err != nil || m == nil {
		stop()
		return "", nil, fmt.Errorf("port-forward to %s/%s:%d: %q %v", ns, target, port, line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return "127.0.0.1:" + m[1], stop, nil
}

// scraperToken is a token of a new ServiceAccount in ns; bound, the account holds the
// ClusterRole kvcluster-metrics-reader (deploy/rbac), as a Prometheus would, and the API server
// says so before it returns (the operator's authorizer keeps a refusal for 30 seconds).
func scraperToken(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, name string, bound bool) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().ServiceAccounts(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if bound {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kvcluster-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
		})
		user := "system:serviceaccount:" + ns + ":" + name
		if err := poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
			sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}, metav1.CreateOptions{})
			return err == nil && sar.Status.Allowed, nil
		}); err != nil {
			t.Fatalf("the API server never allowed %s to get /metrics", user)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// scrape GETs url with the bearer token ("" for none) and parses a 200's exposition.
func scrape(ctx context.Context, url, token string) (int, map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The operator's certificate is self-signed by default (--metrics-cert-dir gives another).
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil, nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	return resp.StatusCode, families, err
}

// operatorMetrics scrapes the elected operator's metrics endpoint over HTTPS, as a scraper
// holding token, through a port-forward to its pod (the holder of the leader election lease).
func operatorMetrics(ctx context.Context, t *testing.T, cfg *envconf.Config, token string) (int, map[string]*dto.MetricFamily, error) {
	t.Helper()
	var lease coordinationv1.Lease
	if err := cfg.Client().Resources().Get(ctx, specs.LeaderElectionID, operatorNamespace, &lease); err != nil {
		return 0, nil, fmt.Errorf("the operator's lease: %w", err)
	}
	// The holder's identity is its pod's name (its host name), then "_" and a UID; none while a
	// stopped operator has let the Lease go and the next has not taken it yet.
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if holder == "" {
		return 0, nil, errors.New("the operator's lease has no holder: no operator leads yet")
	}
	pod, _, _ := strings.Cut(holder, "_")
	addr, stop, err := portForward(cfg, operatorNamespace, "pod/"+pod, 8443)
	if err != nil {
		return 0, nil, err
	}
	defer stop()
	return scrape(ctx, "https://"+addr+"/metrics", token)
}

// operatorReader is a scraper of the operator: a new ServiceAccount of ns holding the ClusterRole
// kvcluster-metrics-reader, as a Prometheus would. Its first scrape is awaited (a new leader
// after a restart holds the lease within seconds).
func operatorReader(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) func(context.Context) (map[string]*dto.MetricFamily, error) {
	t.Helper()
	token := scraperToken(ctx, t, cfg, ns, "metrics-reader", true)
	read := func(ctx context.Context) (map[string]*dto.MetricFamily, error) {
		code, families, err := operatorMetrics(ctx, t, cfg, token)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("HTTP %d", code)
		}
		return families, err
	}
	var last error
	if err := poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		_, last = read(ctx)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("a scraper holding kvcluster-metrics-reader was not answered: %v", last)
	}
	return read
}

// sample is the value of the series of family name whose labels include want, and whether
// there is one.
func sample(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := families[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetUntyped() != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// checkOperatorMetrics scrapes the operator as a stranger (no token: 401; a token without the
// metrics reader role: 403) and as a scraper holding the role, and compares what the latter
// reads of kvc with the cluster's status: what a platform team's dashboards and alerts would see.
// The operator reads its cache, which follows the API server within moments: the comparison is
// retried for a while before its differences are reported.
func checkOperatorMetrics(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster) {
	t.Helper()
	if code, _, err := operatorMetrics(ctx, t, cfg, ""); code != http.StatusUnauthorized {
		t.Errorf("a scrape without a token got HTTP %d (%v), want 401", code, err)
	}
	if code, _, err := operatorMetrics(ctx, t, cfg, scraperToken(ctx, t, cfg, kvc.Namespace, "stranger", false)); code != http.StatusForbidden {
		t.Errorf("a scrape by an account without kvcluster-metrics-reader got HTTP %d (%v), want 403", code, err)
	}
	read := operatorReader(ctx, t, cfg, kvc.Namespace)
	var diffs, seen []string
	_ = poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		families, err := read(ctx)
		if err != nil {
			diffs = []string{"scrape: " + err.Error()}
			return false, nil
		}
		got := &kvv1.KVCluster{}
		if err := cfg.Client().Resources().Get(ctx, kvc.Name, kvc.Namespace, got); err != nil {
			diffs = []string{"get the KVCluster: " + err.Error()}
			return false, nil
		}
		diffs, seen = metricsAgainstStatus(families, got)
		return len(diffs) == 0, nil
	})
	for _, d := range diffs {
		t.Error(d)
	}
	t.Logf("the operator's metrics of %s/%s: %s", kvc.Namespace, kvc.Name, strings.Join(seen, "; "))
}

// metricsAgainstStatus compares the operator's metrics of a Ready cluster with its status.
func metricsAgainstStatus(families map[string]*dto.MetricFamily, got *kvv1.KVCluster) (diffs, seen []string) {
	id := map[string]string{"namespace": got.Namespace, "name": got.Name}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for a, b := range id {
			m[a] = b
		}
		return m
	}
	type series struct {
		name   string
		labels map[string]string
		value  float64
	}
	want := []series{
		{"kvcluster_phase", with("phase", string(got.Status.Phase)), 1},
		{"kvcluster_members_desired", id, float64(got.Spec.Partitions)},
		{"kvcluster_members_ready", id, float64(got.Status.ReadyPartitions)},
		{"kvcluster_members_voting", id, float64(got.Spec.Partitions)},
		{"kvcluster_members_voting_healthy", id, float64(got.Spec.Partitions)},
		{"kvcluster_leader_present", id, 1},
		{"kvcluster_info", with("current_version", got.Status.CurrentVersion), 1},
		{"kvcluster_condition", with("type", "Ready"), 1},
		{"kvcluster_backup_interval_seconds", id, 60},
	}
	if got.Status.LastBackupTime != nil && got.Status.LastBackup != nil {
		want = append(want,
			series{"kvcluster_last_backup_timestamp_seconds", id, float64(got.Status.LastBackupTime.Unix())},
			series{"kvcluster_last_backup_succeeded", id, 1},
			series{"kvcluster_last_backup_size_bytes", id, float64(got.Status.LastBackup.Size)})
	} else {
		diffs = append(diffs, fmt.Sprintf("the cluster has no backup to compare yet: %+v", got.Status))
	}
	for _, m := range got.Status.Members {
		want = append(want, series{"kvcluster_member_healthy", with("member", m.Name), 1})
	}
	for _, c := range got.Status.Certificates {
		want = append(want, series{"kvcluster_certificate_expiry_timestamp_seconds", with("certificate", c.Name), float64(c.NotAfter.Unix())})
	}
	for _, w := range want {
		v, ok := sample(families, w.name, w.labels)
		if !ok || v != w.value {
			diffs = append(diffs, fmt.Sprintf("%s%s = %v (present: %t), want %v from the status", w.name, labelString(w.labels), v, ok, w.value))
		}
		seen = append(seen, fmt.Sprintf("%s%s %v", w.name, labelString(w.labels), v))
	}
	return diffs, seen
}

// labelString writes labels as PromQL does: {a="1",b="2"}.
func labelString(labels map[string]string) string {
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		pairs = append(pairs, fmt.Sprintf("%s=%q", k, labels[k]))
	}
	return "{" + strings.Join(pairs, ",") + "}"
}

// checkMemberMetrics scrapes a member's own metrics port, as the shipped PodMonitor does: etcd
// reports a leader.
func checkMemberMetrics(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, member string) {
	t.Helper()
	addr, stop, err := portForward(cfg, ns, "pod/"+member, 2381)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	code, families, err := scrape(ctx, "http://"+addr+"/metrics", "")
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape member %s: HTTP %d, %v", member, code, err)
	}
	if v, ok := sample(families, "etcd_server_has_leader", nil); !ok || v != 1 {
		t.Errorf("member %s: etcd_server_has_leader = %v (present: %t), want 1", member, v, ok)
	}
	// The dashboard reads these of every member.
	for _, name := range regexp.MustCompile(`\betcd_[a-z0-9_]+`).FindAllString(string(monitoring.Dashboard), -1) {
		if _, ok := families[strings.TrimSuffix(name, "_bucket")]; !ok {
			t.Errorf("the dashboard reads %s, which member %s does not serve", name, member)
		}
	}
	t.Logf("member %s serves %d metric families", member, len(families))
}
