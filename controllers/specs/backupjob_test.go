package specs

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"

	"github.com/kvcluster/kvcluster-operator/backup"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

func TestBackupJob(t *testing.T) {
	kvc := cluster(3)
	kvc.Spec.Backup = &kvv1.BackupSpec{
		S3:                        &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", Prefix: "team", Region: "eu-1", CredentialsSecret: "creds"},
		Retention:                 kvv1.BackupRetention{KeepLast: 5, MaxAge: &metav1.Duration{Duration: 72 * time.Hour}},
		FinalBackupTimeoutSeconds: 120,
	}
	at := time.Date(2026, 11, 30, 10, 15, 0, 0, time.UTC)
	tests := []struct {
		name         string
		run          BackupRun
		wantArgs     []string
		unwantedArgs []string
		deadline     int64
	}{
		{name: "scheduled", run: ScheduledBackupRun(kvc, "kv-100"),
			wantArgs: []string{"backup", "--key=team/prod/kv/uid-1/kv-100.db", "--endpoints=http://kv-0.kv-peer.prod.svc:2379,",
				"--prune-cluster=kv", "--keep-last=5", "--max-age=72h0m0s", "--timeout=1605s"},
			unwantedArgs: []string{"--insecure"}, deadline: 1800},
		{name: "final", run: FinalBackupRun(kvc, at),
			wantArgs:     []string{"backup", "--key=team/prod/kv/uid-1/kv-final-20261130T101500Z.db", "--timeout=93s"},
			unwantedArgs: []string{"--prune-cluster", "--keep-last"}, deadline: 120},
		{name: "pre-upgrade", run: PreUpgradeBackupRun(kvc, at),
			wantArgs:     []string{"backup", "--key=team/prod/kv/uid-1/kv-preupgrade-3.7.3-20261130T101500Z.db", "--timeout=1605s"},
			unwantedArgs: []string{"--prune-cluster", "--keep-last"}, deadline: 1800},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := BackupJob(kvc, tt.run, "op:1")
			args := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
			for _, want := range tt.wantArgs {
				if !strings.Contains(args, want) {
					t.Errorf("args lack %q: %s", want, args)
				}
			}
			for _, unwanted := range tt.unwantedArgs {
				if strings.Contains(args, unwanted) {
					t.Errorf("args have %q: %s", unwanted, args)
				}
			}
			if *job.Name != tt.run.Job || *job.Spec.ActiveDeadlineSeconds != tt.deadline || *job.Spec.BackoffLimit != 0 {
				t.Errorf("name %s deadline %d backoffLimit %d", *job.Name, *job.Spec.ActiveDeadlineSeconds, *job.Spec.BackoffLimit)
			}
			if job.Labels[BackupKindLabel] != tt.run.Kind || job.Spec.Template.Labels[ManagedByLabel] != ManagedByValue {
				t.Errorf("labels %v / pod labels %v", job.Labels, job.Spec.Template.Labels)
			}
			c := job.Spec.Template.Spec.Containers[0]
			for _, e := range c.Env {
				if e.Value != nil || e.ValueFrom.SecretKeyRef == nil || *e.ValueFrom.SecretKeyRef.Name != "creds" {
					t.Errorf("credentials must come only from the Secret: %+v", e)
				}
			}
			if *c.Image != "op:1" || !*c.SecurityContext.ReadOnlyRootFilesystem || *job.Spec.Template.Spec.AutomountServiceAccountToken {
				t.Errorf("image %s, security %+v", *c.Image, c.SecurityContext)
			}
		})
	}
}

// TestPreUpgradeBackupJob: the backup taken before the members move to spec.version is one Job
// (a later upgrade replaces it), owned by the KVCluster alone (no deletion step needs it), with
// the target version in an annotation. It writes a new object per run, stamped in UTC under the
// cluster's UID, to the bucket with the Secret's credentials or to the claim mounted writable;
// it never prunes, never retries, and its deadline is the fixed 30 minutes, whatever the final
// backup's timeout.
func TestPreUpgradeBackupJob(t *testing.T) {
	labels := map[string]string{
		"app.kubernetes.io/name": "kvcluster", "app.kubernetes.io/instance": "kv", "app.kubernetes.io/managed-by": "kvcluster-operator",
		"kvcluster.io/cluster": "kv", "kvcluster.io/cluster-uid": "uid-1", "kvcluster.io/backup": "pre-upgrade",
	}
	endpoints := "--endpoints=http://kv-0.kv-peer.prod.svc:2379,http://kv-1.kv-peer.prod.svc:2379,http://kv-2.kv-peer.prod.svc:2379"
	at := time.Date(2026, 11, 30, 12, 15, 0, 0, time.FixedZone("CEST", 2*60*60)) // 10:15 UTC
	tests := []struct {
		name        string
		version     string
		backup      kvv1.BackupSpec
		wantArgs    []string
		wantEnv     []string
		wantVolumes []string
		wantMounts  []string
	}{
		{
			name:    "to a bucket",
			version: "3.7.3",
			backup: kvv1.BackupSpec{
				S3:        &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", Prefix: "team", Region: "eu-1", Insecure: true, CredentialsSecret: "creds"},
				Retention: kvv1.BackupRetention{KeepLast: 5, MaxAge: &metav1.Duration{Duration: 72 * time.Hour}}, FinalBackupTimeoutSeconds: 600,
			},
			wantArgs: []string{"backup", endpoints, "--key=team/prod/kv/uid-1/kv-preupgrade-3.7.3-20261130T101500Z.db", "--timeout=1605s",
				"--s3-endpoint=s3:7070", "--bucket=b", "--region=eu-1", "--insecure"},
			wantEnv: []string{"AWS_ACCESS_KEY_ID from Secret creds key AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY from Secret creds key AWS_SECRET_ACCESS_KEY"},
		},
		{
			name:    "to a bucket with the workload's cloud identity: no Secret",
			version: "3.7.3",
			backup: kvv1.BackupSpec{
				S3: &kvv1.S3Destination{Endpoint: "s3.eu-1.amazonaws.com", Bucket: "b", Prefix: "team", Region: "eu-1", WorkloadIdentity: true},
			},
			wantArgs: []string{"backup", endpoints, "--key=team/prod/kv/uid-1/kv-preupgrade-3.7.3-20261130T101500Z.db", "--timeout=1605s",
				"--s3-endpoint=s3.eu-1.amazonaws.com", "--bucket=b", "--region=eu-1", "--workload-identity"},
		},
		{
			name:    "to a claim, with the shortest final backup timeout",
			version: "3.6.16",
			backup:  kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backup-volume", Prefix: "etcd"}, FinalBackupTimeoutSeconds: 30},
			wantArgs: []string{"backup", endpoints, "--key=etcd/prod/kv/uid-1/kv-preupgrade-3.6.16-20261130T101500Z.db", "--timeout=1605s",
				"--dir=/backups", "--claim=backup-volume"},
			wantVolumes: []string{"backups: claim backup-volume readOnly=false"},
			wantMounts:  []string{"backups at /backups readOnly=false"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := cluster(3)
			kvc.Spec.Version = tt.version
			kvc.Spec.Backup = &tt.backup
			compareFacts(t, factsOf(t, PreUpgradeBackupJob(kvc, "http", "op:1", at)), jobFacts{
				Name: "kv-preupgrade", Namespace: "prod",
				Labels: labels, PodLabels: withoutInstance(labels),
				Annotations: map[string]string{"kvcluster.io/target-version": tt.version},
				Owners:      []string{"kvcluster.io/v1alpha1 KVCluster/kv uid=uid-1 controller=true blockOwnerDeletion=true"},
				Deadline:    1800, Backoff: 0,
				RestartPolicy: corev1.RestartPolicyNever, AutomountToken: false,
				Image: "op:1", Args: tt.wantArgs, Env: tt.wantEnv,
				Volumes: tt.wantVolumes, Mounts: tt.wantMounts,
				TerminationMessage: corev1.TerminationMessageReadFile,
			})
		})
	}
}

// TestFinalBackupJobDeadlineLeavesTimeToReport: the final backup's Job deadline is
// finalBackupTimeoutSeconds, over its whole range, and the backup program's --timeout ends before
// that deadline kills it, by enough to abort its upload (backup.StopTimeout) and write why it
// stopped. (Scheduled and pre-upgrade backups have a fixed 30 minutes: see the tests above.)
func TestFinalBackupJobDeadlineLeavesTimeToReport(t *testing.T) {
	at := time.Date(2026, 11, 30, 10, 15, 0, 0, time.UTC)
	tests := []struct {
		name         string
		finalTimeout int32
		wantDeadline int64
		wantTimeout  int64
	}{
		{name: "shortest timeout", finalTimeout: 30, wantDeadline: 30, wantTimeout: 12},
		{name: "default timeout", finalTimeout: 600, wantDeadline: 600, wantTimeout: 525},
		{name: "longest timeout", finalTimeout: 86400, wantDeadline: 86400, wantTimeout: 77745},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := cluster(3)
			kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "b"}, FinalBackupTimeoutSeconds: tt.finalTimeout}
			job := BackupJob(kvc, FinalBackupRun(kvc, at), "op:1")
			if got := *job.Spec.ActiveDeadlineSeconds; got != tt.wantDeadline {
				t.Errorf("activeDeadlineSeconds = %d, want %d", got, tt.wantDeadline)
			}
			timeout := fmt.Sprintf("--timeout=%ds", tt.wantTimeout)
			if args := job.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, timeout) {
				t.Errorf("args %q lack %s", args, timeout)
			}
			if spare := time.Duration(tt.wantDeadline-tt.wantTimeout) * time.Second; spare <= backup.StopTimeout {
				t.Errorf("the program stops %s before its deadline, no more than the %s it may take to abort", spare, backup.StopTimeout)
			}
		})
	}
}

// TestJobPodsAreNoMembers: the pods of backup and deregistration Jobs match none of the members'
// selectors. The PodDisruptionBudget's would otherwise count them and, finding no scale
// subresource on a Job, allow no disruption at all (a node drain would hang); the client
// Service's would send clients to a backup pod.
func TestJobPodsAreNoMembers(t *testing.T) {
	kvc := cluster(3)
	kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}}
	kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "https://registry.example/x", Method: "POST"}}
	members := labels.SelectorFromSet(SelectorLabels(kvc))
	for name, job := range map[string]*batchv1ac.JobApplyConfiguration{
		"scheduled backup": BackupJob(kvc, ScheduledBackupRun(kvc, "kv-1"), "op:1"),
		"final backup":     BackupJob(kvc, FinalBackupRun(kvc, time.Now()), "op:1"),
		"deregistration":   DeregistrationJob(kvc, "op:1", ""),
	} {
		if podLabels := job.Spec.Template.Labels; members.Matches(labels.Set(podLabels)) {
			t.Errorf("the %s Job's pods %v are selected as members", name, podLabels)
		}
	}
}

// withoutInstance is a Job's labels as its pods carry them (see TestJobPodsAreNoMembers).
func withoutInstance(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if k != "app.kubernetes.io/instance" {
			out[k] = v
		}
	}
	return out
}
