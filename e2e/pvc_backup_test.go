//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// namespaceWithBackupClaim creates a namespace named from prefix holding a claim of size for
// backups, and returns its name.
func namespaceWithBackupClaim(ctx context.Context, t *testing.T, cfg *envconf.Config, prefix, claimName, size string) string {
	t.Helper()
	ns := envconf.RandomName(prefix, 16)
	r := cfg.Client().Resources()
	if err := r.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if err := r.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	return ns
}

// put writes key = value through the member pod and returns the revision etcd gave the write.
func put(ctx context.Context, t *testing.T, cfg *envconf.Config, kvc *kvv1.KVCluster, pod, key, value string) int64 {
	t.Helper()
	out := etcdctl(ctx, t, cfg, kvc, pod, "put", "-w", "json", key, value)
	var resp struct {
		Header struct {
			Revision int64 `json:"revision"`
		} `json:"header"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || resp.Header.Revision == 0 {
		t.Fatalf("put %s: no revision in %q: %v", key, out, err)
	}
	return resp.Header.Revision
}

// backedUpOnClaim is a cluster on 512Mi volumes backed up every minute onto the claim
// "backup-volume" (see namespaceWithBackupClaim).
func backedUpOnClaim(ns, name string, partitions int32) *kvv1.KVCluster {
	return &kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kvv1.KVClusterSpec{
			Version: "3.7.3", Partitions: partitions, BackupSchedule: "*/1 * * * *",
			Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
			Backup:  &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backup-volume"}},
		},
	}
}

func TestBackupsOnAPersistentVolumeClaim(t *testing.T) {
	var kvc *kvv1.KVCluster
	f := features.New("backups to a PersistentVolumeClaim, and a restore from it").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := namespaceWithBackupClaim(ctx, t, cfg, "kvc-pvc", "backup-volume", "512Mi")
			r := cfg.Client().Resources()
			kvc = backedUpOnClaim(ns, "ledger", 1)
			if err := r.Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("a scheduled backup lands on the claim", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			written := put(ctx, t, cfg, kvc, "ledger-0", "ledger/balance", "42")
			// The backup of the minute may have taken its snapshot before the write: wait for one
			// that holds it.
			err := wait.For(conditions.New(cfg.Client().Resources()).ResourceMatch(kvc, func(o k8s.Object) bool {
				lb := o.(*kvv1.KVCluster).Status.LastBackup
				return lb != nil && lb.Succeeded && lb.Revision >= written && o.(*kvv1.KVCluster).Status.LastBackupTime != nil
			}), wait.WithTimeout(3*time.Minute), wait.WithInterval(2*time.Second))
			got := get(ctx, t, cfg, kvc)
			if err != nil {
				out, _ := kubectl(cfg, "-n", kvc.Namespace, "describe", "jobs,pods")
				t.Fatalf("no successful backup on the claim: %v\nstatus: %+v\n%s", err, got.Status, out)
			}
			if lb := got.Status.LastBackup; !strings.HasPrefix(lb.Location, "pvc://backup-volume/"+kvc.Namespace+"/ledger/"+string(got.UID)+"/ledger-") || lb.Size < 4096 {
				t.Fatalf("lastBackup = %+v", lb)
			}
			return ctx
		}).
		Assess("a new KVCluster restores from the claim", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			lb := get(ctx, t, cfg, kvc).Status.LastBackup
			restored := &kvv1.KVCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "ledger-restored", Namespace: kvc.Namespace},
				Spec: kvv1.KVClusterSpec{
					Version: "3.7.3", Partitions: 1,
					Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
					Restore: &kvv1.RestoreSpec{
						PVC: &kvv1.PVCDestination{ClaimName: "backup-volume"},
						Key: strings.TrimPrefix(lb.Location, "pvc://backup-volume/"), SHA256: lb.SHA256,
					},
				},
			}
			if err := cfg.Client().Resources().Create(ctx, restored); err != nil {
				t.Fatal(err)
			}
			waitReady(ctx, t, cfg, restored, 5*time.Minute)
			if out := etcdctl(ctx, t, cfg, restored, "ledger-restored-0", "get", "--print-value-only", "ledger/balance"); strings.TrimSpace(out) != "42" {
				t.Errorf("restored ledger/balance = %q, want 42", out)
			}
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}})
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}
