package plan

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Backups is what the schedule asks for now.
type Backups struct {
	// Start is the Job of the slot due now; nil when none is.
	Start *batchv1ac.JobApplyConfiguration
	// Started is the event that announces Start once it is applied.
	Started Event
	// Prune are finished scheduled Jobs beyond the history limits, to delete.
	Prune []*batchv1.Job
}

// slot is what the schedule asks for at one moment.
type slot struct {
	// at is the slot to start a Job for now; zero when none is due.
	at      time.Time
	skipped int
	next    time.Time
	err     error
}

// dueSlot decides from the schedule whether a backup is due now. No backup starts while another
// runs or while the cluster is still being created (formed: as this reconcile found it); a slot
// already started (status.lastScheduledTime) never starts again.
func dueSlot(kvc *kvv1.KVCluster, running, formed bool, now time.Time) slot {
	b := kvc.Spec.Backup
	sched, err := backup.Parse(kvc.Spec.BackupSchedule, b.TimeZone, now)
	if err != nil {
		return slot{err: err}
	}
	s := slot{next: sched.Next(now)}
	if b.Suspend || running || !formed {
		return s
	}
	after := kvc.CreationTimestamp.Time
	if t := kvc.Status.LastScheduledTime; t != nil {
		after = t.Time
	}
	s.at, s.skipped = sched.MostRecentSlot(after, now, time.Duration(b.StartingDeadlineSeconds)*time.Second)
	return s
}

// formedForBackups: the cluster has formed, so there is something to back up (a cluster stopped
// from the start has nothing). It is asked of the status this reconcile writes, st: a slot that
// fell while the cluster was created starts in the reconcile that finds it formed, where its
// status as read would make it wait for that reconcile's requeue, as late as the next slot,
// which then finds it missed.
func formedForBackups(st *kvv1.KVClusterStatus) bool {
	return st.Phase != kvv1.PhaseCreating && st.Phase != "" && st.CurrentVersion != ""
}

// planBackups records finished backups in st (the status about to be written), decides the Job
// to start now (a schedule slot's, or the one asked for with kvcluster.io/backup-now) and the Jobs
// to prune, and says when to look again (0: no schedule). busy names a backup Job being started
// elsewhere in this reconcile (the pre-upgrade one), "" if none: two backups never run at once.
func planBackups(kvc *kvv1.KVCluster, obs Observation, st *kvv1.KVClusterStatus, now time.Time, image, busy string) (Backups, []Event, time.Duration) {
	var out Backups
	var events []Event
	var requeue time.Duration
	if kvc.Spec.Backup == nil {
		st.NextBackupTime = nil
	} else {
		// Every finished backup is recorded, whichever kind it is.
		if rec, isNew := RecordFinishedBackups(st, kvc, obs.Jobs); isNew {
			events = append(events, backupEvent(rec))
		}
		if i := slices.IndexFunc(obs.Jobs, func(j Job) bool { return !j.Done }); busy == "" && i >= 0 {
			busy = obs.Jobs[i].Job.Name
		}
		// A request's Job started a moment ago may not be in the cache yet.
		if r := kvc.Status.BackupRequest; busy == "" && r != nil && r.State == kvv1.BackupRequestRunning && r.Job != "" && !obs.BackupRequestJobGone &&
			!slices.ContainsFunc(obs.Jobs, func(j Job) bool { return j.Job.Name == r.Job }) {
			busy = r.Job
		}
		var scheduleEvents []Event
		out, scheduleEvents, requeue = planSchedule(kvc, obs, st, now, image, busy)
		events = append(events, scheduleEvents...)
		if out.Start != nil {
			busy = *out.Start.Name
		}
		out.Prune = jobsToPrune(kvc, obs.Jobs)
	}
	if start, started, requestEvents := answerBackupRequest(kvc, obs, st, now, image, busy); start != nil {
		out.Start, out.Started = start, started
	} else {
		events = append(events, requestEvents...)
	}
	return out, events, requeue
}

// planSchedule decides whether a slot of backupSchedule is due now (never while busy names a
// running backup), and when the next one is. No backup is taken when what answers at the members'
// names is someone else's (obs.STSForeign).
func planSchedule(kvc *kvv1.KVCluster, obs Observation, st *kvv1.KVClusterStatus, now time.Time, image, busy string) (Backups, []Event, time.Duration) {
	var out Backups
	if kvc.Spec.BackupSchedule == "" {
		st.NextBackupTime = nil
		return out, nil, 0
	}
	var events []Event
	s := dueSlot(kvc, busy != "", formedForBackups(st), now)
	if obs.STSForeign {
		s.at = time.Time{}
	}
	if s.err != nil {
		why := s.err.Error() + "; no backups will run until it is fixed"
		if prev := meta.FindStatusCondition(st.Conditions, kvv1.ConditionBackupSucceeded); prev == nil || prev.Reason != ReasonInvalidSchedule {
			events = append(events, Event{Type: corev1.EventTypeWarning, Reason: ReasonInvalidSchedule, Action: "Schedule", Message: why})
		}
		SetCondition(st, kvc, kvv1.ConditionBackupSucceeded, false, ReasonInvalidSchedule, why, now)
		st.NextBackupTime = nil
		return out, events, 0
	}
	name := backup.JobName(kvc.Name, s.at)
	if !s.at.IsZero() && slices.ContainsFunc(obs.Jobs, func(j Job) bool { return j.Job.Name == name }) {
		// Started already: a status written from a cache behind the operator's last write took
		// lastScheduledTime back. Its Job is not applied again (its spec may differ by now).
		at := metav1.NewTime(s.at)
		st.LastScheduledTime, s.at = &at, time.Time{}
	}
	if !s.at.IsZero() {
		run := specs.ScheduledBackupRun(kvc, name)
		run.ClientScheme = obs.ClientScheme(kvc)
		out.Start = specs.BackupJob(kvc, run, image)
		at := metav1.NewTime(s.at)
		st.LastScheduledTime = &at
		msg := fmt.Sprintf("started backup %s for the slot %s", name, s.at.UTC().Format(time.RFC3339))
		if s.skipped > 0 {
			msg += fmt.Sprintf(" (%d earlier slots were missed and will not run)", s.skipped)
		}
		out.Started = Event{Type: corev1.EventTypeNormal, Reason: EventBackupStarted, Action: "Backup", Message: msg}
	}
	next := metav1.NewTime(s.next)
	st.NextBackupTime = &next
	return out, events, max(s.next.Sub(now), time.Second)
}

// answerBackupRequest follows the backup asked for with kvcluster.io/backup-now in
// st.BackupRequest, and returns its Job when it is to start now. A value is answered once: the
// request it made is recorded with its token, and its Job's name follows from the token, so
// neither a retried reconcile nor a status written from a stale cache starts a second backup. A
// new request waits while busy names a running backup and until the cluster has formed.
func answerBackupRequest(kvc *kvv1.KVCluster, obs Observation, st *kvv1.KVClusterStatus, now time.Time, image, busy string) (*batchv1ac.JobApplyConfiguration, Event, []Event) {
	prev := st.BackupRequest
	token := kvc.Annotations[kvv1.AnnotationBackupNow]
	withdrawn := token == "" // the annotation went: a backup running is followed to its end; none starts
	if withdrawn {
		if prev == nil || prev.State == kvv1.BackupRequestSucceeded || prev.State == kvv1.BackupRequestFailed {
			return nil, Event{}, nil
		}
		token = prev.Token
	}
	req := &kvv1.BackupRequest{Token: token, State: kvv1.BackupRequestPending}
	if prev != nil && prev.Token == token {
		req = prev.DeepCopy()
	}
	name := specs.OnDemandBackupJobName(kvc, token)
	i := slices.IndexFunc(obs.Jobs, func(j Job) bool { return j.Job.Name == name })
	switch {
	case i >= 0 && obs.Jobs[i].Job.Annotations[kvv1.AnnotationBackupNow] != token:
		req.State, req.Job, req.Message = kvv1.BackupRequestFailed, "", fmt.Sprintf("the Job %s of this request's name was started for %s=%s: "+
			"set another value to take a backup", name, kvv1.AnnotationBackupNow, obs.Jobs[i].Job.Annotations[kvv1.AnnotationBackupNow])
	case i >= 0:
		req.Job, req.Message = name, ""
		switch j := obs.Jobs[i]; {
		case !j.Done:
			req.State = kvv1.BackupRequestRunning
		case req.Backup == nil || req.Backup.Job != name || req.State == kvv1.BackupRequestRunning:
			rec := BackupRecordOf(j)
			req.State, req.Backup = kvv1.BackupRequestFailed, &rec
			if rec.Succeeded {
				req.State = kvv1.BackupRequestSucceeded
			} else {
				req.Message = rec.Message
			}
		}
	case req.State == kvv1.BackupRequestSucceeded || req.State == kvv1.BackupRequestFailed:
		// Answered; its Job may have been pruned since.
	case req.State == kvv1.BackupRequestRunning && obs.BackupRequestJobGone:
		req.State, req.Message = kvv1.BackupRequestFailed, fmt.Sprintf("the Job %s was deleted before it finished: set a new value of %s to take another backup",
			req.Job, kvv1.AnnotationBackupNow)
	case req.State == kvv1.BackupRequestRunning:
		// Started a moment ago: the cache does not hold its Job yet.
	case withdrawn:
		req.State, req.Message = kvv1.BackupRequestFailed, kvv1.AnnotationBackupNow+" was removed before the backup started"
	case len(token) > kvv1.MaxBackupNowToken:
		req.State, req.Message = kvv1.BackupRequestFailed, fmt.Sprintf("the value of %s has %d characters, more than %d: set a shorter one, e.g. the date",
			kvv1.AnnotationBackupNow, len(token), kvv1.MaxBackupNowToken)
	case kvc.Spec.Backup == nil:
		req.State, req.Message = kvv1.BackupRequestFailed, "spec.backup is unset: there is nowhere to write the backup; set spec.backup (s3 or pvc) and a new value of "+
			kvv1.AnnotationBackupNow
	case !formedForBackups(st):
		req.Message = "waiting for the cluster to form"
	case obs.STSForeign:
		req.Message = "waiting: what answers at the members' names is not this cluster's, so it is not backed up"
	case busy != "":
		req.Message = fmt.Sprintf("waiting for backup %s to finish", busy)
	default:
		req.State, req.Job, req.Message = kvv1.BackupRequestRunning, name, ""
		st.BackupRequest = req
		return specs.OnDemandBackupJob(kvc, token, obs.ClientScheme(kvc), image, now), Event{Type: corev1.EventTypeNormal, Reason: EventBackupStarted,
			Action: "Backup", Message: fmt.Sprintf("started backup %s, asked for with %s=%s", name, kvv1.AnnotationBackupNow, token)}, nil
	}
	st.BackupRequest = req
	var events []Event
	if req.State == kvv1.BackupRequestFailed && req.Backup == nil && (prev == nil || prev.Token != token || prev.State != kvv1.BackupRequestFailed) {
		events = append(events, Event{Type: corev1.EventTypeWarning, Reason: ReasonBackupFailed, Action: "Backup", Message: fmt.Sprintf(
			"the backup asked for with %s=%s is not taken: %s", kvv1.AnnotationBackupNow, token, req.Message)})
	}
	return nil, Event{}, events
}

// jobsToPrune keeps, of scheduled and of on-demand backups each, the newest jobHistoryLimit
// successful Jobs and the newest failed one, so finished Jobs never pile up. It never picks a
// running Job, nor a pre-upgrade or final one.
func jobsToPrune(kvc *kvv1.KVCluster, jobs []Job) []*batchv1.Job {
	keep := map[bool]int{true: int(kvc.Spec.Backup.JobHistoryLimit), false: 1}
	finished := slices.DeleteFunc(slices.Clone(jobs), func(j Job) bool {
		kind := j.Job.Labels[specs.BackupKindLabel]
		return !j.Done || kind != specs.BackupScheduled && kind != specs.BackupOnDemand
	})
	slices.SortFunc(finished, func(a, b Job) int { return b.FinishedAt.Compare(a.FinishedAt) }) // newest first
	type group struct {
		kind      string
		succeeded bool
	}
	seen := map[group]int{}
	var prune []*batchv1.Job
	for _, j := range finished {
		g := group{j.Job.Labels[specs.BackupKindLabel], j.Succeeded}
		seen[g]++
		if seen[g] > keep[j.Succeeded] {
			prune = append(prune, j.Job)
		}
	}
	return prune
}

// NewestFinished is the most recently finished Job, or nil: the only one whose report is read.
func NewestFinished(jobs []Job) *Job {
	var latest *Job
	for i := range jobs {
		if j := &jobs[i]; j.Done && (latest == nil || j.FinishedAt.After(latest.FinishedAt)) {
			latest = j
		}
	}
	return latest
}

// RecordFinishedBackups puts the newest finished backup into status: lastBackup (from its report),
// lastBackupTime (successes only) and the BackupSucceeded condition. It returns the record, and
// whether it is new, so it is announced once.
func RecordFinishedBackups(st *kvv1.KVClusterStatus, kvc *kvv1.KVCluster, jobs []Job) (newest *kvv1.BackupRecord, isNew bool) {
	for _, j := range jobs {
		if j.Done && j.Succeeded {
			t := metav1.NewTime(j.FinishedAt.Truncate(time.Second))
			if st.LastBackupTime == nil || t.After(st.LastBackupTime.Time) {
				st.LastBackupTime = &t
			}
		}
	}
	latest := NewestFinished(jobs)
	if latest == nil {
		return nil, false
	}
	rec := BackupRecordOf(*latest)
	isNew = st.LastBackup == nil || st.LastBackup.Job != rec.Job || st.LastBackup.Succeeded != rec.Succeeded
	st.LastBackup = &rec
	if rec.Succeeded {
		SetCondition(st, kvc, kvv1.ConditionBackupSucceeded, true, ReasonBackupCompleted, strings.TrimSuffix(fmt.Sprintf(
			"backup %s wrote %s (%d bytes, revision %d, sha256 %s); %s", rec.Job, rec.Location, rec.Size, rec.Revision, rec.SHA256, rec.Message), "; "),
			rec.CompletionTime.Time)
	} else {
		SetCondition(st, kvc, kvv1.ConditionBackupSucceeded, false, ReasonBackupFailed,
			fmt.Sprintf("backup %s failed: %s", rec.Job, rec.Message), rec.CompletionTime.Time)
	}
	return &rec, isNew
}

// BackupRecordOf turns a finished backup Job (with its report) into the record users read.
func BackupRecordOf(j Job) kvv1.BackupRecord {
	rec := kvv1.BackupRecord{Job: j.Job.Name, Succeeded: j.Succeeded}
	t := metav1.NewTime(j.FinishedAt.Truncate(time.Second))
	rec.CompletionTime = &t
	if j.Job.Status.StartTime != nil {
		rec.StartTime = &metav1.Time{Time: j.Job.Status.StartTime.Truncate(time.Second)}
	}
	var res backup.Result
	if j.Succeeded && json.Unmarshal([]byte(j.Report), &res) == nil {
		rec.Location, rec.Size, rec.SHA256, rec.Revision, rec.EtcdVersion = res.Location, res.Size, res.SHA256, res.Revision, res.EtcdVersion
		rec.Pruned = int32(max(res.PrunedCount, len(res.Pruned)))
		_, rec.WritesFenced = j.Job.Annotations[specs.WritesFencedAnnotation]
		if len(res.Warnings) > 0 {
			rec.Message = "succeeded with warnings: " + strings.Join(res.Warnings, "; ")
		}
		return rec
	}
	rec.Message = j.Report
	if rec.Message == "" {
		rec.Message = "the backup Job failed without a report (see its pod's events): " + JobFailureMessage(j.Job)
	}
	return rec
}

// JobFailureMessage is the reason and message of a Job's Failed condition.
func JobFailureMessage(job *batchv1.Job) string {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// backupEvent announces a finished backup.
func backupEvent(rec *kvv1.BackupRecord) Event {
	switch {
	case rec.Succeeded && rec.Message != "": // e.g. what killed backups left could not be cleaned up
		return Event{Type: corev1.EventTypeWarning, Reason: ReasonBackupCompleted, Action: "Backup", Message: fmt.Sprintf(
			"backup %s wrote %s (%d bytes, revision %d); retention deleted %d older snapshots; it %s", rec.Job, rec.Location, rec.Size, rec.Revision, rec.Pruned, rec.Message)}
	case rec.Succeeded:
		return Event{Type: corev1.EventTypeNormal, Reason: ReasonBackupCompleted, Action: "Backup", Message: fmt.Sprintf(
			"backup %s wrote %s (%d bytes, revision %d); retention deleted %d older snapshots", rec.Job, rec.Location, rec.Size, rec.Revision, rec.Pruned)}
	}
	return Event{Type: corev1.EventTypeWarning, Reason: ReasonBackupFailed, Action: "Backup", Message: fmt.Sprintf("backup %s failed: %s", rec.Job, rec.Message)}
}
