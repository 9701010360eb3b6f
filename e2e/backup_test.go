//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

const bucket = "backups"

// s3Store is the versitygw in the test namespace, reached from the test through a port-forward
// (which works on kind and on the local cluster alike).
type s3Store struct {
	client *minio.Client
	// stop ends the port-forward.
	stop func()
}

func startS3(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) *s3Store {
	t.Helper()
	if out, err := kubectl(cfg, "apply", "-n", ns, "-f", filepath.Join("testdata", "s3.yaml")); err != nil {
		t.Fatalf("deploy the S3 store: %v\n%s", err, out)
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "s3", Namespace: ns}}
	if err := wait.For(conditions.New(cfg.Client().Resources()).DeploymentConditionMatch(dep, appsv1.DeploymentAvailable, "True"),
		wait.WithTimeout(2*time.Minute)); err != nil {
		out, _ := kubectl(cfg, "-n", ns, "describe", "pods", "-l", "app=s3")
		t.Fatalf("the S3 store did not start: %v\n%s", err, out)
	}
	s, err := connectS3(cfg, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		s.stop()
		t.Fatalf("create the bucket: %v", err)
	}
	return s
}

// connectS3 reaches the S3 store of namespace ns through a new port-forward (one dies with the API
// server that carried it).
func connectS3(cfg *envconf.Config, ns string) (*s3Store, error) {
	addr, stop, err := portForward(cfg, ns, "svc/s3", 7070)
	if err != nil {
		return nil, err
	}
	client, err := minio.New(addr, &minio.Options{
		Creds: credentials.NewStaticV4("e2e-backups", "e2e-backups-secret", ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		stop()
		return nil, err
	}
	return &s3Store{client: client, stop: stop}, nil
}

// keys lists the objects whose keys start with prefix and end with suffix.
func (s *s3Store) keys(ctx context.Context, t *testing.T, prefix, suffix string) []string {
	t.Helper()
	var out []string
	for obj := range s.client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			t.Fatalf("list %s: %v", prefix, obj.Err)
		}
		if strings.HasSuffix(obj.Key, suffix) {
			out = append(out, obj.Key)
		}
	}
	return out
}

// object downloads an object and returns its sha256, or fails the test.
func (s *s3Store) objectSHA256(ctx context.Context, t *testing.T, key string) (string, int64) {
	t.Helper()
	obj, err := s.client.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer obj.Close()
	h := sha256.New()
	n, err := io.Copy(h, obj)
	if err != nil {
		t.Fatalf("read s3://%s/%s: %v", bucket, key, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

func TestBackups(t *testing.T) {
	var (
		kvc      *kvv1.KVCluster
		s3       *s3Store
		finalKey string
	)
	f := features.New("backups of a real cluster go to a real S3 store; deletion backs up and deregisters").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := envconf.RandomName("kvc-backup", 16)
			if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			s3 = startS3(ctx, t, cfg, ns)
			kvc = &kvv1.KVCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: ns},
				Spec: kvv1.KVClusterSpec{
					Version: "3.7.3", Partitions: 1, BackupSchedule: "*/1 * * * *",
					Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
					Backup: &kvv1.BackupSpec{S3: &kvv1.S3Destination{
						Endpoint: "s3." + ns + ".svc:7070", Bucket: bucket, Prefix: "e2e", Insecure: true, CredentialsSecret: "s3-credentials",
					}},
					// A real HTTP call during deletion: the dying cluster's members still answer (its
					// client Service takes no new connections by then: it was drained), on their
					// plain-HTTP metrics port.
					Deregistration: &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{
						URL: "http://orders-0.orders-peer." + ns + ".svc:2381/livez", Method: "GET"}},
				},
			}
			if err := cfg.Client().Resources().Create(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("the cluster is Ready and holds a key", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			waitReady(ctx, t, cfg, kvc, 5*time.Minute)
			etcdctl(ctx, t, cfg, kvc, kvc.Name+"-0", "put", "orders/1", "two coffees")
			return ctx
		}).
		Assess("a scheduled backup lands in the bucket and sets lastBackupTime", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			start := time.Now()
			err := wait.For(conditions.New(cfg.Client().Resources()).ResourceMatch(kvc, func(o k8s.Object) bool {
				return o.(*kvv1.KVCluster).Status.LastBackupTime != nil
			}), wait.WithTimeout(3*time.Minute), wait.WithInterval(2*time.Second))
			got := get(ctx, t, cfg, kvc)
			if err != nil {
				out, _ := kubectl(cfg, "-n", kvc.Namespace, "describe", "jobs")
				t.Fatalf("no successful backup within 3 minutes: %v\nstatus: %+v\n%s", err, got.Status, out)
			}
			t.Logf("first backup completed %s after the cluster was ready: %+v", time.Since(start).Round(time.Second), *got.Status.LastBackup)
			lb := got.Status.LastBackup
			key := strings.TrimPrefix(lb.Location, "s3://"+bucket+"/")
			if !lb.Succeeded || !strings.HasPrefix(key, "e2e/"+kvc.Namespace+"/orders/"+string(got.UID)+"/orders-") {
				t.Fatalf("lastBackup = %+v", lb)
			}
			sum, size := s3.objectSHA256(ctx, t, key)
			if sum != lb.SHA256 || size != lb.Size {
				t.Errorf("object %s has sha256 %s (%d bytes), status says %s (%d bytes)", key, sum, size, lb.SHA256, lb.Size)
			}
			if _, err := s3.client.StatObject(ctx, bucket, key+".meta.json", minio.StatObjectOptions{}); err != nil {
				t.Errorf("no metadata beside the snapshot: %v", err)
			}
			if got.Status.NextBackupTime == nil || !got.Status.NextBackupTime.After(got.Status.LastScheduledTime.Time) {
				t.Errorf("nextBackupTime = %v, lastScheduledTime = %v", got.Status.NextBackupTime, got.Status.LastScheduledTime)
			}
			return ctx
		}).
		Assess("kubectl kvc backup takes a backup now, follows it to the bucket, once", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			const token = "e2e-on-demand-1"
			start := time.Now()
			out, err := kubectlKVC(t, cfg, "backup", kvc.Name, "-n", kvc.Namespace, "--token", token, "--timeout", "3m")
			req := get(ctx, t, cfg, kvc).Status.BackupRequest
			if err != nil || req == nil || req.Token != token || req.State != kvv1.BackupRequestSucceeded || req.Backup == nil {
				jobs, _ := kubectl(cfg, "-n", kvc.Namespace, "describe", "jobs")
				t.Fatalf("kubectl kvc backup: %v\n%s\nstatus.backupRequest: %+v\n%s", err, out, req, jobs)
			}
			t.Logf("kubectl kvc backup took %s:\n%s", time.Since(start).Round(time.Second), out)
			key := strings.TrimPrefix(req.Backup.Location, "s3://"+bucket+"/")
			if sum, size := s3.objectSHA256(ctx, t, key); sum != req.Backup.SHA256 || size != req.Backup.Size {
				t.Errorf("object %s has sha256 %s (%d bytes), status says %s (%d bytes)", key, sum, size, req.Backup.SHA256, req.Backup.Size)
			}
			if !strings.Contains(out, req.Backup.Location) {
				t.Errorf("kubectl kvc backup did not say where the backup went (%s):\n%s", req.Backup.Location, out)
			}
			// Asked again with the same token (a GitOps tool re-applying it): no second backup.
			if out, err := kubectlKVC(t, cfg, "backup", kvc.Name, "-n", kvc.Namespace, "--token", token); err != nil || !strings.Contains(out, "was asked for already") {
				t.Errorf("the same token again: %v\n%s", err, out)
			}
			var jobs batchv1.JobList
			if err := cfg.Client().Resources(kvc.Namespace).List(ctx, &jobs); err != nil {
				t.Fatal(err)
			}
			asked := 0
			for _, j := range jobs.Items {
				if j.Annotations[kvv1.AnnotationBackupNow] == token {
					asked++
				}
			}
			if asked != 1 {
				t.Errorf("%d Jobs for the token %s, want 1", asked, token)
			}
			for _, args := range [][]string{{"backups", kvc.Name}, {"status", kvc.Name}} {
				out, err := kubectlKVC(t, cfg, append(args, "-n", kvc.Namespace)...)
				if err != nil || !strings.Contains(out, req.Job) {
					t.Errorf("kubectl kvc %s: %v, want %s named:\n%s", args[0], err, req.Job, out)
				}
			}
			return ctx
		}).
		Assess("the operator's metrics say what the status says, to a scraper allowed to read them only", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			checkOperatorMetrics(ctx, t, cfg, kvc)
			checkMemberMetrics(ctx, t, cfg, kvc.Namespace, kvc.Name+"-0")
			return ctx
		}).
		Assess("deleting the KVCluster takes a final backup, deregisters, then everything goes", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			etcdctl(ctx, t, cfg, kvc, kvc.Name+"-0", "put", "orders/2", "one tea, written just before deletion")
			kvc = get(ctx, t, cfg, kvc) // its UID names the directory of its backups
			if err := cfg.Client().Resources().Delete(ctx, kvc); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := wait.For(conditions.New(cfg.Client().Resources()).ResourceDeleted(kvc), wait.WithTimeout(3*time.Minute)); err != nil {
				out, _ := kubectl(cfg, "-n", kvc.Namespace, "describe", "kvc,jobs")
				t.Fatalf("the KVCluster was not deleted: %v\n%s", err, out)
			}
			t.Logf("deleted, with its final backup, in %s", time.Since(start).Round(time.Second))
			finals := s3.keys(ctx, t, fmt.Sprintf("e2e/%s/orders/%s/orders-final-", kvc.Namespace, kvc.UID), ".db")
			if len(finals) != 1 {
				t.Fatalf("final backups in the bucket: %v, want one", finals)
			}
			finalKey = finals[0]
			if _, size := s3.objectSHA256(ctx, t, finalKey); size < 4096 {
				t.Errorf("final backup %s is %d bytes", finalKey, size)
			}
			sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: kvc.Name, Namespace: kvc.Namespace}}
			if err := wait.For(conditions.New(cfg.Client().Resources()).ResourceDeleted(sts), wait.WithTimeout(time.Minute)); err != nil {
				t.Errorf("the StatefulSet outlived its KVCluster: %v", err)
			}
			var evs corev1.EventList
			_ = cfg.Client().Resources(kvc.Namespace).List(ctx, &evs)
			seen := map[string]bool{}
			for _, e := range evs.Items {
				switch e.Reason {
				case "FinalBackupStarted", "FinalBackupCompleted", "DeregistrationStarted", "DeregistrationSucceeded", "DeregistrationFailed", "FinalBackupFailed":
					seen[e.Reason] = true
					t.Logf("event: %s %s", e.Reason, e.Message)
				}
			}
			for _, want := range []string{"FinalBackupStarted", "FinalBackupCompleted", "DeregistrationStarted", "DeregistrationSucceeded"} {
				if !seen[want] {
					t.Errorf("no %s event; saw %v", want, seen)
				}
			}
			return ctx
		}).
		Assess("a new KVCluster restored from the final backup serves the keys written before", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			restored := &kvv1.KVCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "orders-restored", Namespace: kvc.Namespace},
				Spec: kvv1.KVClusterSpec{
					Version: "3.7.3", Partitions: 3,
					Storage: kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
					Restore: &kvv1.RestoreSpec{
						S3:  &kvv1.S3Destination{Endpoint: "s3." + kvc.Namespace + ".svc:7070", Bucket: bucket, Insecure: true, CredentialsSecret: "s3-credentials"},
						Key: finalKey, // its sha256 comes from the metadata beside it
					},
				},
			}
			if err := cfg.Client().Resources().Create(ctx, restored); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			waitReady(ctx, t, cfg, restored, 5*time.Minute)
			t.Logf("restored 3-member cluster Ready in %s", time.Since(start).Round(time.Second))
			for key, want := range map[string]string{"orders/1": "two coffees", "orders/2": "one tea, written just before deletion"} {
				for i := range 3 { // every member has the data, not just one
					out := etcdctl(ctx, t, cfg, restored, fmt.Sprintf("orders-restored-%d", i),
						"get", "--consistency=s", "--print-value-only", key)
					if strings.TrimSpace(out) != want {
						t.Errorf("member %d of the restored cluster has %s = %q, want %q", i, key, out, want)
					}
				}
			}
			// The final backup was taken with writes fenced (a NOSPACE alarm, which the snapshot
			// carries): the restored cluster must take writes all the same.
			etcdctl(ctx, t, cfg, restored, "orders-restored-0", "put", "orders/3", "the first write after the restore")
			return ctx
		}).
		Teardown(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if s3 != nil {
				s3.stop()
			}
			if err := cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvc.Namespace}}); err != nil && !apierrors.IsNotFound(err) {
				t.Log(err)
			}
			return ctx
		}).Feature()
	testAlongsideOthers(t, f)
}
