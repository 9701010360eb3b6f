//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// The peer measured beside this operator: etcd-io/etcd-operator, deployed from the manifest
// `make bench-peers` renders from its source (ETCD_OPERATOR_SRC).
const (
	peerNamespace  = "etcd-operator-system"
	peerDeployment = "etcd-operator-controller-manager"
)

var etcdClusters = schema.GroupVersionResource{Group: "operator.etcd.io", Version: "v1alpha1", Resource: "etcdclusters"}

// readyPollInterval bounds how late a contender is seen Ready: every figure is up to this much
// longer than the truth, for every contender alike.
const readyPollInterval = 250 * time.Millisecond

// contender makes a 3-member etcd v3.7.3 cluster with 1 GiB volumes in namespace ns and returns
// once its user would call it Ready, with the moment its three pods were first seen Ready.
type contender struct {
	name  string
	ready func(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string) (podsReady time.Time)
}

// timing is one cluster's: from the create request to Ready, and from its pods being Ready to
// Ready (what the operator adds to what the pods need; their probes start every 5 s, so the first
// varies by up to that much from run to run, the second does not).
type timing struct{ total, afterPods time.Duration }

// BenchmarkReadyBesidePeers measures apply → Ready of a 3-member cluster (`make bench-peers`):
// for this operator (plaintext like the others, and with its default mutual TLS), for
// etcd-io/etcd-operator when ETCD_OPERATOR_MANIFEST names its install manifest, and the floor —
// a bare StatefulSet with the pod template, Services and membership ConfigMap this operator builds
// (same image, flags and probes), i.e. what the pods alone need. One iteration is one round of all
// contenders; the order rotates each round so the machine's noise falls on all of them alike.
// BENCH_PEERS_OUT names a Markdown file the table is written to.
func BenchmarkReadyBesidePeers(b *testing.B) {
	ctx := context.Background()
	cfg := testenv.EnvConf()
	contenders := []contender{
		{"bare StatefulSet (floor)", floorReady},
		{"kvcluster-operator", kvclusterReady(kvv1.TLSDisabled)},
		{"kvcluster-operator, mutual TLS", kvclusterReady(kvv1.TLSOperator)},
	}
	peerNote := "etcd-io/etcd-operator: not measured (ETCD_OPERATOR_MANIFEST not set; `make bench-peers ETCD_OPERATOR_SRC=<checkout>` sets it)"
	if manifest := os.Getenv("ETCD_OPERATOR_MANIFEST"); manifest != "" {
		deployPeer(b, cfg, manifest)
		contenders = append(contenders, contender{"etcd-io/etcd-operator " + os.Getenv("ETCD_OPERATOR_VERSION"), peerReady})
		peerNote = ""
	}
	samples := make(map[string][]timing)
	for round := range b.N {
		for i := range contenders {
			c := contenders[(round+i)%len(contenders)]
			ns := envconf.RandomName("kvc-peers", 16)
			if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			podsReady := c.ready(ctx, b, cfg, ns)
			samples[c.name] = append(samples[c.name], timing{total: time.Since(start), afterPods: time.Since(podsReady)})
			deleteNamespace(ctx, b, cfg, ns) // gone before the next one starts: 2 cores are shared
		}
	}
	b.StopTimer()
	table := peersTable(contenders, samples, peerNote)
	b.Log("\n" + table)
	for _, c := range contenders {
		b.ReportMetric(median(samples[c.name], total).Seconds(), metricName(c.name)+"-median-s")
	}
	b.ReportMetric(0, "ns/op")
	if out := os.Getenv("BENCH_PEERS_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(peersReport(table, b.N)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// floorReady applies what this operator would apply for a cluster, but as plain objects no
// controller acts on, and waits for the StatefulSet's three pods to be Ready.
func floorReady(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string) time.Time {
	kvc := peerBenchCluster(ns, "floor", kvv1.TLSDisabled)
	cs := clientset(b, cfg)
	apply := metav1.ApplyOptions{FieldManager: "bench-peers", Force: true}
	cm := specs.MembershipConfigMap(kvc, specs.NewClusterMembership(kvc), "")
	svc := specs.PeerService(kvc, "")
	sts := specs.StatefulSet(kvc, specs.MemberSet{Images: specs.Images{EtcdRepository: specs.DefaultEtcdRepository}, Replicas: kvc.Spec.Partitions, Bootstrapping: true})
	// Nothing owns them: the KVCluster they are built from never exists.
	cm.OwnerReferences, svc.OwnerReferences, sts.OwnerReferences = nil, nil, nil
	if _, err := cs.CoreV1().ConfigMaps(ns).Apply(ctx, cm, apply); err != nil {
		b.Fatal(err)
	}
	if _, err := cs.CoreV1().Services(ns).Apply(ctx, svc, apply); err != nil {
		b.Fatal(err)
	}
	if _, err := cs.AppsV1().StatefulSets(ns).Apply(ctx, sts, apply); err != nil {
		b.Fatal(err)
	}
	return waitFor(ctx, b, cfg, ns, "StatefulSet floor: 3 pods Ready", func(ctx context.Context) (bool, error) {
		got, err := cs.AppsV1().StatefulSets(ns).Get(ctx, "floor", metav1.GetOptions{})
		return err == nil && got.Status.ReadyReplicas == 3, err
	})
}

func kvclusterReady(mode kvv1.TLSMode) func(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string) time.Time {
	return func(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string) time.Time {
		kvc := peerBenchCluster(ns, "ours", mode)
		if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
			b.Fatal(err)
		}
		return waitFor(ctx, b, cfg, ns, "KVCluster ours: condition Ready", func(ctx context.Context) (bool, error) {
			got := &kvv1.KVCluster{}
			if err := cfg.Client().Resources().Get(ctx, kvc.Name, ns, got); err != nil {
				return false, err
			}
			return meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady), nil
		})
	}
}

func peerBenchCluster(ns, name string, mode kvv1.TLSMode) *kvv1.KVCluster {
	return &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: kvv1.KVClusterSpec{
		Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("1Gi")}, TLS: &kvv1.TLSSpec{Mode: mode}}}
}

// peerReady creates an EtcdCluster as etcd-io/etcd-operator's sample does (plaintext, 1 GiB
// volumes) and waits until it reports three ready members, Available (a quorum of its members is
// healthy: true once its first member runs, as it adds members one at a time), not Progressing
// (no membership change under way) and not Degraded (no unhealthy member).
func peerReady(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string) time.Time {
	dc, err := dynamic.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	ec := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "operator.etcd.io/v1alpha1", "kind": "EtcdCluster",
		"metadata": map[string]any{"name": "peer", "namespace": ns},
		"spec": map[string]any{"size": int64(3), "version": "v3.7.3",
			"storageSpec": map[string]any{"volumeSizeRequest": "1Gi"}},
	}}
	if _, err := dc.Resource(etcdClusters).Namespace(ns).Create(ctx, ec, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	return waitFor(ctx, b, cfg, ns, "EtcdCluster peer: 3 ready members, Available, not Progressing, not Degraded", func(ctx context.Context) (bool, error) {
		got, err := dc.Resource(etcdClusters).Namespace(ns).Get(ctx, "peer", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedInt64(got.Object, "status", "readyReplicas")
		members, _, _ := unstructured.NestedInt64(got.Object, "status", "memberCount")
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		want := map[string]string{"Available": "True", "Progressing": "False", "Degraded": "False"}
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && want[fmt.Sprint(m["type"])] == m["status"] {
				delete(want, fmt.Sprint(m["type"]))
			}
		}
		return ready == 3 && members == 3 && len(want) == 0, nil
	})
}

// deployPeer installs etcd-io/etcd-operator and waits for it to run; it is removed at the end.
func deployPeer(b *testing.B, cfg *envconf.Config, manifest string) {
	if out, err := kubectl(cfg, "apply", "--server-side", "-f", manifest); err != nil {
		b.Fatalf("install etcd-io/etcd-operator from %s: %v\n%s", manifest, err, out)
	}
	b.Cleanup(func() { _, _ = kubectl(cfg, "delete", "--ignore-not-found", "--wait", "-f", manifest) })
	if out, err := kubectl(cfg, "-n", peerNamespace, "rollout", "status", "deploy/"+peerDeployment, "--timeout=3m"); err != nil {
		describe, _ := kubectl(cfg, "-n", peerNamespace, "describe", "pods")
		b.Fatalf("etcd-io/etcd-operator did not start: %v\n%s\n%s", err, out, describe)
	}
}

// waitFor polls done every readyPollInterval for up to 5 minutes and returns when it first saw the
// namespace's three pods Ready; on timeout it fails with the namespace's pods and events, which say
// where the time went.
func waitFor(ctx context.Context, b *testing.B, cfg *envconf.Config, ns, what string, done func(context.Context) (bool, error)) time.Time {
	cs := clientset(b, cfg)
	var podsReady time.Time
	err := wait.PollUntilContextTimeout(ctx, readyPollInterval, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if podsReady.IsZero() {
			pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			ready := 0
			for i := range pods.Items {
				if isPodReady(&pods.Items[i]) {
					ready++
				}
			}
			if ready >= 3 {
				podsReady = time.Now()
			}
		}
		ok, err := done(ctx)
		if apierrors.IsNotFound(err) {
			return false, nil // not made yet
		}
		return ok && !podsReady.IsZero(), err
	})
	if err != nil {
		pods, _ := kubectl(cfg, "-n", ns, "get", "pods,pvc", "-o", "wide")
		events, _ := kubectl(cfg, "-n", ns, "get", "events", "--sort-by=.lastTimestamp")
		b.Fatalf("%s: %v\n%s\n%s", what, err, pods, events)
	}
	return podsReady
}

func deleteNamespace(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string) {
	cs := clientset(b, cfg)
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		b.Fatalf("namespace %s not deleted: %v", ns, err)
	}
}

func clientset(b *testing.B, cfg *envconf.Config) *kubernetes.Clientset {
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	return cs
}

func total(t timing) time.Duration     { return t.total }
func afterPods(t timing) time.Duration { return t.afterPods }

// spread is the min, median and max of one of the timings.
func spread(ts []timing, of func(timing) time.Duration) (lo, mid, hi time.Duration) {
	var s []time.Duration
	for _, t := range ts {
		s = append(s, of(t))
	}
	slices.Sort(s)
	return s[0], s[len(s)/2], s[len(s)-1]
}

func median(ts []timing, of func(timing) time.Duration) time.Duration {
	_, mid, _ := spread(ts, of)
	return mid
}

// metricName turns a contender's name into a benchmark unit (no spaces).
func metricName(name string) string {
	return strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "", "/", "-").Replace(name)
}

// peersTable is one row per contender: min, median and max seconds from apply to Ready and from
// the pods being Ready to the cluster being Ready, and the median against the floor's median.
func peersTable(contenders []contender, samples map[string][]timing, note string) string {
	floor := median(samples[contenders[0].name], total)
	var sb strings.Builder
	sb.WriteString("| 3 members, etcd v3.7.3, 1 GiB volumes | runs | apply → Ready min / median / max | after its pods were Ready min / median / max | median ÷ floor's |\n")
	sb.WriteString("|---|---:|---|---|---:|\n")
	for _, c := range contenders {
		s := samples[c.name]
		lo, mid, hi := spread(s, total)
		plo, pmid, phi := spread(s, afterPods)
		fmt.Fprintf(&sb, "| %s | %d | %.1f s / %.1f s / %.1f s | %.1f s / %.1f s / %.1f s | %.2f× |\n", c.name, len(s),
			lo.Seconds(), mid.Seconds(), hi.Seconds(), plo.Seconds(), pmid.Seconds(), phi.Seconds(), mid.Seconds()/floor.Seconds())
	}
	if note != "" {
		sb.WriteString("\n" + note + "\n")
	}
	return sb.String()
}

func peersReport(table string, rounds int) string {
	return fmt.Sprintf(`# apply → Ready beside the peers

Generated by `+"`make bench-peers`"+` on %s (%s, %d CPUs): %d rounds on the project's local
cluster (real pods, a real kubelet and containerd), each round every contender once, in an order
that rotates per round (after a warm-up round); each cluster's namespace is deleted before the
next one starts. Times are from the create request to the first poll (every %s) that sees the
cluster Ready: the floor's StatefulSet with 3 ready pods, a KVCluster's Ready condition, an
EtcdCluster with 3 ready members, Available, not Progressing and not Degraded (its Available alone
is true as soon as its first member runs: it adds members one at a time). "After its pods were
Ready" starts at the first poll that saw the cluster's three pods Ready: what the operator adds.
The pods' probes run every 5 s, so apply → Ready varies by up to that much from run to run.

The floor is a bare StatefulSet with the pod template, Services and membership ConfigMap this
operator builds (the same image, flags and probes): what the three etcd pods alone need.
Goals: this operator ≤ 1.2× the floor, and faster than the peer.

%s`, time.Now().UTC().Format("2006-01-02"), runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), rounds, readyPollInterval, table)
}
