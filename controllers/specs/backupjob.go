package specs

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// BackupKindLabel tells scheduled backup Jobs from the final one.
const (
	BackupKindLabel = "kvcluster.io/backup"
	BackupScheduled = "scheduled"
	BackupFinal     = "final"
)

// FinalBackupJobName is the one Job of the final backup: deterministic, so a retried reconcile
// never starts a second one.
func FinalBackupJobName(kvc *kvv1.KVCluster) string { return kvc.Name + "-final" }

// BackupObjectKey is the object a backup Job writes: <prefix>/<namespace>/<name>/<job>.db.
func BackupObjectKey(kvc *kvv1.KVCluster, job string) string {
	prefix := ""
	if kvc.Spec.Backup != nil {
		prefix = kvc.Spec.Backup.S3.Prefix
	}
	return strings.TrimPrefix(path.Join(prefix, kvc.Namespace, kvc.Name, job+".db"), "/")
}

// BackupJob runs one backup: the operator's own image, `backup` subcommand, streaming a snapshot
// to the bucket. Scheduled and final backups are built here alike; only the name, the kind label
// and the deadline differ. It never retries (a retry would find its own object and be refused);
// the next slot is the retry. Credentials reach the pod only from the referenced Secret.
func BackupJob(kvc *kvv1.KVCluster, name, kind, image string) *batchv1ac.JobApplyConfiguration {
	b := kvc.Spec.Backup
	deadline := int64(30 * 60)
	if kind == BackupFinal {
		deadline = int64(b.FinalBackupTimeoutSeconds)
	}
	args := []string{
		"backup",
		"--endpoints=" + strings.Join(MemberClientURLs(kvc), ","),
		"--s3-endpoint=" + b.S3.Endpoint,
		"--bucket=" + b.S3.Bucket,
		"--key=" + BackupObjectKey(kvc, name),
		"--region=" + b.S3.Region,
		fmt.Sprintf("--timeout=%ds", deadline),
	}
	if b.S3.Insecure {
		args = append(args, "--insecure")
	}
	if kind == BackupScheduled { // a final backup prunes nothing: the cluster is going away
		args = append(args, "--prune-cluster="+kvc.Name, fmt.Sprintf("--keep-last=%d", max(b.Retention.KeepLast, 1)))
		if b.Retention.MaxAge != nil {
			args = append(args, "--max-age="+b.Retention.MaxAge.Duration.String())
		}
	}
	labels := Labels(kvc)
	labels[BackupKindLabel] = kind
	return batchv1ac.Job(name, kvc.Namespace).
		WithLabels(labels).
		WithOwnerReferences(OwnerReference(kvc)).
		WithSpec(batchv1ac.JobSpec().
			WithBackoffLimit(0).
			WithActiveDeadlineSeconds(deadline).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(labels).
				WithSpec(corev1ac.PodSpec().
					WithRestartPolicy(corev1.RestartPolicyNever).
					WithAutomountServiceAccountToken(false).
					WithEnableServiceLinks(false).
					WithSecurityContext(restrictedPod()).
					WithContainers(corev1ac.Container().
						WithName("backup").
						WithImage(image).
						WithImagePullPolicy(corev1.PullIfNotPresent).
						WithArgs(args...).
						WithEnv(secretEnv(b.S3.CredentialsSecret, "AWS_ACCESS_KEY_ID"), secretEnv(b.S3.CredentialsSecret, "AWS_SECRET_ACCESS_KEY")).
						WithTerminationMessagePolicy(corev1.TerminationMessageReadFile).
						WithResources(corev1ac.ResourceRequirements().
							WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")}).
							WithLimits(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")})).
						WithSecurityContext(restrictedContainer())))))
}
