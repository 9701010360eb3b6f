package specs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
)

const (
	// BackupKindLabel on a backup Job says which backup it is: BackupScheduled, BackupFinal,
	// BackupPreUpgrade or BackupOnDemand.
	BackupKindLabel  = "kvcluster.io/backup"
	BackupScheduled  = "scheduled"
	BackupFinal      = "final"
	BackupPreUpgrade = "pre-upgrade"
	BackupOnDemand   = "on-demand"

	// TargetVersionAnnotation on the pre-upgrade backup Job names the version it was taken for.
	TargetVersionAnnotation = "kvcluster.io/target-version"
	// WritesFencedAnnotation on a final backup Job is the revision writes were fenced at before it
	// started: the backup holds the cluster's last state.
	WritesFencedAnnotation = "kvcluster.io/writes-fenced-at-revision"
)

// BackupRun is one backup: the Job that takes it and the object it writes. Job names are
// deterministic, so a retried reconcile never starts a second Job; object keys are unique per
// cluster incarnation and per run, so no backup ever finds its object already written by an
// earlier one (a second upgrade, a cluster re-created under the same name).
type BackupRun struct {
	Job, Kind, Key string
	// Guard is the UID of the cluster's deletion guard, for the final backup (see Guard).
	Guard types.UID
	// Annotations of the Job, e.g. whether writes were fenced before a final backup.
	Annotations map[string]string
	// ClientScheme is how the Job reaches the members (http or https): what every member accepts
	// now, which differs from the spec's while a cluster moves to or from TLS; the spec's when empty.
	ClientScheme string
}

func (run BackupRun) clientScheme(kvc *kvv1.KVCluster) string {
	if run.ClientScheme != "" {
		return run.ClientScheme
	}
	return DesiredTransport(kvc).ClientScheme()
}

// ScheduledBackupRun is the backup of one schedule slot; the Job's name is already unique per slot.
func ScheduledBackupRun(kvc *kvv1.KVCluster, job string) BackupRun {
	return BackupRun{Job: job, Kind: BackupScheduled, Key: BackupObjectKey(kvc, job)}
}

// PreUpgradeBackupJobName is the one Job of the backup taken before an upgrade; the Job of an
// earlier upgrade is replaced (its target version is in TargetVersionAnnotation).
func PreUpgradeBackupJobName(kvc *kvv1.KVCluster) string { return kvc.Name + "-preupgrade" }

// PreUpgradeBackupRun is the backup taken, at now, before the members move to spec.version.
func PreUpgradeBackupRun(kvc *kvv1.KVCluster, now time.Time) BackupRun {
	job := PreUpgradeBackupJobName(kvc)
	return BackupRun{Job: job, Kind: BackupPreUpgrade, Key: BackupObjectKey(kvc, job+"-"+kvc.Spec.Version+"-"+runStamp(now))}
}

// PreUpgradeBackupJob is the backup Job taken before the members move to spec.version, reaching
// them in scheme.
func PreUpgradeBackupJob(kvc *kvv1.KVCluster, scheme, image string, now time.Time) *batchv1ac.JobApplyConfiguration {
	run := PreUpgradeBackupRun(kvc, now)
	run.ClientScheme = scheme
	return BackupJob(kvc, run, image).
		WithAnnotations(map[string]string{TargetVersionAnnotation: kvc.Spec.Version})
}

// OnDemandBackupJobName is the Job of the backup asked for with kvcluster.io/backup-now=token:
// "<cluster>-now-<6 hex digits of the token's SHA-256>", at most 63 characters for a name of at
// most 52, so a retried reconcile finds the Job it started. The Job carries the token itself
// (kvv1.AnnotationBackupNow), which tells two tokens of the same digits apart.
func OnDemandBackupJobName(kvc *kvv1.KVCluster, token string) string {
	sum := sha256.Sum256([]byte(token))
	return kvc.Name + "-now-" + hex.EncodeToString(sum[:3])
}

// OnDemandBackupJob is the Job of the backup asked for with token, started at now, reaching the
// members in scheme. Its object is unique per run, like a final backup's, and kept for good.
func OnDemandBackupJob(kvc *kvv1.KVCluster, token, scheme, image string, now time.Time) *batchv1ac.JobApplyConfiguration {
	job := OnDemandBackupJobName(kvc, token)
	return BackupJob(kvc, BackupRun{Job: job, Kind: BackupOnDemand, Key: BackupObjectKey(kvc, job+"-"+runStamp(now)),
		Annotations: map[string]string{kvv1.AnnotationBackupNow: token}, ClientScheme: scheme}, image)
}

// FinalBackupJobName is the one Job of the final backup: deterministic, so a retried reconcile
// never starts a second one.
func FinalBackupJobName(kvc *kvv1.KVCluster) string { return kvc.Name + "-final" }

// FinalBackupRun is the final backup, started at now (a retry after a failure is a new run).
func FinalBackupRun(kvc *kvv1.KVCluster, now time.Time) BackupRun {
	job := FinalBackupJobName(kvc)
	return BackupRun{Job: job, Kind: BackupFinal, Key: BackupObjectKey(kvc, job+"-"+runStamp(now))}
}

func runStamp(t time.Time) string { return t.UTC().Format("20060102T150405Z") }

// BackupObjectKey is where a backup writes: <prefix>/<namespace>/<name>/<cluster UID>/<file>.db.
// The UID keeps the backups of a cluster deleted and re-created under the same name apart, and
// retention (which prunes within one directory) never touches an earlier incarnation's.
func BackupObjectKey(kvc *kvv1.KVCluster, file string) string {
	prefix := ""
	if b := kvc.Spec.Backup; b != nil && b.S3 != nil {
		prefix = b.S3.Prefix
	} else if b != nil && b.PVC != nil {
		prefix = b.PVC.Prefix
	}
	return strings.TrimPrefix(path.Join(prefix, kvc.Namespace, kvc.Name, string(kvc.UID), file+".db"), "/")
}

// reportMargin is how long before its Job's deadline a program run by a Job gives up, so it can
// still say why in its termination message before Kubernetes kills it: stop (what it needs to
// wind down, e.g. abort an upload), 5 s, and a tenth of the deadline for the pod's start.
func reportMargin(deadline int64, stop time.Duration) int64 {
	return int64(stop/time.Second) + 5 + deadline/10
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
	a := storeAccess{args: []string{"--s3-endpoint=" + s3.Endpoint, "--bucket=" + s3.Bucket, "--region=" + s3.Region}}
	if s3.WorkloadIdentity {
		a.args = append(a.args, "--workload-identity")
	} else {
		a.env = []*corev1ac.EnvVarApplyConfiguration{secretEnv(s3.CredentialsSecret, "AWS_ACCESS_KEY_ID"), secretEnv(s3.CredentialsSecret, "AWS_SECRET_ACCESS_KEY")}
	}
	if s3.Insecure {
		a.args = append(a.args, "--insecure")
	}
	return a
}

// BackupJob runs one backup: the operator's own image, `backup` subcommand, streaming a snapshot
// to the bucket or the claim. Scheduled, on-demand, pre-upgrade and final backups are built here alike; only
// the name, the object, the kind label, the deadline and (for scheduled ones) pruning differ. It never retries (a retry would find its own
// object and be refused); the next slot is the retry. Credentials reach the pod only from the
// referenced Secret, or from its ServiceAccount's cloud identity (s3.workloadIdentity).
func BackupJob(kvc *kvv1.KVCluster, run BackupRun, image string) *batchv1ac.JobApplyConfiguration {
	b := kvc.Spec.Backup
	deadline := int64(30 * 60)
	if run.Kind == BackupFinal {
		deadline = int64(b.FinalBackupTimeoutSeconds)
	}
	access := accessTo(b.S3, b.PVC, false)
	scheme := run.clientScheme(kvc)
	args := append([]string{
		"backup",
		"--endpoints=" + strings.Join(MemberClientURLs(kvc, scheme), ","),
		"--key=" + run.Key,
		// The program gives up before the Job's deadline kills it, so it can still say why.
		fmt.Sprintf("--timeout=%ds", deadline-reportMargin(deadline, backup.StopTimeout)),
	}, access.args...)
	args = append(args, backupTLSArgs(scheme)...)
	if run.Kind == BackupScheduled { // only scheduled backups prune: the others are kept for good
		args = append(args, "--prune-cluster="+kvc.Name, fmt.Sprintf("--keep-last=%d", max(b.Retention.KeepLast, 1)))
		if b.Retention.MaxAge != nil {
			args = append(args, "--max-age="+b.Retention.MaxAge.Duration.String())
		}
	}
	labels := Labels(kvc)
	labels[BackupKindLabel] = run.Kind
	labels[ClusterUIDLabel] = string(kvc.UID) // whose it is, also once a foreground deletion took the KVCluster off its owners
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
	if scheme == "https" {
		container.WithVolumeMounts(tlsMountOf(TLSClient))
		pod.WithVolumes(tlsVolume(kvc, TLSClient))
	}
	tmpl := corev1ac.PodTemplateSpec().
		WithLabels(JobPodLabels(labels)).
		WithSpec(pod.WithContainers(container))
	placePod(kvc, tmpl)
	reachStore(kvc, tmpl)
	return batchv1ac.Job(run.Job, kvc.Namespace).
		WithLabels(labels).
		WithAnnotations(run.Annotations).
		WithOwnerReferences(Owners(kvc, run.Guard)...).
		WithSpec(batchv1ac.JobSpec().
			WithBackoffLimit(0).
			WithActiveDeadlineSeconds(deadline).
			WithTemplate(tmpl))
}
