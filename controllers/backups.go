package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Backup condition reasons.
const (
	ReasonBackupCompleted = "BackupCompleted"
	ReasonBackupFailed    = "BackupFailed"
	ReasonInvalidSchedule = "InvalidSchedule"
)

// backupJob is a backup Job with what its pod reported.
type backupJob struct {
	job *batchv1.Job
	// done and succeeded come from the Job's conditions.
	done, succeeded bool
	finishedAt      time.Time
	// report is the backup program's termination message: its JSON result, or why it failed.
	report string
}

// listBackupJobs reads the cluster's backup Jobs from the cache.
func (r *KVClusterReconciler) listBackupJobs(ctx context.Context, kvc *kvv1.KVCluster) ([]backupJob, error) {
	var jobs batchv1.JobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(kvc.Namespace),
		client.MatchingLabels{specs.ClusterLabel: kvc.Name}, client.HasLabels{specs.BackupKindLabel}); err != nil {
		return nil, fmt.Errorf("list backup Jobs of %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	out := make([]backupJob, 0, len(jobs.Items))
	for i := range jobs.Items {
		bj := backupJob{job: &jobs.Items[i]}
		bj.done, bj.succeeded, bj.finishedAt = jobOutcome(bj.job)
		out = append(out, bj)
	}
	slices.SortFunc(out, func(a, b backupJob) int { return strings.Compare(a.job.Name, b.job.Name) })
	return out, nil
}

// jobOutcome reads a Job's Complete/Failed condition.
func jobOutcome(job *batchv1.Job) (done, succeeded bool, at time.Time) {
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, true, c.LastTransitionTime.Time
		case batchv1.JobFailed:
			return true, false, c.LastTransitionTime.Time
		}
	}
	return false, false, time.Time{}
}

// jobReport is the termination message of a Job's pod (the backup program's result or error). Pods
// are matched by the Job's UID: an earlier Job of the same name may have left pods behind. A Job
// seen finished before its pod's final status reached the cache is read on the API server when
// fresh (a deletion step reads its report once; a scheduled backup's is read again later).
func (r *KVClusterReconciler) jobReport(ctx context.Context, job *batchv1.Job, fresh bool) (string, error) {
	readers := []client.Reader{r.Client}
	if fresh {
		readers = append(readers, r.APIReader)
	}
	for _, reader := range readers {
		var pods corev1.PodList
		if err := reader.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{batchv1.ControllerUidLabel: string(job.UID)}); err != nil {
			return "", fmt.Errorf("list pods of Job %s/%s: %w", job.Namespace, job.Name, err)
		}
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if t := cs.State.Terminated; t != nil && t.Message != "" {
					return strings.TrimSpace(t.Message), nil
				}
			}
		}
	}
	return "", nil
}

// backupRecord turns a finished Job into the status record users read.
func backupRecord(bj backupJob) kvv1.BackupRecord {
	rec := kvv1.BackupRecord{Job: bj.job.Name, Succeeded: bj.succeeded}
	t := metav1.NewTime(bj.finishedAt.Truncate(time.Second))
	rec.CompletionTime = &t
	var res backup.Result
	if bj.succeeded && json.Unmarshal([]byte(bj.report), &res) == nil {
		rec.Location, rec.Size, rec.SHA256, rec.Revision, rec.EtcdVersion = res.Location, res.Size, res.SHA256, res.Revision, res.EtcdVersion
		rec.Pruned = int32(len(res.Pruned))
		_, rec.WritesFenced = bj.job.Annotations[specs.WritesFencedAnnotation]
		if len(res.Warnings) > 0 {
			rec.Message = "succeeded with warnings: " + strings.Join(res.Warnings, "; ")
		}
		return rec
	}
	rec.Message = bj.report
	if rec.Message == "" {
		rec.Message = "the backup Job failed without a report (see its pod's events): " + jobFailureMessage(bj.job)
	}
	return rec
}

func jobFailureMessage(job *batchv1.Job) string {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// newestFinished is the most recently finished Job, or nil: the only one whose report is read.
func newestFinished(jobs []backupJob) *backupJob {
	var latest *backupJob
	for i := range jobs {
		if bj := &jobs[i]; bj.done && (latest == nil || bj.finishedAt.After(latest.finishedAt)) {
			latest = bj
		}
	}
	return latest
}

// recordFinishedBackups puts the newest finished backup into status: lastBackup (from its report,
// which the caller has read), lastBackupTime (successes only) and the BackupSucceeded condition.
// It returns the record when it is new, so the caller can announce it once.
func recordFinishedBackups(st *kvv1.KVClusterStatus, jobs []backupJob, generation int64) (newest *kvv1.BackupRecord, isNew bool) {
	for i := range jobs {
		if bj := &jobs[i]; bj.done && bj.succeeded {
			t := metav1.NewTime(bj.finishedAt.Truncate(time.Second))
			if st.LastBackupTime == nil || t.After(st.LastBackupTime.Time) {
				st.LastBackupTime = &t
			}
		}
	}
	latest := newestFinished(jobs)
	if latest == nil {
		return nil, false
	}
	rec := backupRecord(*latest)
	isNew = st.LastBackup == nil || st.LastBackup.Job != rec.Job || st.LastBackup.Succeeded != rec.Succeeded
	st.LastBackup = &rec
	cond := metav1.Condition{Type: kvv1.ConditionBackupSucceeded, Status: metav1.ConditionTrue, Reason: ReasonBackupCompleted,
		Message:            strings.TrimSuffix(fmt.Sprintf("backup %s wrote %s (%d bytes, revision %d, sha256 %s); %s", rec.Job, rec.Location, rec.Size, rec.Revision, rec.SHA256, rec.Message), "; "),
		ObservedGeneration: generation, LastTransitionTime: *rec.CompletionTime}
	if !rec.Succeeded {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonBackupFailed, fmt.Sprintf("backup %s failed: %s", rec.Job, rec.Message)
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return &rec, isNew
}

// backupPlan is what the schedule asks for at one moment.
type backupPlan struct {
	// slot is the slot to start a Job for now; zero when none is due.
	slot    time.Time
	skipped int
	next    time.Time
	err     error
}

// planBackup decides from the schedule whether a backup is due now. It is pure. No backup starts
// while another runs or while the cluster is still being created; a slot already started
// (status.lastScheduledTime) never starts again.
func planBackup(kvc *kvv1.KVCluster, running bool, now time.Time) backupPlan {
	b := kvc.Spec.Backup
	sched, err := backup.Parse(kvc.Spec.BackupSchedule, b.TimeZone, now)
	if err != nil {
		return backupPlan{err: err}
	}
	plan := backupPlan{next: sched.Next(now)}
	// Not before the cluster formed (a cluster stopped from the start has nothing to back up).
	if b.Suspend || running || kvc.Status.Phase == kvv1.PhaseCreating || kvc.Status.Phase == "" || kvc.Status.CurrentVersion == "" {
		return plan
	}
	after := kvc.CreationTimestamp.Time
	if t := kvc.Status.LastScheduledTime; t != nil {
		after = t.Time
	}
	plan.slot, plan.skipped = sched.MostRecentSlot(after, now, time.Duration(b.StartingDeadlineSeconds)*time.Second)
	return plan
}

// reconcileBackups records finished backups, starts the due one and prunes Job history. It
// changes st (the status about to be applied) and returns when to look again.
// ownMembers is false when what answers at the members' names is someone else's: no backup of it
// is ever taken.
func (r *KVClusterReconciler) reconcileBackups(ctx context.Context, kvc *kvv1.KVCluster, st *kvv1.KVClusterStatus, now time.Time, ownMembers bool) (time.Duration, error) {
	if kvc.Spec.Backup == nil {
		st.NextBackupTime = nil
		return 0, nil
	}
	// Every finished backup is recorded, scheduled or not (the one taken before an upgrade).
	jobs, err := r.listBackupJobs(ctx, kvc)
	if err != nil {
		return 0, err
	}
	if latest := newestFinished(jobs); latest != nil {
		if latest.report, err = r.jobReport(ctx, latest.job, false); err != nil {
			return 0, err
		}
	}
	if rec, isNew := recordFinishedBackups(st, jobs, kvc.Generation); isNew {
		r.announceBackup(kvc, rec)
	}
	if kvc.Spec.BackupSchedule == "" {
		st.NextBackupTime = nil
		return 0, nil
	}
	running := slices.ContainsFunc(jobs, func(bj backupJob) bool { return !bj.done })
	plan := planBackup(kvc, running, now)
	if !ownMembers {
		plan.slot = time.Time{}
	}
	if plan.err != nil {
		prev := meta.FindStatusCondition(st.Conditions, kvv1.ConditionBackupSucceeded)
		if prev == nil || prev.Reason != ReasonInvalidSchedule {
			r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, ReasonInvalidSchedule, "Schedule", "%v; no backups will run until it is fixed", plan.err)
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: kvv1.ConditionBackupSucceeded, Status: metav1.ConditionFalse,
			Reason: ReasonInvalidSchedule, Message: plan.err.Error() + "; no backups will run until it is fixed",
			ObservedGeneration: kvc.Generation, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))})
		st.NextBackupTime = nil
		return 0, nil
	}
	if !plan.slot.IsZero() {
		name := backup.JobName(kvc.Name, plan.slot)
		if err := r.Client.Apply(ctx, specs.BackupJob(kvc, specs.ScheduledBackupRun(kvc, name), r.BackupImage),
			client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
			return 0, fmt.Errorf("apply backup Job %s/%s: %w", kvc.Namespace, name, err)
		}
		slot := metav1.NewTime(plan.slot)
		st.LastScheduledTime = &slot
		msg := fmt.Sprintf("started backup %s for the slot %s", name, plan.slot.UTC().Format(time.RFC3339))
		if plan.skipped > 0 {
			msg += fmt.Sprintf(" (%d earlier slots were missed and will not run)", plan.skipped)
		}
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, "BackupStarted", "Backup", "%s", msg)
	}
	next := metav1.NewTime(plan.next)
	st.NextBackupTime = &next
	if err := r.pruneBackupJobs(ctx, kvc, jobs); err != nil {
		return 0, err
	}
	return max(plan.next.Sub(now), time.Second), nil
}

func (r *KVClusterReconciler) announceBackup(kvc *kvv1.KVCluster, rec *kvv1.BackupRecord) {
	if rec.Succeeded && rec.Message != "" { // e.g. what killed backups left could not be cleaned up
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, ReasonBackupCompleted, "Backup",
			"backup %s wrote %s (%d bytes, revision %d); retention deleted %d older snapshots; it %s", rec.Job, rec.Location, rec.Size, rec.Revision, rec.Pruned, rec.Message)
		return
	}
	if rec.Succeeded {
		r.Recorder.Eventf(kvc, nil, corev1.EventTypeNormal, ReasonBackupCompleted, "Backup",
			"backup %s wrote %s (%d bytes, revision %d); retention deleted %d older snapshots", rec.Job, rec.Location, rec.Size, rec.Revision, rec.Pruned)
		return
	}
	r.Recorder.Eventf(kvc, nil, corev1.EventTypeWarning, ReasonBackupFailed, "Backup", "backup %s failed: %s", rec.Job, rec.Message)
}

// pruneBackupJobs keeps the newest jobHistoryLimit successful scheduled Jobs and the newest failed one,
// so finished Jobs never pile up. It never touches a running Job or the final backup's.
func (r *KVClusterReconciler) pruneBackupJobs(ctx context.Context, kvc *kvv1.KVCluster, jobs []backupJob) error {
	keep := map[bool]int{true: int(kvc.Spec.Backup.JobHistoryLimit), false: 1}
	finished := slices.DeleteFunc(slices.Clone(jobs), func(bj backupJob) bool {
		return !bj.done || bj.job.Labels[specs.BackupKindLabel] != specs.BackupScheduled
	})
	slices.SortFunc(finished, func(a, b backupJob) int { return b.finishedAt.Compare(a.finishedAt) }) // newest first
	seen := map[bool]int{}
	for _, bj := range finished {
		seen[bj.succeeded]++
		if seen[bj.succeeded] <= keep[bj.succeeded] {
			continue
		}
		if err := r.Client.Delete(ctx, bj.job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete old backup Job %s/%s: %w", bj.job.Namespace, bj.job.Name, err)
		}
	}
	return nil
}
