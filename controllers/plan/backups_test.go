package plan

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// backedUp is a Ready cluster, created at t0-1h, backed up on schedule to a bucket.
func backedUp(schedule string) *kvv1.KVCluster {
	kvc := kvcIn(kvv1.PhaseReady, time.Hour)
	kvc.Status.CurrentVersion = "3.7.3"
	kvc.Spec.BackupSchedule = schedule
	kvc.Spec.Backup = &kvv1.BackupSpec{JobHistoryLimit: 2, S3: &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", CredentialsSecret: "s"}}
	return kvc
}

// backupJobAt is a scheduled backup Job finished (condition "" while it runs) at at.
func backupJobAt(name string, condition batchv1.JobConditionType, at time.Time) Job {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{specs.BackupKindLabel: specs.BackupScheduled}}}
	if condition != "" {
		job.Status.Conditions = []batchv1.JobCondition{{Type: condition, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(at)}}
	}
	return NewJob(job, "")
}

func TestPlanBackups(t *testing.T) {
	created := t0.Add(-time.Hour) // every minute's slot since then is due, the last at t0
	lastRan := func(kvc *kvv1.KVCluster, at time.Time) *kvv1.KVCluster {
		s := metav1.NewTime(at)
		kvc.Status.LastScheduledTime = &s
		return kvc
	}
	creating := backedUp("* * * * *")
	creating.Status.Phase, creating.Status.CurrentVersion = kvv1.PhaseCreating, ""
	suspended := backedUp("* * * * *")
	suspended.Spec.Backup.Suspend = true
	tests := []struct {
		name        string
		kvc         *kvv1.KVCluster
		obs         Observation
		busy        string // a backup Job being started elsewhere
		now         time.Time
		wantJob     string // the Job started, or ""
		wantSkipped string // words of the BackupStarted event
		wantNext    time.Time
		wantRequeue time.Duration
	}{
		{name: "the slot due now starts its Job", kvc: lastRan(backedUp("* * * * *"), t0.Add(-time.Minute)), now: t0.Add(5 * time.Second),
			wantJob: backup.JobName("kv", t0), wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "after an outage only the most recent slot runs; the ten before it are reported missed",
			kvc: lastRan(backedUp("* * * * *"), t0.Add(-11*time.Minute)), now: t0.Add(5 * time.Second),
			wantJob: backup.JobName("kv", t0), wantSkipped: "(10 earlier slots were missed", wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "counted from creation when no slot ran yet", kvc: backedUp("@hourly"), now: created.Add(time.Hour + time.Second),
			wantJob: backup.JobName("kv", created.Add(time.Hour)), wantNext: created.Add(2 * time.Hour), wantRequeue: time.Hour - time.Second},
		{name: "a slot already started never starts again", kvc: lastRan(backedUp("* * * * *"), t0), now: t0.Add(5 * time.Second),
			wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "none while another backup runs", kvc: lastRan(backedUp("* * * * *"), t0.Add(-time.Minute)), now: t0.Add(5 * time.Second),
			obs:      Observation{Jobs: []Job{backupJobAt("kv-1", "", time.Time{})}},
			wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "none while the pre-upgrade backup starts", kvc: lastRan(backedUp("* * * * *"), t0.Add(-time.Minute)), now: t0.Add(5 * time.Second),
			busy: "kv-preupgrade", wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "none while the cluster is created", kvc: creating, now: t0.Add(5 * time.Second), wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "none while suspended", kvc: suspended, now: t0.Add(5 * time.Second), wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
		{name: "never of someone else's members", kvc: lastRan(backedUp("* * * * *"), t0.Add(-time.Minute)), now: t0.Add(5 * time.Second),
			obs: Observation{STSForeign: true}, wantNext: t0.Add(time.Minute), wantRequeue: 55 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := *tt.kvc.Status.DeepCopy()
			got, events, requeue := planBackups(tt.kvc, tt.obs, &st, tt.now, "operator:dev", tt.busy)
			name := ""
			if got.Start != nil {
				name = *got.Start.Name
			}
			if name != tt.wantJob {
				t.Fatalf("Job started = %q, want %q", name, tt.wantJob)
			}
			if name != "" && (st.LastScheduledTime == nil || !strings.Contains(got.Started.Message, name) || !strings.Contains(got.Started.Message, tt.wantSkipped)) {
				t.Errorf("lastScheduledTime %v, event %q; want the slot recorded and announced with %q", st.LastScheduledTime, got.Started.Message, tt.wantSkipped)
			}
			if name == "" && !equality.Semantic.DeepEqual(st.LastScheduledTime, tt.kvc.Status.LastScheduledTime) {
				t.Errorf("lastScheduledTime moved to %v without a Job", st.LastScheduledTime)
			}
			if st.NextBackupTime == nil || !st.NextBackupTime.Time.Equal(tt.wantNext) || requeue != tt.wantRequeue {
				t.Errorf("nextBackupTime %v, requeue %v; want %v, %v", st.NextBackupTime, requeue, tt.wantNext, tt.wantRequeue)
			}
			if name != "" && tt.wantSkipped == "" && strings.Contains(got.Started.Message, "missed") {
				t.Errorf("event %q reports missed slots, want none", got.Started.Message)
			}
			if len(events) != 0 { // nothing finished, nothing invalid
				t.Errorf("events %v, want none", events)
			}
		})
	}
}

func TestAnInvalidScheduleIsAConditionAndOneEvent(t *testing.T) {
	kvc := backedUp("59 23 31 2 *") // passes admission, never fires
	st := *kvc.Status.DeepCopy()
	got, events, requeue := planBackups(kvc, Observation{}, &st, t0, "operator:dev", "")
	cond := meta.FindStatusCondition(st.Conditions, kvv1.ConditionBackupSucceeded)
	if got.Start != nil || requeue != 0 || st.NextBackupTime != nil || cond == nil || cond.Reason != ReasonInvalidSchedule || !strings.Contains(cond.Message, "never fires") {
		t.Fatalf("start %v, requeue %v, next %v, condition %+v; want no backup and the InvalidSchedule condition", got.Start, requeue, st.NextBackupTime, cond)
	}
	if len(events) != 1 || events[0].Reason != ReasonInvalidSchedule || events[0].Type != corev1.EventTypeWarning {
		t.Errorf("events = %+v, want one InvalidSchedule warning", events)
	}
	kvc.Status = st
	if _, events, _ := planBackups(kvc, Observation{}, &st, t0.Add(time.Minute), "operator:dev", ""); len(events) != 0 {
		t.Errorf("the warning repeats on the next reconcile: %+v", events)
	}
}

func TestFinishedBackupsAreRecordedAndPruned(t *testing.T) {
	kvc := backedUp("* * * * *")
	report := `{"location":"s3://b/ns/kv/uid-kv/kv-3.db","size":42,"sha256":"ab","revision":7,"etcdVersion":"3.7.3"}`
	ok := func(name string, at time.Time) Job { return backupJobAt(name, batchv1.JobComplete, at) }
	failed := func(name string, at time.Time) Job { return backupJobAt(name, batchv1.JobFailed, at) }
	newest := ok("kv-5", t0)
	newest.Report = report
	jobs := []Job{ok("kv-1", t0.Add(-5*time.Minute)), failed("kv-2", t0.Add(-4*time.Minute)), ok("kv-3", t0.Add(-3*time.Minute)),
		failed("kv-4", t0.Add(-2*time.Minute)), newest, backupJobAt("kv-6", "", time.Time{})}

	st := *kvc.Status.DeepCopy()
	rec, isNew := RecordFinishedBackups(&st, kvc, jobs)
	if !isNew || rec.Job != "kv-5" || rec.Location != "s3://b/ns/kv/uid-kv/kv-3.db" || rec.Revision != 7 || !st.LastBackupTime.Time.Equal(t0) {
		t.Errorf("recorded %+v at %v, want kv-5's report at %v", rec, st.LastBackupTime, t0)
	}
	kvc.Status = st
	if _, isNew := RecordFinishedBackups(&st, kvc, jobs); isNew {
		t.Error("the same backup is announced twice")
	}

	var pruned []string
	for _, j := range jobsToPrune(kvc, jobs) {
		pruned = append(pruned, j.Name)
	}
	// Two successes (jobHistoryLimit) and one failure are kept; a running Job never goes.
	if slices.Sort(pruned); strings.Join(pruned, ",") != "kv-1,kv-2" {
		t.Errorf("pruned %v, want kv-1 (a third success) and kv-2 (a second failure)", pruned)
	}

	failedLast := append(jobs[:4:4], failed("kv-7", t0.Add(time.Minute)))
	st = *kvc.Status.DeepCopy()
	rec, _ = RecordFinishedBackups(&st, kvc, failedLast)
	cond := meta.FindStatusCondition(st.Conditions, kvv1.ConditionBackupSucceeded)
	if rec.Succeeded || !st.LastBackupTime.Time.Equal(t0) || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonBackupFailed {
		t.Errorf("after a failure: record %+v, lastBackupTime %v, condition %+v; want the failure recorded, lastBackupTime kept", rec, st.LastBackupTime, cond)
	}
}

// TestASlotWhoseJobExistsIsNotStartedAgain: a status written from a cache that lagged behind the
// operator's own last write can take lastScheduledTime back to before a slot whose Job already
// ran. That slot is not started again: re-applying its Job announced a second BackupStarted and,
// once the Job's spec would differ (the members moved to TLS since), failed every reconcile.
func TestASlotWhoseJobExistsIsNotStartedAgain(t *testing.T) {
	kvc := backedUp("* * * * *")
	kvc.CreationTimestamp = metav1.NewTime(t0.Add(-time.Hour))
	before := metav1.NewTime(t0.Add(-time.Minute))
	kvc.Status.LastScheduledTime = &before
	ran := backupJobAt(backup.JobName(kvc.Name, t0), batchv1.JobComplete, t0.Add(20*time.Second))
	st := *kvc.Status.DeepCopy()
	b, events, _ := planBackups(kvc, Observation{Jobs: []Job{ran}}, &st, t0.Add(30*time.Second), "op:1", "")
	if b.Start != nil {
		t.Errorf("the slot's Job %s is started again", *b.Start.Name)
	}
	if st.LastScheduledTime == nil || !st.LastScheduledTime.Time.Equal(t0) {
		t.Errorf("lastScheduledTime %v, want the slot %v recorded again", st.LastScheduledTime, t0)
	}
	for _, e := range events {
		if e.Reason == EventBackupStarted {
			t.Errorf("announced again: %s", e.Message)
		}
	}
}

// TestALongBackupReportStillSaysWhereTheBackupWent: the kubelet keeps 4096 bytes of a termination
// message. A backup whose retention deleted many snapshots at once (keepLast lowered from 67 to 7: two and a half days of hourly backups)
// reports them all; cut mid-JSON, its record would say the backup succeeded but not where it went,
// how large it is or its checksum.
func TestALongBackupReportStillSaysWhereTheBackupWent(t *testing.T) {
	key := "team-a/prod/ledger/4a1b0c7e-1d2f-4e5a-9b8c-7d6e5f4a3b2c/"
	res := backup.Result{Location: "s3://backups/" + key + "ledger-29936105.db", Size: 389152, SHA256: strings.Repeat("ab", 32),
		Revision: 3271, EtcdVersion: "3.7.3", Member: "ledger-1"}
	for i := range 60 {
		res.Pruned = append(res.Pruned, fmt.Sprintf("%sledger-%d.db", key, 29935000+60*i))
	}
	report := string(res.Report())
	const kept = 4096 // the kubelet's limit for one container's termination message
	if len(report) > kept {
		t.Errorf("the report has %d bytes, more than the kubelet keeps", len(report))
		report = report[:kept]
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "ledger-29936105"}}
	rec := BackupRecordOf(Job{Job: job, Done: true, Succeeded: true, FinishedAt: t0, Report: report})
	if rec.Location != res.Location || rec.Size != res.Size || rec.SHA256 != res.SHA256 || rec.Revision != res.Revision || rec.Pruned != 60 {
		t.Errorf("recorded %+v, want where the backup went, its size, checksum, revision and 60 pruned", rec)
	}
}

// onDemandJob is the Job of the backup asked for with token, finished (condition "" while it runs) at at.
func onDemandJob(token string, condition batchv1.JobConditionType, at time.Time) Job {
	j := backupJobAt(specs.OnDemandBackupJobName(backedUp(""), token), condition, at)
	j.Job.Labels[specs.BackupKindLabel] = specs.BackupOnDemand
	j.Job.Annotations = map[string]string{kvv1.AnnotationBackupNow: token}
	return j
}

// TestBackupRequests: kvcluster.io/backup-now=<token> takes one backup per token through the Job
// path of scheduled ones, never two at once, and status.backupRequest says where it stands.
func TestBackupRequests(t *testing.T) {
	asked := func(kvc *kvv1.KVCluster, token string, req *kvv1.BackupRequest) *kvv1.KVCluster {
		kvc.Annotations = map[string]string{kvv1.AnnotationBackupNow: token}
		kvc.Status.BackupRequest = req
		return kvc
	}
	running := func(token string) *kvv1.BackupRequest {
		return &kvv1.BackupRequest{Token: token, State: kvv1.BackupRequestRunning, Job: specs.OnDemandBackupJobName(backedUp(""), token)}
	}
	succeeded := onDemandJob("t1", batchv1.JobComplete, t0)
	succeeded.Report = `{"location":"s3://b/ns/kv/uid-kv/kv-now.db","size":42,"sha256":"ab","revision":7,"etcdVersion":"3.7.3"}`
	creating := backedUp("")
	creating.Status.Phase, creating.Status.CurrentVersion = kvv1.PhaseCreating, ""
	suspended := backedUp("")
	suspended.Spec.Backup.Suspend = true
	unscheduledSlotDue := backedUp("* * * * *")
	collision := onDemandJob("t0", "", time.Time{})
	collision.Job.Name = specs.OnDemandBackupJobName(backedUp(""), "t1")
	tests := []struct {
		name      string
		kvc       *kvv1.KVCluster
		obs       Observation
		busy      string
		wantStart string // the Job started, or ""
		wantState kvv1.BackupRequestState
		wantWords string // in status.backupRequest.message
		wantEvent string // reason of a warning event, or ""
	}{
		{name: "a new token starts its backup", kvc: asked(backedUp(""), "t1", nil),
			wantStart: specs.OnDemandBackupJobName(backedUp(""), "t1"), wantState: kvv1.BackupRequestRunning},
		{name: "suspended schedules do not hold back a backup asked for", kvc: asked(suspended, "t1", nil),
			wantStart: specs.OnDemandBackupJobName(backedUp(""), "t1"), wantState: kvv1.BackupRequestRunning},
		{name: "a token started is not started again while its Job runs", kvc: asked(backedUp(""), "t1", running("t1")),
			obs: Observation{Jobs: []Job{onDemandJob("t1", "", time.Time{})}}, wantState: kvv1.BackupRequestRunning},
		{name: "nor when the cache does not hold its Job yet", kvc: asked(backedUp(""), "t1", running("t1")), wantState: kvv1.BackupRequestRunning},
		{name: "nor when the status write that recorded it was lost", kvc: asked(backedUp(""), "t1",
			&kvv1.BackupRequest{Token: "t0", State: kvv1.BackupRequestSucceeded}),
			obs: Observation{Jobs: []Job{onDemandJob("t1", "", time.Time{})}}, wantState: kvv1.BackupRequestRunning},
		{name: "its finished Job is recorded", kvc: asked(backedUp(""), "t1", running("t1")),
			obs: Observation{Jobs: []Job{succeeded}}, wantState: kvv1.BackupRequestSucceeded},
		{name: "a token answered is not taken again once its Job is pruned", kvc: asked(backedUp(""), "t1",
			&kvv1.BackupRequest{Token: "t1", State: kvv1.BackupRequestSucceeded, Job: "kv-now-1"}), wantState: kvv1.BackupRequestSucceeded},
		{name: "its Job deleted while it ran fails the request", kvc: asked(backedUp(""), "t1", running("t1")),
			obs: Observation{BackupRequestJobGone: true}, wantState: kvv1.BackupRequestFailed, wantWords: "deleted before it finished", wantEvent: ReasonBackupFailed},
		{name: "waits while a scheduled backup runs", kvc: asked(backedUp(""), "t1", nil),
			obs: Observation{Jobs: []Job{backupJobAt("kv-1", "", time.Time{})}}, wantState: kvv1.BackupRequestPending, wantWords: "waiting for backup kv-1 to finish"},
		{name: "waits while the previous token's backup runs", kvc: asked(backedUp(""), "t1", running("t0")),
			obs: Observation{Jobs: []Job{onDemandJob("t0", "", time.Time{})}}, wantState: kvv1.BackupRequestPending,
			wantWords: "waiting for backup " + specs.OnDemandBackupJobName(backedUp(""), "t0")},
		{name: "waits for the slot's backup starting now", kvc: asked(unscheduledSlotDue, "t1", nil),
			wantStart: backup.JobName("kv", t0), wantState: kvv1.BackupRequestPending, wantWords: "waiting for backup " + backup.JobName("kv", t0)},
		{name: "waits for the pre-upgrade backup starting now", kvc: asked(backedUp(""), "t1", nil), busy: "kv-preupgrade",
			wantState: kvv1.BackupRequestPending, wantWords: "waiting for backup kv-preupgrade to finish"},
		{name: "waits for the previous token's backup started a moment ago", kvc: asked(backedUp(""), "t1", running("t0")),
			wantState: kvv1.BackupRequestPending, wantWords: "waiting for backup " + specs.OnDemandBackupJobName(backedUp(""), "t0")},
		{name: "a request started a moment ago holds back the slot due", kvc: asked(backedUp("* * * * *"), "t1", running("t1")),
			wantState: kvv1.BackupRequestRunning},
		{name: "the annotation removed while its backup runs: followed to its end", kvc: asked(backedUp(""), "", running("t1")),
			obs: Observation{Jobs: []Job{succeeded}}, wantState: kvv1.BackupRequestSucceeded},
		{name: "the annotation removed before its backup started: withdrawn", kvc: asked(backedUp(""), "",
			&kvv1.BackupRequest{Token: "t1", State: kvv1.BackupRequestPending, Message: "waiting for backup kv-1 to finish"}),
			wantState: kvv1.BackupRequestFailed, wantWords: "removed before the backup started", wantEvent: ReasonBackupFailed},
		{name: "waits for the cluster to form", kvc: asked(creating, "t1", nil), wantState: kvv1.BackupRequestPending, wantWords: "form"},
		{name: "never of someone else's members", kvc: asked(backedUp(""), "t1", nil), obs: Observation{STSForeign: true},
			wantState: kvv1.BackupRequestPending, wantWords: "not this cluster's"},
		{name: "without spec.backup it fails, saying why", kvc: func() *kvv1.KVCluster {
			kvc := asked(backedUp(""), "t1", nil)
			kvc.Spec.Backup = nil
			return kvc
		}(), wantState: kvv1.BackupRequestFailed, wantWords: "spec.backup is unset", wantEvent: ReasonBackupFailed},
		{name: "a token too long is refused, saying why", kvc: asked(backedUp(""), "t1"+strings.Repeat("0", 62), nil),
			wantState: kvv1.BackupRequestFailed, wantWords: "more than 63", wantEvent: ReasonBackupFailed},
		{name: "a Job of the same name for another token is not taken for this one", kvc: asked(backedUp(""), "t1", nil),
			obs: Observation{Jobs: []Job{collision}}, wantState: kvv1.BackupRequestFailed, wantWords: "set another value", wantEvent: ReasonBackupFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.kvc.CreationTimestamp = metav1.NewTime(t0.Add(-30 * time.Second)) // no slot due unless the schedule is every minute
			st := *tt.kvc.Status.DeepCopy()
			got, events, _ := planBackups(tt.kvc, tt.obs, &st, t0.Add(5*time.Second), "operator:dev", tt.busy)
			start := ""
			if got.Start != nil {
				start = *got.Start.Name
			}
			if start != tt.wantStart {
				t.Fatalf("Job started = %q, want %q", start, tt.wantStart)
			}
			req := st.BackupRequest
			if req == nil || !strings.HasPrefix(req.Token, "t1") || req.State != tt.wantState || !strings.Contains(req.Message, tt.wantWords) {
				t.Fatalf("status.backupRequest = %+v, want token t1 %s with %q", req, tt.wantState, tt.wantWords)
			}
			var warnings []string
			for _, e := range events {
				if e.Type == corev1.EventTypeWarning {
					warnings = append(warnings, e.Reason)
				}
			}
			if want := slices.DeleteFunc([]string{tt.wantEvent}, func(s string) bool { return s == "" }); !slices.Equal(warnings, want) {
				t.Errorf("warnings %v, want %v", warnings, want)
			}
			if slices.ContainsFunc(tt.obs.Jobs, func(j Job) bool { return j.Done }) &&
				(req.Backup == nil || req.Backup.Location != "s3://b/ns/kv/uid-kv/kv-now.db" || req.Backup.Revision != 7) {
				t.Errorf("recorded %+v, want where the backup went and its revision", req.Backup)
			}
			if start == "" || start != specs.OnDemandBackupJobName(tt.kvc, "t1") {
				return
			}
			if !strings.Contains(got.Started.Message, "t1") || req.Job != start {
				t.Errorf("started %s announced %q, recorded as %q; want the token announced and the Job recorded", start, got.Started.Message, req.Job)
			}
			job := got.Start
			if job.Labels[specs.BackupKindLabel] != specs.BackupOnDemand || job.Annotations[kvv1.AnnotationBackupNow] != "t1" {
				t.Errorf("Job labels %v, annotations %v; want kind on-demand and the token", job.Labels, job.Annotations)
			}
			// An on-demand snapshot is kept for good: the Job prunes nothing, and its object is not
			// named like a scheduled one (which retention prunes).
			args := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
			if strings.Contains(args, "--prune-cluster") || regexp.MustCompile(`/kv-[0-9]+\.db`).MatchString(args) {
				t.Errorf("an on-demand backup Job prunes or writes a scheduled object's name: %s", args)
			}
		})
	}

	// A second reconcile with what the first wrote starts nothing more.
	kvc := asked(backedUp(""), "t1", nil)
	st := *kvc.Status.DeepCopy()
	if first, _, _ := planBackups(kvc, Observation{}, &st, t0, "operator:dev", ""); first.Start == nil {
		t.Fatal("the first reconcile starts no backup")
	}
	kvc.Status = st
	for range 3 {
		if again, _, _ := planBackups(kvc, Observation{}, &st, t0.Add(time.Second), "operator:dev", ""); again.Start != nil {
			t.Fatalf("the same token starts %s again", *again.Start.Name)
		}
	}
}

// TestOnDemandBackupJobsArePrunedApart: finished on-demand Jobs are kept like scheduled ones, and
// counted apart, so frequent scheduled backups never prune the Job of the backup a person asked for.
func TestOnDemandBackupJobsArePrunedApart(t *testing.T) {
	kvc := backedUp("* * * * *") // jobHistoryLimit 2
	jobs := []Job{onDemandJob("a", batchv1.JobComplete, t0.Add(-time.Hour)), onDemandJob("b", batchv1.JobComplete, t0.Add(-50*time.Minute)),
		onDemandJob("c", batchv1.JobComplete, t0.Add(-40*time.Minute)), onDemandJob("d", batchv1.JobFailed, t0.Add(-30*time.Minute)),
		backupJobAt("kv-1", batchv1.JobComplete, t0.Add(-3*time.Minute)), backupJobAt("kv-2", batchv1.JobComplete, t0.Add(-2*time.Minute)),
		backupJobAt("kv-3", batchv1.JobComplete, t0.Add(-time.Minute)), onDemandJob("e", "", time.Time{})}
	var pruned []string
	for _, j := range jobsToPrune(kvc, jobs) {
		pruned = append(pruned, j.Name)
	}
	want := []string{"kv-1", specs.OnDemandBackupJobName(kvc, "a")}
	slices.Sort(want)
	if slices.Sort(pruned); !slices.Equal(pruned, want) {
		t.Errorf("pruned %v, want %v: the oldest scheduled one and the oldest on-demand one", pruned, want)
	}
}

// A slot that falls, or a backup asked for, while the cluster is created starts once it has
// formed, within the reconcile that finds it formed: that reconcile's own requeue (at the next
// slot, or the minute's poll) would wait until the next slot made the slot a missed one, though
// nothing kept it from starting.
// Seen in the chaos test on 2026-12-05 (seed 1796500247459596096): operator restarts and a frozen
// member made the cluster form 20-odd seconds after its first slot, which never ran.
func TestBackupsDueWhileCreatingStartWhenTheClusterForms(t *testing.T) {
	stillForming := func(s *scenario) { s.obs.Cluster.Members = s.obs.Cluster.Members[:1] }
	for _, tt := range []struct {
		name     string
		change   func(s *scenario)
		schedule string
		request  string // a kvcluster.io/backup-now value set while it was created
		wantJob  func(kvc *kvv1.KVCluster) string
	}{
		{name: "formed now: the slot starts", change: func(*scenario) {}, schedule: "* * * * *",
			wantJob: func(*kvv1.KVCluster) string { return backup.JobName("kv", t0) }},
		{name: "still forming: the slot waits", change: stillForming, schedule: "* * * * *", wantJob: func(*kvv1.KVCluster) string { return "" }},
		{name: "formed now: a backup asked for meanwhile starts", change: func(*scenario) {}, request: "t1",
			wantJob: func(kvc *kvv1.KVCluster) string { return specs.OnDemandBackupJobName(kvc, "t1") }},
		{name: "still forming: the request waits", change: stillForming, request: "t1", wantJob: func(*kvv1.KVCluster) string { return "" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := formed(3, "3.7.3").with(tt.change)
			// Created 30 s before the slot t0; it has been Creating since.
			s.kvc.CreationTimestamp = metav1.NewTime(t0.Add(-30 * time.Second))
			progress := metav1.NewTime(t0.Add(-30 * time.Second))
			s.kvc.Status.Phase, s.kvc.Status.CurrentVersion, s.kvc.Status.LastProgressTime = kvv1.PhaseCreating, "", &progress
			s.kvc.Spec.BackupSchedule = tt.schedule
			s.kvc.Spec.Backup = &kvv1.BackupSpec{S3: &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "b", CredentialsSecret: "s"}}
			if tt.request != "" {
				s.kvc.Annotations = map[string]string{kvv1.AnnotationBackupNow: tt.request}
			}
			now := t0.Add(20 * time.Second)
			p := Make(s.kvc, s.obs, now, Config{Images: specs.Images{EtcdRepository: "etcd", Operator: "operator:dev"}})
			job := ""
			if p.Backups.Start != nil {
				job = *p.Backups.Start.Name
			}
			if want := tt.wantJob(s.kvc); job != want {
				t.Fatalf("phase %s: Job started %q, want %q (requeue %v)", p.Status.Phase, job, want, p.RequeueAfter)
			}
			if job == "" && p.Status.Phase != kvv1.PhaseCreating {
				t.Fatalf("phase %s, want Creating: the case does not test a cluster still forming", p.Status.Phase)
			}
			// What keeps a retried reconcile from starting them again.
			if job != "" && tt.schedule != "" && (p.Status.LastScheduledTime == nil || !p.Status.LastScheduledTime.Time.Equal(t0)) {
				t.Errorf("lastScheduledTime %v, want the slot %v recorded", p.Status.LastScheduledTime, t0)
			}
			if job != "" && tt.request != "" && (p.Status.BackupRequest == nil || p.Status.BackupRequest.Job != job) {
				t.Errorf("backupRequest %+v, want its Job %s recorded", p.Status.BackupRequest, job)
			}
		})
	}
}
