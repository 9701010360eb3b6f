//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// TestANamespacedInstall: installed with the chart's watchNamespaces, the operator runs a cluster
// of a watched namespace (members, their TLS Secrets, an on-demand backup Job) with that
// namespace's Role alone, leaves another namespace's cluster alone, and a watched namespace
// deleted whole goes away: the namespace controller deletes the operator's Role there while the
// cluster still holds the operator's finalizer. Restarted, the operator leaves that namespace out.
func TestANamespacedInstall(t *testing.T) {
	helm := os.Getenv("KVC_HELM")
	if helm == "" {
		t.Skip("needs the operator installed with its Helm chart (KVC_HELM, as make e2e-local and make e2e set)")
	}
	var (
		watched, spare, elsewhere string
		kvc, theirs               *kvv1.KVCluster
		s3                        *s3Store
	)
	reinstall := func(t *testing.T, cfg *envconf.Config, values ...string) {
		t.Helper()
		if err := installChart(cfg, helm, values...); err != nil {
			t.Fatal(err)
		}
		if out, err := kubectl(cfg, "-n", operatorNamespace, "rollout", "status", "deploy/"+operatorDeployment, "--timeout=3m"); err != nil {
			t.Fatalf("the operator did not roll out: %v\n%s", err, out)
		}
	}
	f := features.New("an operator watching some namespaces").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			watched, spare, elsewhere = envconf.RandomName("kvc-watched", 16), envconf.RandomName("kvc-spare", 14), envconf.RandomName("kvc-elsewhere", 18)
			for _, ns := range []string{watched, spare, elsewhere} {
				if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
					t.Fatal(err)
				}
			}
			reinstall(t, cfg, "--set", "watchNamespaces={"+watched+","+spare+"}")
			// Back to every namespace for the tests that follow, also when a step below fails
			// (a Setup that fails skips the Teardown).
			t.Cleanup(func() { reinstall(t, cfg) })
			// Created before the watched one: by the time that is Ready, this one would have been
			// reconciled too if its namespace were watched.
			theirs = &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: elsewhere},
				Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 1, Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")}}}
			if err := cfg.Client().Resources().Create(ctx, theirs); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("a cluster of the watched namespace runs and backs up with the namespace's Role alone", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			s3 = startS3(ctx, t, cfg, watched)
			kvc = &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: "ours", Namespace: watched},
				Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 1, Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
					Backup: &kvv1.BackupSpec{S3: &kvv1.S3Destination{
						Endpoint: "s3." + watched + ".svc:7070", Bucket: bucket, Prefix: "e2e", Insecure: true, CredentialsSecret: "s3-credentials"}}}}
			if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			waitReady(ctx, t, cfg, kvc, 3*time.Minute)
			if got := get(ctx, t, cfg, kvc); got.Spec.TLS == nil || got.Spec.TLS.Mode != kvv1.TLSOperator {
				t.Errorf("spec.tls %+v: want the operator's TLS (the admission policy's default)", got.Spec.TLS)
			}
			if out, err := kubectlKVC(t, cfg, "backup", kvc.Name, "-n", watched, "--token", "namespaced", "--timeout", "3m"); err != nil {
				t.Fatalf("kubectl kvc backup: %v\n%s", err, out)
			}
			if req := get(ctx, t, cfg, kvc).Status.BackupRequest; req == nil || req.State != kvv1.BackupRequestSucceeded {
				t.Errorf("status.backupRequest %+v, want Succeeded", req)
			}
			return ctx
		}).
		Assess("a cluster of a namespace not watched is left alone", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if got := get(ctx, t, cfg, theirs); got.Status.Phase != "" || len(got.Finalizers) > 0 {
				t.Errorf("a KVCluster in a namespace not watched was reconciled: phase %q, finalizers %v", got.Status.Phase, got.Finalizers)
			}
			var sts appsv1.StatefulSet
			if err := cfg.Client().Resources().Get(ctx, theirs.Name, elsewhere, &sts); err == nil {
				t.Error("a KVCluster in a namespace not watched got members")
			}
			return ctx
		}).
		Assess("the watched namespace, deleted whole, goes away", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			s3.stop()
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: watched}}
			if err := cfg.Client().Resources().Delete(ctx, ns); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := wait.For(conditions.New(cfg.Client().Resources()).ResourceDeleted(ns), wait.WithTimeout(3*time.Minute), wait.WithInterval(2*time.Second)); err != nil {
				left, _ := kubectl(cfg, "-n", watched, "get", "kvc,pods,jobs,roles,configmaps", "-o", "wide")
				logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment, "--tail=30")
				t.Fatalf("namespace %s was not deleted within 3m: %v\nleft:\n%s\noperator logs:\n%s", watched, err, left, logs)
			}
			t.Logf("namespace %s deleted in %s", watched, time.Since(start).Round(time.Second))
			return ctx
		}).
		Assess("restarted, the operator starts without the deleted namespace, saying so", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if out, err := kubectl(cfg, "-n", operatorNamespace, "rollout", "restart", "deploy/"+operatorDeployment); err != nil {
				t.Fatalf("restart the operator: %v\n%s", err, out)
			}
			if out, err := kubectl(cfg, "-n", operatorNamespace, "rollout", "status", "deploy/"+operatorDeployment, "--timeout=3m"); err != nil {
				logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment, "--tail=20")
				t.Fatalf("the operator did not start again: %v\n%s\n%s", err, out, logs)
			}
			// The newest pod's: the one before may still be terminating.
			newest, err := kubectl(cfg, "-n", operatorNamespace, "get", "pods", "-l", "app.kubernetes.io/name=kvcluster-operator",
				"--sort-by=.metadata.creationTimestamp", "-o", "name")
			if err != nil {
				t.Fatalf("list the operator's pods: %v\n%s", err, newest)
			}
			pods := strings.Fields(newest)
			if len(pods) == 0 {
				t.Fatal("no operator pod")
			}
			if logs, _ := kubectl(cfg, "-n", operatorNamespace, "logs", pods[len(pods)-1]); !strings.Contains(logs, watched) || !strings.Contains(logs, "does not exist") {
				t.Errorf("the operator's log does not say that %s is not watched:\n%s", watched, logs)
			}
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			// Before the operator watches every namespace again: the cluster never reconciled has
			// no finalizer and goes at once, so the operator does not start it.
			if theirs != nil {
				_ = cfg.Client().Resources().Delete(ctx, theirs)
			}
			for _, ns := range []string{elsewhere, spare} {
				_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}
