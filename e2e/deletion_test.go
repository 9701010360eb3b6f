//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// propagation) under writes, re-creating the cluster under the same name from its final backup,
// deleting it again, an orphaning deletion, and deleting the whole namespace - never lose data
// silently.
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
				Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
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
		return strings.Join(timeline(ctx, t, cfg, ns, object), "\n")
	}

	f := features.New("deleting a KVCluster never loses its data silently").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns = envconf.RandomName("kvc-delete", 16)
			if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			s3 = startS3(ctx, t, cfg, ns)
			registry := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns}, StringData: map[string]string{
				// etcd's metrics port answers 404 there: the deregistration fails, and says so without the token.
				"url": fmt.Sprintf("http://ledger-0.ledger-peer.%s.svc:2381/deregister/%s?token=%s", ns, secretToken, secretToken)}}
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
				for _, want := range []string{"DrainStarted", "WritesFenced", "FinalBackupCompleted", "it holds the cluster's last state", "DeregistrationFailed: deleting without the deregistration because it failed"} {
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
			if ev := events(ctx, t, cfg, "ledger"); strings.Contains(ev, secretToken) || !strings.Contains(ev, "http://ledger-0.ledger-peer."+ns+".svc:2381/…") {
				t.Errorf("events reveal the token, or do not say which host failed:\n%s", ev)
			}
			if logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment); strings.Contains(logs, secretToken) {
				t.Error("the operator's log reveals the token")
			}
			return ctx
		}).
		Assess("re-created under the same name from that backup, it never starts on the old volume, holds every acknowledged write and takes new ones",
			func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				kvc := create(ctx, t, cfg, ledger("ledger", func(k *kvv1.KVCluster) {
					k.Spec.Restore = &kvv1.RestoreSpec{S3: k.Spec.Backup.S3, Key: firstFinal}
				}))
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
				// Its members have the deleted cluster's member IDs, so the fence alarm in the backup
				// looks like its own: it must have been cleared for the writes below to pass.
				// With TLS, through the new cluster's client certificate: it reaches the writer's
				// volume within a kubelet sync.
				var rep writerReport
				if err := wait.For(func(ctx context.Context) (bool, error) {
					raw, err := writerGet(ctx, t, cfg, kvc, "stop", "endpoints", clientService(kvc, schemeOf(get(ctx, t, cfg, kvc))))
					return err == nil && json.Unmarshal(raw, &rep) == nil, nil
				}, wait.WithTimeout(3*time.Minute), wait.WithInterval(5*time.Second)); err != nil {
					t.Fatalf("the writer cannot check the re-created cluster: %v", err)
				}
				if !rep.Checked || len(rep.Missing) != 0 || rep.Acknowledged != acknowledged || rep.Acknowledged == 0 {
					t.Errorf("writer against the restored cluster: %d acknowledged, %d present, %d missing (%.3v); want all %d acknowledged writes present",
						rep.Acknowledged, rep.Present, len(rep.Missing), rep.Missing, acknowledged)
				}
				t.Logf("restored: %d acknowledged writes, %d present, none missing", rep.Acknowledged, rep.Present)
				etcdctl(ctx, t, cfg, kvc, "ledger-0", "put", "after/restore", "the fence alarm that came with the backup was cleared")
				return ctx
			}).
		Assess("deleting the re-created cluster keeps both final backups", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			kvc := get(ctx, t, cfg, ledger("ledger"))
			if err := cfg.Client().Resources().Delete(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			waitGone(ctx, t, cfg, kvc, 3*time.Minute)
			var finals []string
			for _, k := range s3.keys(ctx, t, "e2e/"+ns+"/ledger/", ".db") {
				if strings.Contains(k, "/ledger-final-") {
					finals = append(finals, k)
				}
			}
			if len(finals) != 2 || !strings.Contains(strings.Join(finals, " "), firstFinal) {
				t.Errorf("final backups under e2e/%s/ledger/: %v, want the first and the second incarnation's", ns, finals)
			}
			return ctx
		}).
		Assess("deleted with --cascade=orphan, the members keep running and taking writes", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			kvc := create(ctx, t, cfg, ledger("kept"))
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			orphan := func(o *metav1.DeleteOptions) { o.PropagationPolicy = ptr.To(metav1.DeletePropagationOrphan) }
			if err := cfg.Client().Resources().Delete(ctx, get(ctx, t, cfg, kvc), orphan); err != nil {
				t.Fatal(err)
			}
			waitGone(ctx, t, cfg, kvc, 2*time.Minute)
			etcdctl(ctx, t, cfg, kvc, "kept-0", "put", "still/here", "not drained, not fenced")
			guard := &corev1.ConfigMap{}
			if err := cfg.Client().Resources().Get(ctx, "kept-guard", ns, guard); err != nil || guard.Annotations["kvcluster.io/orphaned-members"] != "true" {
				t.Fatalf("the guard keeping the orphaned members: %v %v", guard.Annotations, err)
			}
			// Deleting the guard lets the garbage collector remove them.
			if err := cfg.Client().Resources().Delete(ctx, guard); err != nil {
				t.Fatal(err)
			}
			waitGone(ctx, t, cfg, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: ns}}, 2*time.Minute)
			return ctx
		}).
		Assess("deleting the namespace never hangs, and the lost final backup is logged and counted", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			orders := create(ctx, t, cfg, ledger("orders", func(k *kvv1.KVCluster) {
				k.Spec.BackupSchedule = "*/5 * * * *"
				k.Spec.Backup.OnFinalBackupFailure = kvv1.FinalBackupBlock
			}))
			waitReady(ctx, t, cfg, orders, 5*time.Minute)
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
			said := false
			for _, line := range strings.Split(logs, "\n") {
				said = said || (strings.Contains(line, "deleted without its final backup") && strings.Contains(line, `"orders"`) && strings.Contains(line, ns))
			}
			if !said {
				t.Error("the operator's log does not say that orders went without its final backup")
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
// operator's metrics endpoint, as a scraper holding the metrics reader role.
func lostFinalBackups(ctx context.Context, t *testing.T, cfg *envconf.Config) float64 {
	t.Helper()
	families, err := operatorReader(ctx, t, cfg, operatorNamespace)(ctx)
	if err != nil {
		t.Fatalf("operator metrics: %v", err)
	}
	v, _ := sample(families, "kvcluster_final_backups_lost_total", map[string]string{"reason": "namespace_deleted"})
	return v
}
