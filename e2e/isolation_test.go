//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
)

// On the project's local cluster, and on kind run on the project's own Docker engine, nothing may
// leave the machine: a pod must reach the cluster but neither the machine's gateway, its resolver,
// nor any outside address, and resolve no outside name. (On a user's Docker, kind's pods reach the
// internet by design.)
func TestPodsCannotLeaveTheMachine(t *testing.T) {
	if !localCluster && os.Getenv("E2E_KIND_ISOLATED") != "1" {
		t.Skip("only on the project's local cluster (E2E_LOCAL_CLUSTER=1) or kind on its Docker engine (E2E_KIND_ISOLATED=1, as make e2e KVC_LOCAL_DOCKER=1 sets)")
	}
	targets := outsideTargets(t)
	args := []string{"-timeout=4s", "-reach=kubernetes.default.svc.cluster.local:443"}
	for _, a := range targets {
		args = append(args, "-dial="+a)
	}
	args = append(args, "-resolve=example.com", "-resolve=kubernetes.io")
	f := features.New("isolation").
		Assess("a pod reaches the API server but nothing outside the machine", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			logs, held := netcheck(ctx, t, cfg, "default", "netcheck", nil, args...)
			t.Logf("netcheck (targets %v):\n%s", targets, logs)
			if !held {
				t.Fatal("isolation broken or probe failed")
			}
			return ctx
		}).
		Assess("nor does a pod the NetworkPolicy engine has seen", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			// kube-router accepts, ahead of any filter rule, the traffic of the pods it knows (a
			// short-lived pod is gone before it is seen); it sees a new pod within seconds.
			probe := idleProbe(ctx, t, cfg, "default", nil)
			defer func() {
				_ = cfg.Client().Resources().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: probe, Namespace: "default"}})
			}()
			time.Sleep(15 * time.Second)
			out, err := kubectl(cfg, append([]string{"-n", "default", "exec", probe, "--", "/netcheck"}, args...)...)
			t.Logf("netcheck in a pod running for 15s:\n%s", out)
			if err != nil {
				t.Fatalf("isolation broken or probe failed: %v", err)
			}
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}

// outsideTargets are real addresses this machine can reach: its default gateway, its resolvers,
// and a public address.
func outsideTargets(t *testing.T) []string {
	t.Helper()
	targets := []string{"1.1.1.1:443"}
	if data, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" && net.ParseIP(f[1]).To4() != nil {
				targets = append(targets, net.JoinHostPort(f[1], "53"))
			}
		}
	}
	if f, err := os.Open("/proc/net/route"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 2 && fields[1] == "00000000" && fields[2] != "00000000" {
				b, err := hex.DecodeString(fields[2])
				if err == nil && len(b) == 4 {
					targets = append(targets, fmt.Sprintf("%d.%d.%d.%d:80", b[3], b[2], b[1], b[0]))
				}
			}
		}
	}
	return targets
}

// netcheck runs the netcheck program (e2e/localcluster/netcheck) in a new pod of namespace ns
// with these labels and arguments, waits until it finished, and returns its output and whether
// every check held. The pod is deleted afterwards.
func netcheck(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, name string, podLabels map[string]string, args ...string) (string, bool) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: podLabels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "netcheck", Image: "kvcluster.io/netcheck:dev", ImagePullPolicy: corev1.PullNever, Args: args,
			}},
		},
	}
	r := cfg.Client().Resources()
	_ = r.Delete(ctx, pod)
	_ = wait.For(conditions.New(r).ResourceDeleted(pod), wait.WithTimeout(time.Minute))
	if err := r.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	err := wait.For(conditions.New(r).ResourceMatch(pod, func(o k8s.Object) bool {
		p := o.(*corev1.Pod)
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}), wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second))
	if err != nil {
		t.Fatalf("netcheck pod %s/%s did not finish: %v", ns, name, err)
	}
	logs, _ := kubectl(cfg, "-n", ns, "logs", name)
	_ = r.Delete(ctx, pod)
	return logs, pod.Status.Phase == corev1.PodSucceeded
}

// idleProbe starts an idle netcheck pod in namespace ns and returns its name once it runs.
func idleProbe(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, podLabels map[string]string) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns, Labels: podLabels},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "netcheck", Image: "kvcluster.io/netcheck:dev", ImagePullPolicy: corev1.PullNever, Args: []string{"-idle"},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
	r := cfg.Client().Resources()
	if err := r.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	err := wait.For(conditions.New(r).PodRunning(pod), wait.WithTimeout(2*time.Minute), wait.WithInterval(time.Second))
	if err != nil {
		t.Fatalf("probe pod in %s not running: %v", ns, err)
	}
	return pod.Name
}
