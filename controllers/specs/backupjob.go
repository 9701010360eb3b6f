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
	BackupKindLabel  = "kvcluster.io/backup"
	BackupScheduled  = "scheduled"
	BackupFinal      = "final"
	BackupPreUpgrade = "pre-upgrade"

	// TargetVersionAnnotation on the pre-upgrade backup Job names the version it was taken for.
	TargetVersionAnnotation = "kvcluster.io/target-version"
)

// PreUpgradeBackupJobName is the one Job of the backup taken before an upgrade; the Job of an
// earlier upgrade is replaced (its target version is in TargetVersionAnnotation).
func PreUpgradeBackupJobName(kvc *kvv1.KVCluster) string { return kvc.Name + "-preupgrade" }

// PreUpgradeBackupJob is the backup Job taken before the members move to spec.version.
func PreUpgradeBackupJob(kvc *kvv1.KVCluster, image string) *batchv1ac.JobApplyConfiguration {
	return BackupJob(kvc, PreUpgradeBackupJobName(kvc), BackupPreUpgrade, image).
		WithAnnotations(map[string]string{TargetVersionAnnotation: kvc.Spec.Version})
}

// FinalBackupJobName is the one Job of the final backup: deterministic, so a retried reconcile
// never starts a second one.
func FinalBackupJobName(kvc *kvv1.KVCluster) string { return kvc.Name + "-final" }

// BackupObjectKey is the object a backup Job writes: <prefix>/<namespace>/<name>/<job>.db.
func BackupObjectKey(kvc *kvv1.KVCluster, job string) string {
	prefix := ""
	if b := kvc.Spec.Backup; b != nil && b.S3 != nil {
		prefix = b.S3.Prefix
	} else if b != nil && b.PVC != nil {
		prefix = b.PVC.Prefix
	}
	return strings.TrimPrefix(path.Join(prefix, kvc.Namespace, kvc.Name, job+".db"), "/")
}

const (
	backupVolume = "backups"
	backupMount  = "/backups"
)

// storeAccess is how a pod reaches a backup destination: the flags of the operator's backup and
// restore programs, plus the credentials from the Secret (S3) or the mounted claim (PVC).
type storeAccess struct {
	args   []string
	env    []*corev1ac.EnvVarApplyConfiguration
	volume *corev1ac.VolumeApplyConfiguration
	mount  *corev1ac.VolumeMountApplyConfiguration
}

func accessTo(s3 *kvv1.S3Destination, pvc *kvv1.PVCDestination, readOnly bool) storeAccess {
	if pvc != nil {
		return storeAccess{
			args: []string{"--dir=" + backupMount, "--claim=" + pvc.ClaimName},
			volume: corev1ac.Volume().WithName(backupVolume).WithPersistentVolumeClaim(
				corev1ac.PersistentVolumeClaimVolumeSource().WithClaimName(pvc.ClaimName).WithReadOnly(readOnly)),
			mount: corev1ac.VolumeMount().WithName(backupVolume).WithMountPath(backupMount).WithReadOnly(readOnly),
		}
	}
	a := storeAccess{
		args: []string{"--s3-endpoint=" + s3.Endpoint, "--bucket=" + s3.Bucket, "--region=" + s3.Region},
		env:  []*corev1ac.EnvVarApplyConfiguration{secretEnv(s3.CredentialsSecret, "AWS_ACCESS_KEY_ID"), secretEnv(s3.CredentialsSecret, "AWS_SECRET_ACCESS_KEY")},
	}
	if s3.Insecure {
		a.args = append(a.args, "--insecure")
	}
	return a
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
	access := accessTo(b.S3, b.PVC, false)
	args := append([]string{
		"backup",
		"--endpoints=" + strings.Join(MemberClientURLs(kvc), ","),
		"--key=" + BackupObjectKey(kvc, name),
		fmt.Sprintf("--timeout=%ds", deadline),
	}, access.args...)
	if kind == BackupScheduled { // a final backup prunes nothing: the cluster is going away
		args = append(args, "--prune-cluster="+kvc.Name, fmt.Sprintf("--keep-last=%d", max(b.Retention.KeepLast, 1)))
		if b.Retention.MaxAge != nil {
			args = append(args, "--max-age="+b.Retention.MaxAge.Duration.String())
		}
	}
	labels := Labels(kvc)
	labels[BackupKindLabel] = kind
	container := corev1ac.Container().
		WithName("backup").
		WithImage(image).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithArgs(args...).
		WithEnv(access.env...).
		WithTerminationMessagePolicy(corev1.TerminationMessageReadFile).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")}).
			WithLimits(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")})).
		WithSecurityContext(restrictedContainer())
	pod := corev1ac.PodSpec().
		WithRestartPolicy(corev1.RestartPolicyNever).
		WithAutomountServiceAccountToken(false).
		WithEnableServiceLinks(false).
		WithSecurityContext(restrictedPod().WithFSGroup(nonRootUID))
	if access.volume != nil {
		container.WithVolumeMounts(access.mount)
		pod.WithVolumes(access.volume)
	}
	return batchv1ac.Job(name, kvc.Namespace).
		WithLabels(labels).
		WithOwnerReferences(OwnerReference(kvc)).
		WithSpec(batchv1ac.JobSpec().
			WithBackoffLimit(0).
			WithActiveDeadlineSeconds(deadline).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(labels).
				WithSpec(pod.WithContainers(container))))
}
