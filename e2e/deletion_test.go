//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// secretToken is in the deregistration URL, which only a Secret holds: it must never show.
const secretToken = "S3CR3T-T0KEN-42"

// TestDeletionKeepsTheData: the deletion paths users take - an Argo CD prune (foreground
// propagation) under writes, re-creating a cluster under the same name, deleting it again, and
// deleting the whole namespace - never lose data silently.
func TestDeletionKeepsTheData(t *testing.T) {
	var (
		ns, firstFinal string
		s3             *s3Store
		acknowledged   int
	)
	ledger := func(name string, mutate ...func(*kvv1.KVCluster)) *kvv1.KVCluster {
		k := &kvv1.KVCluster{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: kvv1.KVClusterSpec{
				Version: "3.7.3", Partitions: 1,
				Storage: kvv1.StorageSpec{Size: resource.MustParse("256Mi")},
				Backup: &kvv1.BackupSpec{S3: &kvv1.S3Destination{
					Endpoint: "s3." + ns + ".svc:7070", Bucket: bucket, Prefix: "e2e", Insecure: true, CredentialsSecret: "s3-credentials",
				}, DrainSeconds: ptr.To[int32](3)},
			},
		}
		for _, m := range mutate {
			m(k)
		}
		return k
	}
	create := func(ctx context.Context, t *testing.T, cfg *envconf.Config, k *kvv1.KVCluster) *kvv1.KVCluster {
		t.Helper()
		if err := cfg.Client().Resources().Create(ctx, k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	waitGone := func(ctx context.Context, t *testing.T, cfg *envconf.Config, obj k8s.Object, timeout time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		if err := wait.For(conditions.New(cfg.Client().Resources()).ResourceDeleted(obj), wait.WithTimeout(timeout), wait.WithInterval(time.Second)); err != nil {
			out, _ := kubectl(cfg, "-n", obj.GetNamespace(), "get", "kvc,jobs,pods,configmaps", "-o", "wide")
			logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment, "--tail=30")
			t.Fatalf("%s was not deleted within %s: %v\n%s\noperator logs:\n%s", obj.GetName(), timeout, err, out, logs)
		}
		return time.Since(start)
	}
	events := func(ctx context.Context, t *testing.T, cfg *envconf.Config, object string) string {
		t.Helper()
		var evs corev1.EventList
		if err := cfg.Client().Resources(ns).List(ctx, &evs); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == object {
				out = append(out, e.Reason+": "+e.Message)
			}
		}
		return strings.Join(out, "\n")
	}

	f := features.New("deleting a KVCluster never loses its data silently").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns = envconf.RandomName("kvc-delete", 16)
			if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			s3 = startS3(ctx, t, cfg, ns)
			registry := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns}, StringData: map[string]string{
				// etcd answers 404 there: the deregistration fails, and says so without the token.
				"url": fmt.Sprintf("http://ledger-0.ledger-peer.%s.svc:2379/deregister/%s?token=%s", ns, secretToken, secretToken)}}
			if err := cfg.Client().Resources().Create(ctx, registry); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("an Argo CD prune (foreground) under writes drains, fences and takes a final backup holding every acknowledged write",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				kvc := create(ctx, t, cfg, ledger("ledger", func(k *kvv1.KVCluster) {
					k.Spec.Deregistration = &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{Method: "POST", Retries: 1,
						URLSecret: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "registry"}, Key: "url"}}}
				}))
				waitReady(ctx, t, cfg, kvc, 5*time.Minute)
				startWriter(ctx, t, cfg, kvc)
				time.Sleep(2 * time.Second)
				kvc = get(ctx, t, cfg, kvc)
				foreground := func(o *metav1.DeleteOptions) { o.PropagationPolicy = ptr.To(metav1.DeletePropagationForeground) }
				if err := cfg.Client().Resources().Delete(ctx, kvc, foreground); err != nil {
					t.Fatal(err)
				}
				took := waitGone(ctx, t, cfg, kvc, 3*time.Minute)
				ev := events(ctx, t, cfg, "ledger")
				t.Logf("deleted with foreground propagation in %s; events:\n%s", took.Round(time.Second), ev)
				for _, want := range []string{"DrainStarted", "WritesFenced", "FinalBackupCompleted", "writes were fenced: it holds the cluster's last state", "DeregistrationFailed"} {
					if !strings.Contains(ev, want) {
						t.Errorf("events lack %q", want)
					}
				}
				finals := s3.keys(ctx, t, fmt.Sprintf("e2e/%s/ledger/%s/ledger-final-", ns, kvc.UID), ".db")
				if len(finals) != 1 {
					t.Fatalf("final backups = %v, want one: the members were gone before it read them", finals)
				}
				firstFinal = finals[0]
				// A cluster re-created under the same name below takes the client Service's name.
				rep := writerAsk(ctx, t, cfg, kvc, "halt")
				acknowledged = rep.Acknowledged
				t.Logf("writer: %d acknowledged, %d failed after the fence (%s)", rep.Acknowledged, rep.Failed, rep.LastError)
				return ctx
			}).
		Assess("no Secret value shows in events or in the operator's log", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if ev := events(ctx, t, cfg, "ledger"); strings.Contains(ev, secretToken) || !strings.Contains(ev, "http://ledger-0.ledger-peer."+ns+".svc:2379/…") {
				t.Errorf("events reveal the token, or do not say which host failed:\n%s", ev)
			}
			if logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment); strings.Contains(logs, secretToken) {
				t.Error("the operator's log reveals the token")
			}
			return ctx
		}).
		Assess("re-created under the same name, it does not start on the old volume", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			kvc := create(ctx, t, cfg, ledger("ledger"))
			err := wait.For(conditions.New(cfg.Client().Resources()).ResourceMatch(kvc, func(o k8s.Object) bool {
				c := meta.FindStatusCondition(o.(*kvv1.KVCluster).Status.Conditions, kvv1.ConditionStalled)
				return c != nil && c.Reason == "LeftoverVolumes"
			}), wait.WithTimeout(time.Minute), wait.WithInterval(time.Second))
			if err != nil {
				t.Fatalf("no LeftoverVolumes: %+v", get(ctx, t, cfg, kvc).Status)
			}
			if pods := memberPods(ctx, t, cfg, kvc); len(pods) != 0 {
				t.Errorf("members started on the old volume: %v", pods)
			}
			if err := cfg.Client().Resources().Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-ledger-0", Namespace: ns}}); err != nil {
				t.Fatal(err)
			}
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			if keys := etcdctl(ctx, t, cfg, kvc, "ledger-0", "get", "--prefix", "--keys-only", "e2e/writer/"); strings.TrimSpace(keys) != "" {
				t.Errorf("the new cluster holds the old one's keys")
			}
			return ctx
		}).
		Assess("a cluster restored from the final backup holds every acknowledged write and takes new ones", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			restored := create(ctx, t, cfg, ledger("ledger-restored", func(k *kvv1.KVCluster) {
				k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3, Key: firstFinal}
			}))
			waitReady(ctx, t, cfg, restored, 5*time.Minute)
			rep := writerAsk(ctx, t, cfg, restored, "stop", "endpoints", fmt.Sprintf("http://ledger-restored-client.%s.svc:2379", ns))
			if !rep.Checked || len(rep.Missing) != 0 || rep.Acknowledged != acknowledged || rep.Acknowledged == 0 {
				t.Errorf("writer against the restored cluster: %d acknowledged, %d present, %d missing (%.3v); want all %d acknowledged writes present",
					rep.Acknowledged, rep.Present, len(rep.Missing), rep.Missing, acknowledged)
			}
			t.Logf("restored: %d acknowledged writes, %d present, none missing", rep.Acknowledged, rep.Present)
			etcdctl(ctx, t, cfg, restored, "ledger-restored-0", "put", "after/restore", "the stale fence alarm was disarmed")
			return ctx
		}).
		Assess("deleting the re-created cluster keeps both final backups", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			kvc := get(ctx, t, cfg, ledger("ledger"))
			if err := cfg.Client().Resources().Delete(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			waitGone(ctx, t, cfg, kvc, 3*time.Minute)
			finals := s3.keys(ctx, t, "e2e/"+ns+"/ledger/", ".db")
			var count int
			for _, k := range finals {
				if strings.Contains(k, "/ledger-final-") {
					count++
				}
			}
			if count != 2 || !strings.Contains(strings.Join(finals, " "), firstFinal) {
				t.Errorf("objects under e2e/%s/ledger/: %v, want the first and the second incarnation's final backups", ns, finals)
			}
			return ctx
		}).
		Assess("deleting the namespace never hangs, and the lost final backup is logged and counted", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			restored := get(ctx, t, cfg, ledger("ledger-restored"))
			restored.Spec.BackupSchedule = "*/5 * * * *"
			restored.Spec.Backup.OnFinalBackupFailure = kvv1.FinalBackupBlock
			if err := cfg.Client().Resources().Update(ctx, restored); err != nil {
				t.Fatal(err)
			}
			before := lostFinalBackups(ctx, t, cfg)
			s3.stop()
			s3 = nil
			namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
			if err := cfg.Client().Resources().Delete(ctx, namespace); err != nil {
				t.Fatal(err)
			}
			took := waitGone(ctx, t, cfg, namespace, 4*time.Minute)
			t.Logf("namespace deleted in %s", took.Round(time.Second))
			if after := lostFinalBackups(ctx, t, cfg); after != before+1 {
				t.Errorf("kvcluster_final_backups_lost_total{reason=\"namespace_deleted\"} went from %v to %v, want one more", before, after)
			}
			logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment)
			if !strings.Contains(logs, "deleted without its final backup") || !strings.Contains(logs, "ledger-restored") {
				t.Error("the operator's log does not say that ledger-restored went without its final backup")
			}
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if s3 != nil {
				s3.stop()
			}
			err := cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Log(err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// lostFinalBackups reads kvcluster_final_backups_lost_total{reason="namespace_deleted"} from the
// operator's metrics endpoint, through the API server's pod proxy.
func lostFinalBackups(ctx context.Context, t *testing.T, cfg *envconf.Config) float64 {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + operatorDeployment})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("operator pods: %v %v", pods, err)
	}
	raw, err := cs.CoreV1().Pods(operatorNamespace).ProxyGet("http", pods.Items[0].Name, "8080", "/metrics", nil).DoRaw(ctx)
	if err != nil {
		t.Fatalf("operator metrics: %v", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, `kvcluster_final_backups_lost_total{reason="namespace_deleted"} `); ok {
			var f float64
			_, _ = fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}
