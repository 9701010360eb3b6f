package specs

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
