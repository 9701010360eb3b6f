//go:build e2e

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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

// benchClients are made once, outside the timed part of a round.
type benchClients struct {
	cfg *envconf.Config
	cs  *kubernetes.Clientset
	dyn *dynamic.DynamicClient
}

// contender makes a 3-member etcd v3.7.3 cluster with 1 GiB volumes in namespace ns, waits until
// its user would call it Ready, and returns when its three pods were first seen Ready.
type contender struct {
	name string
	// probed: its pods' readiness probe asks etcd, so "its pods were Ready" means etcd serves. The
	// peer's pods have no probe: they are Ready when the container starts.
	probed        bool
	createAndWait func(ctx context.Context, b *testing.B, c benchClients, ns string) (podsReady time.Time)
}

// timing is one cluster's: from the create request to Ready, and from its pods being Ready to
// Ready (what the operator adds to what the pods need; the pods' probes run every 5 s, so the
// first varies by up to that much from run to run, the second is free of that).
type timing struct{ total, afterPods time.Duration }

// BenchmarkReadyBesidePeers measures apply → Ready of a 3-member cluster (`make bench-peers`):
// the floor — a bare StatefulSet with the pod template, peer Service and membership ConfigMap
// this operator builds (same image, flags and probes), i.e. what the pods alone need —, this
// operator plaintext and without a NetworkPolicy (like the others) and with its defaults (mutual
// TLS, a NetworkPolicy), and etcd-io/etcd-operator when ETCD_OPERATOR_MANIFEST names its install
// manifest. One iteration is one round of all contenders, in a random order (its seed is logged)
// so that what one leaves behind does not always fall on the same other. Go runs a benchmark once
// with b.N=1 before the measured run: that first call is the warm-up round.
// BENCH_PEERS_OUT names a Markdown file the table is written to.
func BenchmarkReadyBesidePeers(b *testing.B) {
	ctx := context.Background()
	cfg := testenv.EnvConf()
	c := benchClients{cfg: cfg}
	var err error
	if c.cs, err = kubernetes.NewForConfig(cfg.Client().RESTConfig()); err != nil {
		b.Fatal(err)
	}
	if c.dyn, err = dynamic.NewForConfig(cfg.Client().RESTConfig()); err != nil {
		b.Fatal(err)
	}
	contenders := []contender{
		{"bare StatefulSet (floor)", true, createFloor},
		{"kvcluster-operator, plaintext, no NetworkPolicy", true, createKVCluster(kvv1.TLSDisabled, kvv1.NetworkPolicyDisabled)},
		{"kvcluster-operator, defaults (mutual TLS, NetworkPolicy)", true, createKVCluster(kvv1.TLSOperator, kvv1.NetworkPolicyManaged)},
	}
	peerNote := "etcd-io/etcd-operator: not measured (ETCD_OPERATOR_MANIFEST not set; `make bench-peers ETCD_OPERATOR_SRC=<checkout>` sets it)"
	if manifest := os.Getenv("ETCD_OPERATOR_MANIFEST"); manifest != "" {
		deployPeer(b, cfg, manifest)
		name := "etcd-io/etcd-operator " + cmp.Or(os.Getenv("ETCD_OPERATOR_VERSION"), "(version unknown)")
		contenders = append(contenders, contender{name, false, createEtcdCluster})
		peerNote = "¹ etcd-io/etcd-operator's pods have no readiness probe: they are Ready as soon as etcd's container starts, so this includes etcd's start."
	}
	seed := time.Now().UnixNano()
	b.Logf("order seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	samples := make(map[string][]timing)
	for range b.N {
		for _, i := range rng.Perm(len(contenders)) {
			k := contenders[i]
			samples[k.name] = append(samples[k.name], timeOne(ctx, b, c, k))
		}
	}
	b.StopTimer()
	table := peersTable(contenders, samples, peerNote)
	b.Log("\n" + table)
	for _, k := range contenders {
		b.ReportMetric(median(samples[k.name], total).Seconds(), metricName(k.name)+"-median-s")
	}
	b.ReportMetric(0, "ns/op")
	if out := os.Getenv("BENCH_PEERS_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(peersReport(table, b.N)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// timeOne times one contender in a namespace of its own, which is gone with its volumes before the
// next one starts (2 cores are shared).
func timeOne(ctx context.Context, b *testing.B, c benchClients, k contender) timing {
	ns := envconf.RandomName("kvc-peers", 16)
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// A round that fails leaves nothing behind on a cluster that outlives the benchmark.
	b.Cleanup(func() { _ = c.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	// Pods cannot be created before the namespace's ServiceAccount exists: not the contender's time.
	if err := poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		b.Fatalf("ServiceAccount default in %s: %v", ns, err)
	}
	start := time.Now()
	podsReady := k.createAndWait(ctx, b, c, ns)
	t := timing{total: time.Since(start), afterPods: time.Since(podsReady)}
	deleteNamespace(ctx, b, c, ns)
	return t
}

// createFloor applies what this operator would apply for a cluster, but as plain objects no
// controller acts on, and waits for the StatefulSet's three pods to be Ready.
func createFloor(ctx context.Context, b *testing.B, c benchClients, ns string) time.Time {
	kvc := peerBenchCluster(ns, "floor", kvv1.TLSDisabled, kvv1.NetworkPolicyDisabled)
	apply := metav1.ApplyOptions{FieldManager: "bench-peers", Force: true}
	cm := specs.MembershipConfigMap(kvc, specs.NewClusterMembership(kvc), "")
	svc := specs.PeerService(kvc, "")
	sts := specs.StatefulSet(kvc, specs.MemberSet{Images: specs.Images{EtcdRepository: specs.DefaultEtcdRepository}, Replicas: kvc.Spec.Partitions, Bootstrapping: true})
	// Nothing owns them: the KVCluster they are built from never exists.
	cm.OwnerReferences, svc.OwnerReferences, sts.OwnerReferences = nil, nil, nil
	if _, err := c.cs.CoreV1().ConfigMaps(ns).Apply(ctx, cm, apply); err != nil {
		b.Fatal(err)
	}
	if _, err := c.cs.CoreV1().Services(ns).Apply(ctx, svc, apply); err != nil {
		b.Fatal(err)
	}
	if _, err := c.cs.AppsV1().StatefulSets(ns).Apply(ctx, sts, apply); err != nil {
		b.Fatal(err)
	}
	return waitFor(ctx, b, c, ns, "StatefulSet floor: 3 pods Ready", func(ctx context.Context) (bool, error) {
		got, err := c.cs.AppsV1().StatefulSets(ns).Get(ctx, "floor", metav1.GetOptions{})
		return err == nil && got.Status.ReadyReplicas == 3, err
	})
}

func createKVCluster(tls kvv1.TLSMode, policy kvv1.NetworkPolicyMode) func(ctx context.Context, b *testing.B, c benchClients, ns string) time.Time {
	return func(ctx context.Context, b *testing.B, c benchClients, ns string) time.Time {
		kvc := peerBenchCluster(ns, "ours", tls, policy)
		if err := c.cfg.Client().Resources().Create(ctx, kvc); err != nil {
			b.Fatal(err)
		}
		return waitFor(ctx, b, c, ns, "KVCluster ours: condition Ready", func(ctx context.Context) (bool, error) {
			got := &kvv1.KVCluster{}
			if err := c.cfg.Client().Resources().Get(ctx, kvc.Name, ns, got); err != nil {
				return false, err
			}
			return meta.IsStatusConditionTrue(got.Status.Conditions, kvv1.ConditionReady), nil
		})
	}
}

func peerBenchCluster(ns, name string, tls kvv1.TLSMode, policy kvv1.NetworkPolicyMode) *kvv1.KVCluster {
	return &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: kvv1.KVClusterSpec{
		Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("1Gi")},
		TLS: &kvv1.TLSSpec{Mode: tls}, NetworkPolicy: &kvv1.NetworkPolicySpec{Mode: policy}}}
}

// createEtcdCluster creates a plaintext EtcdCluster (with 1 GiB volumes, which its sample does
// not ask for) and waits until it reports three members, every one healthy and none a learner,
// three ready pods, and Available (a quorum of its members is healthy: true as soon as its first
// member runs, as it adds members one at a time) and not Progressing (no membership change).
func createEtcdCluster(ctx context.Context, b *testing.B, c benchClients, ns string) time.Time {
	ec := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "operator.etcd.io/v1alpha1", "kind": "EtcdCluster",
		"metadata": map[string]any{"name": "peer", "namespace": ns},
		"spec": map[string]any{"size": int64(3), "version": "v3.7.3",
			"storageSpec": map[string]any{"volumeSizeRequest": "1Gi"}},
	}}
	if _, err := c.dyn.Resource(etcdClusters).Namespace(ns).Create(ctx, ec, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	return waitFor(ctx, b, c, ns, "EtcdCluster peer: 3 healthy voting members, 3 ready pods, Available, not Progressing", func(ctx context.Context) (bool, error) {
		got, err := c.dyn.Resource(etcdClusters).Namespace(ns).Get(ctx, "peer", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedInt64(got.Object, "status", "readyReplicas")
		members, _, _ := unstructured.NestedSlice(got.Object, "status", "members")
		healthy := 0
		for _, m := range members {
			if m, ok := m.(map[string]any); ok && m["isHealthy"] == true && m["isLearner"] != true {
				healthy++
			}
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		want := map[string]string{"Available": "True", "Progressing": "False"}
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && want[fmt.Sprint(m["type"])] == m["status"] {
				delete(want, fmt.Sprint(m["type"]))
			}
		}
		return ready == 3 && len(members) == 3 && healthy == 3 && len(want) == 0, nil
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
func waitFor(ctx context.Context, b *testing.B, c benchClients, ns, what string, done func(context.Context) (bool, error)) time.Time {
	var podsReady time.Time
	err := wait.PollUntilContextTimeout(ctx, readyPollInterval, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		if podsReady.IsZero() {
			pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
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
		pods, _ := kubectl(c.cfg, "-n", ns, "get", "pods,pvc", "-o", "wide")
		events, _ := kubectl(c.cfg, "-n", ns, "get", "events", "--sort-by=.lastTimestamp")
		b.Fatalf("%s: %v\n%s\n%s", what, err, pods, events)
	}
	return podsReady
}

// deleteNamespace deletes ns and waits until it and the volumes of its claims are gone.
func deleteNamespace(ctx context.Context, b *testing.B, c benchClients, ns string) {
	if err := c.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	err := poll(ctx, 5*time.Minute, func(ctx context.Context) (bool, error) {
		if _, err := c.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		pvs, err := c.cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		b.Fatalf("namespace %s and its volumes not deleted: %v", ns, err)
	}
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
// the pods being Ready to the cluster being Ready, and the median against the floor's median;
// then whether the goals are met, by this operator as the others run (contenders[1]).
func peersTable(contenders []contender, samples map[string][]timing, note string) string {
	floor := median(samples[contenders[0].name], total)
	var sb strings.Builder
	sb.WriteString("| 3 members, etcd v3.7.3, 1 GiB volumes | runs | apply → Ready min / median / max | after its pods were Ready min / median / max | median ÷ floor's |\n")
	sb.WriteString("|---|---:|---|---|---:|\n")
	for _, c := range contenders {
		s := samples[c.name]
		lo, mid, hi := spread(s, total)
		plo, pmid, phi := spread(s, afterPods)
		unprobed := ""
		if !c.probed {
			unprobed = " ¹"
		}
		fmt.Fprintf(&sb, "| %s | %d | %.1f s / %.1f s / %.1f s | %.1f s / %.1f s / %.1f s%s | %.2f× |\n", c.name, len(s),
			lo.Seconds(), mid.Seconds(), hi.Seconds(), plo.Seconds(), pmid.Seconds(), phi.Seconds(), unprobed, mid.Seconds()/floor.Seconds())
	}
	if note != "" {
		sb.WriteString("\n" + note + "\n")
	}
	ours := contenders[1]
	oursMedian := median(samples[ours.name], total)
	fmt.Fprintf(&sb, "\nGoal ≤ 1.2× the floor: %s %.2f× — %s.\n", ours.name, oursMedian.Seconds()/floor.Seconds(), metOrNot(oursMedian.Seconds() <= 1.2*floor.Seconds()))
	for _, c := range contenders[1:] {
		if !c.probed {
			peer := median(samples[c.name], total)
			fmt.Fprintf(&sb, "Goal faster than %s: %.1f s against %.1f s (medians) — %s.\n", c.name, oursMedian.Seconds(), peer.Seconds(), metOrNot(oursMedian < peer))
		}
	}
	return sb.String()
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

func peersReport(table string, rounds int) string {
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	// Changes to the report itself (an earlier run's) do not count.
	if dirty, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)e2e/BENCHMARKS-peers.md").Output(); len(dirty) > 0 {
		commit = append(bytes.TrimSpace(commit), " with uncommitted changes"...)
	}
	return fmt.Sprintf(`# apply → Ready beside the peers

Generated by `+"`make bench-peers`"+` on %s (commit %s; %s, %d CPUs): %d rounds on the project's local
cluster (real pods, a real kubelet and containerd), after a warm-up round; each round runs every
contender once, in a random order, and each cluster's namespace and volumes are gone before the
next one starts. Times are from the create request to the first poll (every %s) that sees the
cluster Ready: the floor's StatefulSet with 3 ready pods; a KVCluster's Ready condition; an
EtcdCluster with 3 members, all healthy and none a learner, 3 ready pods, Available and not
Progressing (its Available alone is true as soon as its first member runs: it adds members one at
a time). "After its pods were Ready" starts at the first poll that saw the cluster's three pods
Ready: what the operator adds. The pods' probes run every 5 s, so apply → Ready varies by up to
that much from run to run.

The floor is a bare StatefulSet with the pod template, peer Service and membership ConfigMap this
operator builds (the same image, flags and probes): what the three etcd pods alone need.

%s`, time.Now().UTC().Format("2006-01-02"), bytes.TrimSpace(commit), runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), rounds, readyPollInterval, table)
}
