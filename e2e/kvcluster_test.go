//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/e2e-framework/klient/decoder"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

func TestOperatorIsDeployed(t *testing.T) {
	f := features.New("the operator runs in-cluster from deploy/").
		Assess("its Deployment is Available with the image under test", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			var dep appsv1.Deployment
			if err := cfg.Client().Resources().Get(ctx, operatorDeployment, operatorNamespace, &dep); err != nil {
				t.Fatal(err)
			}
			if dep.Status.AvailableReplicas < 1 {
				t.Fatalf("available replicas = %d", dep.Status.AvailableReplicas)
			}
			var pods corev1.PodList
			if err := cfg.Client().Resources(operatorNamespace).List(ctx, &pods); err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				t.Logf("operator pod %s on %s: %s, image %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Spec.Containers[0].Image)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

type nsKey struct{}

// sampleCluster is deploy/samples/kvcluster.yaml in a fresh namespace: the manifest users apply.
func sampleCluster(t *testing.T, ns string) *kvv1.KVCluster {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "deploy", "samples", "kvcluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kvc := &kvv1.KVCluster{}
	if err := decoder.DecodeString(string(data), kvc); err != nil {
		t.Fatal(err)
	}
	kvc.Namespace = ns
	return kvc
}

func TestSampleClusterLifecycle(t *testing.T) {
	var kvc *kvv1.KVCluster
	f := features.New("a KVCluster from the sample becomes a real etcd cluster").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := envconf.RandomName("kvc-e2e", 16)
			if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			kvc = sampleCluster(t, ns)
			if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			return context.WithValue(ctx, nsKey{}, ns)
		}).
		Assess("it becomes Ready with 3 healthy voting members on the requested version", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			start := time.Now()
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			t.Logf("Ready after %s", time.Since(start).Round(time.Second))
			got := get(ctx, t, cfg, kvc)
			if got.Status.Phase != kvv1.PhaseReady || got.Status.ReadyPartitions != 3 || got.Status.CurrentVersion != kvc.Spec.Version {
				t.Fatalf("status = %+v", got.Status)
			}
			// The sample states no spec.tls: deploy/default's admission policy gave it TLS.
			if got.Spec.TLS == nil || got.Spec.TLS.Mode != kvv1.TLSOperator || !strings.HasPrefix(got.Status.ClientEndpoint, "https://") {
				t.Errorf("a new cluster is not TLS by default: spec.tls %+v, endpoint %s", got.Spec.TLS, got.Status.ClientEndpoint)
			}
			// Nor spec.networkPolicy: the other admission policy gave it one.
			np := &networkingv1.NetworkPolicy{}
			if got.Spec.NetworkPolicy == nil || got.Spec.NetworkPolicy.Mode != kvv1.NetworkPolicyManaged {
				t.Errorf("a new cluster has no NetworkPolicy by default: spec.networkPolicy %+v", got.Spec.NetworkPolicy)
			} else if err := cfg.Client().Resources().Get(ctx, kvc.Name+"-members", kvc.Namespace, np); err != nil {
				t.Errorf("the cluster's NetworkPolicy: %v", err)
			}
			leaders := 0
			for _, m := range got.Status.Members {
				if !m.Healthy || m.Learner || m.Version != kvc.Spec.Version {
					t.Errorf("member %+v is not a healthy voting member on %s", m, kvc.Spec.Version)
				}
				if m.DBSize == nil || m.DBSize.IsZero() || m.DBSizeInUse == nil || len(m.Alarms) > 0 {
					t.Errorf("member %s: database %v, in use %v, alarms %v; want its sizes and no alarm", m.Name, m.DBSize, m.DBSizeInUse, m.Alarms)
				}
				if m.Leader {
					leaders++
				}
			}
			if len(got.Status.Members) != 3 || leaders != 1 {
				t.Errorf("members = %+v, want 3 with one leader", got.Status.Members)
			}
			if sp := meta.FindStatusCondition(got.Status.Conditions, kvv1.ConditionSpacePressure); got.Status.BackendQuota == nil || sp == nil || sp.Status != metav1.ConditionFalse {
				t.Errorf("backendQuota %v, SpacePressure %+v; want the quota and no pressure on a new cluster", got.Status.BackendQuota, sp)
			}
			var pods corev1.PodList
			if err := cfg.Client().Resources(kvc.Namespace).List(ctx, &pods, resources.WithLabelSelector("app.kubernetes.io/instance="+kvc.Name)); err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				t.Logf("member pod %s: %s on %s, ip %s", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
			}
			return ctx
		}).
		Assess("kstatus (Flux's health) says Current", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if s := kstatusOf(t, get(ctx, t, cfg, kvc)); s != status.CurrentStatus {
				t.Errorf("kstatus = %s, want Current", s)
			}
			return ctx
		}).
		Assess("a key written through the client Service is read back", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			endpoint := get(ctx, t, cfg, kvc).Status.ClientEndpoint
			etcdctl(ctx, t, cfg, kvc, kvc.Name+"-0", "--endpoints="+endpoint, "put", "e2e/greeting", "hello from e2e")
			out := etcdctl(ctx, t, cfg, kvc, kvc.Name+"-2", "--endpoints="+endpoint, "get", "--print-value-only", "e2e/greeting")
			if strings.TrimSpace(out) != "hello from e2e" {
				t.Fatalf("read back %q", out)
			}
			return ctx
		}).
		Assess("deleting a member pod heals back to Ready with the same members and data", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			before := get(ctx, t, cfg, kvc)
			victim := &corev1.Pod{}
			if err := cfg.Client().Resources().Get(ctx, kvc.Name+"-1", kvc.Namespace, victim); err != nil {
				t.Fatal(err)
			}
			oldUID := victim.UID
			if err := cfg.Client().Resources().Delete(ctx, victim); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err := wait.For(conditions.New(cfg.Client().Resources()).ResourceMatch(victim, func(o k8s.Object) bool {
				p := o.(*corev1.Pod)
				return p.UID != oldUID && isPodReady(p)
			}), wait.WithTimeout(3*time.Minute), wait.WithInterval(time.Second))
			if err != nil {
				t.Fatalf("the deleted member's pod did not come back ready: %v", err)
			}
			waitReady(ctx, t, cfg, kvc, 3*time.Minute)
			t.Logf("healed in %s", time.Since(start).Round(time.Second))
			after := get(ctx, t, cfg, kvc)
			if ids(after) != ids(before) {
				t.Errorf("member IDs changed from %s to %s: the member must rejoin with its data, not as a new member", ids(before), ids(after))
			}
			out := etcdctl(ctx, t, cfg, kvc, kvc.Name+"-1", "get", "--consistency=s", "--print-value-only", "e2e/greeting")
			if strings.TrimSpace(out) != "hello from e2e" {
				t.Errorf("the restarted member serves %q for the key written before", out)
			}
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}}
			_ = cfg.Client().Resources().Delete(ctx, ns)
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}

func get(ctx context.Context, t testing.TB, cfg *envconf.Config, kvc *kvv1.KVCluster) *kvv1.KVCluster {
	t.Helper()
	out := &kvv1.KVCluster{}
	err := cfg.Client().Resources().Get(ctx, kvc.Name, kvc.Namespace, out)
	if err != nil && ctx.Err() != nil {
		// A wait's deadline passed during the read: read once more, so that the wait ends and
		// says what it waited for instead of this error.
		err = cfg.Client().Resources().Get(context.Background(), kvc.Name, kvc.Namespace, out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// editSpec changes the cluster as a user's edit does: read it, change it, write it; read again
// when the API server refuses the write for a newer version (the operator's status writes and
// finalizer come between a read and a write).
func editSpec(ctx context.Context, t testing.TB, cfg *envconf.Config, kvc *kvv1.KVCluster, change func(*kvv1.KVCluster)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		k := get(ctx, t, cfg, kvc)
		change(k)
		return cfg.Client().Resources().Update(ctx, k)
	}); err != nil {
		t.Fatal(err)
	}
}

// waitReady waits for what `kubectl wait --for=condition=Ready` waits for, for the current generation.
func waitReady(ctx context.Context, t testing.TB, cfg *envconf.Config, kvc *kvv1.KVCluster, timeout time.Duration) {
	t.Helper()
	err := wait.For(conditions.New(cfg.Client().Resources()).ResourceMatch(kvc, func(o k8s.Object) bool {
		k := o.(*kvv1.KVCluster)
		return k.Status.ObservedGeneration == k.Generation && meta.IsStatusConditionTrue(k.Status.Conditions, kvv1.ConditionReady)
	}), wait.WithTimeout(timeout), wait.WithInterval(2*time.Second))
	if err != nil {
		got := get(ctx, t, cfg, kvc)
		describe, _ := kubectl(cfg, "-n", kvc.Namespace, "describe", "pods")
		logs := operatorLogAbout(cfg, kvc.Namespace, timeout)
		t.Fatalf("KVCluster %s/%s not Ready within %s: %v\nstatus: %+v\npods:\n%s\noperator, about this namespace (last 40 lines):\n%s",
			kvc.Namespace, kvc.Name, timeout, err, got.Status, describe, strings.Join(logs[max(0, len(logs)-40):], "\n"))
	}
}

// operatorLogAbout are the lines the operator logged about namespace ns in the last while: other
// tests' clusters log too, as tests run alongside each other.
func operatorLogAbout(cfg *envconf.Config, ns string, while time.Duration) []string {
	logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment, "--since="+while.String())
	var about []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"namespace":"`+ns+`"`) {
			about = append(about, line)
		}
	}
	return about
}

// etcdctl runs etcdctl in a member's container; when the member serves TLS (new clusters have it
// by default) with the member's peer certificate, which allows client authentication too, unless
// args name a plaintext endpoint.
func etcdctl(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster, pod string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := []string{"etcdctl", "--dial-timeout=5s", "--command-timeout=10s"}
	var member corev1.Pod
	if err := cfg.Client().Resources().Get(ctx, pod, kvc.Namespace, &member); err != nil {
		t.Fatal(err)
	}
	named := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--endpoints=") })
	plaintext := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--endpoints=http://") })
	if listens, _ := specs.PodTransport(member.Spec); listens.ClientTLS && !plaintext {
		cmd = append(cmd, "--cacert=/etc/etcd/tls/peer/ca.crt", "--cert=/etc/etcd/tls/peer/tls.crt", "--key=/etc/etcd/tls/peer/tls.key")
		if !named { // --endpoints adds up when repeated: a second one would hide a broken endpoint
			cmd = append(cmd, "--endpoints=https://localhost:2379")
		}
	}
	cmd = append(cmd, args...)
	if err := cfg.Client().Resources().ExecInPod(ctx, kvc.Namespace, pod, "etcd", cmd, &stdout, &stderr); err != nil {
		t.Fatalf("exec %v in %s: %v: %s", cmd, pod, err, stderr.String())
	}
	return stdout.String()
}

func isPodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ids(kvc *kvv1.KVCluster) string {
	var out []string
	for _, m := range kvc.Status.Members {
		out = append(out, m.Name+"="+m.ID)
	}
	return strings.Join(out, ",")
}

func kstatusOf(t *testing.T, kvc *kvv1.KVCluster) status.Status {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kvc)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(kvv1.GroupVersion.String())
	u.SetKind("KVCluster")
	res, err := status.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	return res.Status
}
