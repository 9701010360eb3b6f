package plan

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	"k8s.io/utils/ptr"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// WantsFinalBackup: a destination is configured and the policy is not Skip.
func WantsFinalBackup(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.Backup != nil && kvc.Spec.Backup.FinalBackup != kvv1.FinalBackupSkip
}

// SkipsFinalBackup: the person deleting asked to go without it.
func SkipsFinalBackup(kvc *kvv1.KVCluster) bool {
	return kvc.Annotations[kvv1.AnnotationSkipFinalBackup] == "true"
}

// WantsFinalizer: some step must run on deletion before the members go.
func WantsFinalizer(kvc *kvv1.KVCluster) bool {
	return WantsFinalBackup(kvc) || kvc.Spec.Deregistration != nil
}

// BlocksOnFailure: the user chose to keep the KVCluster rather than lose a deletion step.
func BlocksOnFailure(kvc *kvv1.KVCluster) bool {
	return kvc.Spec.Backup != nil && kvc.Spec.Backup.OnFinalBackupFailure == kvv1.FinalBackupBlock && !SkipsFinalBackup(kvc)
}

// fenceRetries is how long a fence etcd refuses is tried again before the final backup goes on
// without it.
const fenceRetries = 30 * time.Second

// DeletionObservation is what one pass over a deleted cluster's steps saw, read before anything
// is decided, and what the pass has done so far (Acted), so planning again goes on from there.
type DeletionObservation struct {
	// NamespaceGone: the cluster's namespace is being deleted, so its pods and claims are going
	// and no Job can start there.
	NamespaceGone bool
	// Orphaning: deleted with --cascade=orphan, the members are meant to keep running.
	Orphaning bool
	// OwnMembers: this cluster formed, and its StatefulSet is its own. Otherwise whatever answers
	// at its members' names is someone else's: it is neither fenced nor backed up.
	OwnMembers bool
	// Guard is the UID of this incarnation's deletion guard; "" without one.
	Guard types.UID
	// ClientServiceWritable: the client Service exists, is this cluster's and is not being
	// deleted, so clients reach the members through it. DrainedAt is the drain's start recorded
	// on it, or nil.
	ClientServiceWritable bool
	DrainedAt             *time.Time
	// Jobs are the steps' Jobs that exist, by name, the finished ones with their reports.
	Jobs map[string]StepJob
	// ClientScheme is how the members are reached now (see Observation.ClientScheme): a cluster
	// deleted while it moves to TLS is fenced and backed up in the scheme every member accepts.
	ClientScheme string
	// Acted is what this pass has already done.
	Acted Acted
}

// StepJob is a deletion step's Job as observed.
type StepJob struct {
	Job
	// NotOurs says whose it is when it is not this KVCluster's; "" when it is.
	NotOurs string
}

// Acted is the outcome of the actions a pass has taken (a drain shows in DrainedAt).
type Acted struct {
	// Fenced is the outcome of fencing writes, nil before it was tried.
	Fenced *Fence
	// Started are the outcomes of starting step Jobs, by name.
	Started map[string]error
}

// Fence is the outcome of fencing writes: the revision they were fenced at, or why not.
type Fence struct {
	Revision int64
	Err      error
}

// DeletionActionKind is the one thing a deletion step needs done now.
type DeletionActionKind int

const (
	// DrainClients applies the client Service selecting no member, with the drain's start.
	DrainClients DeletionActionKind = iota + 1
	// FenceWrites raises the alarm under which etcd refuses writes.
	FenceWrites
	// StartJob applies the step's Job.
	StartJob
)

// DeletionAction is what act does for the first unfinished step.
type DeletionAction struct {
	Kind DeletionActionKind
	// DrainedAt is when the drain begins (DrainClients).
	DrainedAt time.Time
	// Job is the Job to start (StartJob).
	Job *batchv1ac.JobApplyConfiguration
}

// DeletionPass is the plan of one pass over the deletion steps.
type DeletionPass struct {
	// Status is the status to write: the steps' records, the final backup's.
	Status kvv1.KVClusterStatus
	// Action is what the first unfinished step needs done now; nil when it waits, or all are done.
	Action *DeletionAction
	// Err is an error to retry with backoff (a Job that could not be started yet), after the
	// status is written.
	Err error
	// Done: every step is finished; the guard goes (DeleteGuard) or, members orphaned on purpose,
	// stays marked as theirs (OrphanGuard), and the finalizer is removed.
	Done                     bool
	DeleteGuard, OrphanGuard bool
	// Events announce what changed, once. With an Action, they are the earlier steps' (the pass
	// is planned again after the action, unless it fails).
	Events []Event
	// Lost is set when the final backup is given up, for the operator's log and metrics, which
	// outlive a deleted namespace where events cannot be written.
	Lost *LostBackup
}

// LostBackup says why a cluster goes without its final backup. Reason is the metric's label.
type LostBackup struct {
	Reason, Why, Lost string
}

// deletionStep is a row of the deletion steps' table.
type deletionStep struct {
	name kvv1.DeletionStepName
	// job and jobName build the step's Job (none for the drain, which acts on the client Service
	// and etcd).
	job     func(status kvv1.KVClusterStatus) *batchv1ac.JobApplyConfiguration
	jobName string
	// limit is how long the step may take to start after the previous one ended, and to run.
	limit time.Duration
	// skipped says why a wanted step is skipped, or "".
	skipped string
}

// deletion is what one pass over the deletion steps works with.
type deletion struct {
	kvc *kvv1.KVCluster
	obs DeletionObservation
	now time.Time
	// blocking: a failed step holds the deletion (onFinalBackupFailure: Block), except in a
	// namespace being deleted, where nothing can be protected any more.
	blocking bool
	status   kvv1.KVClusterStatus
}

// Deletion plans one pass over a deleted cluster's steps: drain the clients and fence writes,
// take the final backup, deregister; each step starts once the one before has ended, and its
// time limit counts from its own start. Unless the user chose Block, a step that cannot start,
// fails or times out is given up, so a GitOps prune never hangs.
func Deletion(kvc *kvv1.KVCluster, obs DeletionObservation, now time.Time, cfg Config) DeletionPass {
	d := &deletion{kvc: kvc, obs: obs, now: now, status: *kvc.Status.DeepCopy(),
		blocking: BlocksOnFailure(kvc) && !obs.NamespaceGone}
	var p DeletionPass
	since := kvc.DeletionTimestamp.Time
	for _, step := range d.steps(cfg) {
		before, _ := FindStep(kvc.Status.Deletion, step.name)
		rec := before
		rec.Name = step.name
		switch {
		case step.skipped != "" && rec.Outcome == kvv1.DeletionSkipped && rec.Message == step.skipped: // said already
		case step.skipped != "":
			rec = kvv1.DeletionStep{Name: step.name, Outcome: kvv1.DeletionSkipped, CompletionTime: d.stamp(), Message: step.skipped}
		case !d.done(rec):
			if step.name == kvv1.StepDrain {
				rec, p.Action = d.drain(rec)
			} else {
				rec, p.Action, p.Err = d.jobStep(step, rec, since)
			}
			if p.Action != nil || p.Err != nil {
				// This step's record waits for the action's outcome (planned again with it), or
				// for the retry; what the earlier steps did is kept.
				p.Status = d.status
				return p
			}
		}
		setStep(&d.status.Deletion, rec)
		if rec.Outcome == kvv1.DeletionFailed && d.blocking {
			SetCondition(&d.status, kvc, kvv1.ConditionBackupSucceeded, false, ReasonFinalBackupFailed, blockedMessage(rec), now)
		}
		d.announce(&p, before, rec)
		if !d.done(rec) {
			p.Status = d.status
			return p
		}
		if rec.CompletionTime != nil {
			since = rec.CompletionTime.Time
		}
	}
	p.Status, p.Done = d.status, true
	// In a namespace being deleted the guard goes with everything else.
	p.DeleteGuard, p.OrphanGuard = !obs.Orphaning && !obs.NamespaceGone, obs.Orphaning && obs.Guard != ""
	return p
}

func (d *deletion) stamp() *metav1.Time {
	t := metav1.NewTime(d.now.Truncate(time.Second))
	return &t
}

// done: the step needs nothing more. A failure is final unless the deletion blocks on it.
func (d *deletion) done(rec kvv1.DeletionStep) bool {
	switch rec.Outcome {
	case kvv1.DeletionSucceeded, kvv1.DeletionSkipped:
		return true
	case kvv1.DeletionFailed:
		return !d.blocking
	}
	return false
}

// steps is the table of this cluster's deletion steps, in order.
func (d *deletion) steps(cfg Config) []deletionStep {
	kvc, obs := d.kvc, d.obs
	var steps []deletionStep
	if kvc.Spec.Backup != nil && !WantsFinalBackup(kvc) {
		steps = append(steps, deletionStep{name: kvv1.StepFinalBackup, skipped: "finalBackup: Skip"})
	}
	if WantsFinalBackup(kvc) {
		skipped, skipDrain := "", ""
		switch {
		case obs.Orphaning:
			skipped = "deleted with --cascade=orphan: the members keep running, with their data"
			skipDrain = skipped
		case obs.NamespaceGone: // its members may be gone already: the loss is the namespace's deletion
			skipDrain = "the namespace is being deleted: no final backup can be taken"
		case !obs.OwnMembers:
			skipped = "the cluster has no members of its own (it never formed, or its StatefulSet is missing or someone else's): there is nothing to back up"
			skipDrain = skipped
		case SkipsFinalBackup(kvc):
			skipped = "annotation " + kvv1.AnnotationSkipFinalBackup + "=true"
			skipDrain = skipped
		}
		steps = append(steps,
			deletionStep{name: kvv1.StepDrain, skipped: skipDrain},
			deletionStep{name: kvv1.StepFinalBackup, skipped: skipped, jobName: specs.FinalBackupJobName(kvc),
				limit: time.Duration(kvc.Spec.Backup.FinalBackupTimeoutSeconds) * time.Second,
				job: func(status kvv1.KVClusterStatus) *batchv1ac.JobApplyConfiguration {
					run := specs.FinalBackupRun(kvc, d.now)
					run.Guard, run.ClientScheme = obs.Guard, obs.ClientScheme
					if drain, ok := FindStep(status.Deletion, kvv1.StepDrain); ok && drain.Revision > 0 {
						run.Annotations = map[string]string{specs.WritesFencedAnnotation: strconv.FormatInt(drain.Revision, 10)}
					}
					return specs.BackupJob(kvc, run, cfg.Images.Operator)
				}})
	}
	if kvc.Spec.Deregistration != nil {
		skipped := ""
		if obs.Orphaning {
			skipped = "deleted with --cascade=orphan: the members keep running"
		}
		steps = append(steps, deletionStep{name: kvv1.StepDeregistration, skipped: skipped, jobName: specs.DeregistrationJobName(kvc),
			limit: time.Duration(kvc.Spec.Deregistration.TimeoutSeconds) * time.Second,
			job: func(kvv1.KVClusterStatus) *batchv1ac.JobApplyConfiguration {
				return specs.DeregistrationJob(kvc, cfg.Images.Operator, obs.Guard)
			}})
	}
	return steps
}

// drain stops new client connections (the client Service selects no member), gives clients
// backup.drainSeconds, then fences writes, so the final backup holds the cluster's last state.
// The drain's start is kept on the client Service, written before anything else.
func (d *deletion) drain(rec kvv1.DeletionStep) (kvv1.DeletionStep, *DeletionAction) {
	grace := time.Duration(ptr.Deref(d.kvc.Spec.Backup.DrainSeconds, 10)) * time.Second
	since := rec.StartTime
	if at := d.obs.DrainedAt; at != nil {
		since = &metav1.Time{Time: *at}
	}
	if since == nil {
		since = d.stamp()
		if d.obs.ClientServiceWritable { // else no one reaches the members through it
			return rec, &DeletionAction{Kind: DrainClients, DrainedAt: since.Time}
		}
	}
	rec.StartTime = since
	if d.now.Before(since.Add(grace)) {
		rec.Outcome, rec.Message = kvv1.DeletionRunning, fmt.Sprintf(
			"the client Service takes no new connections; clients have %s to finish before writes are fenced", grace)
		return rec, nil
	}
	fence := d.obs.Acted.Fenced
	if fence == nil {
		return rec, &DeletionAction{Kind: FenceWrites}
	}
	if fence.Err != nil && d.now.Before(since.Add(grace+fenceRetries)) {
		rec.Outcome, rec.Message = kvv1.DeletionRunning, "fencing writes failed, retrying: "+fence.Err.Error()
		return rec, nil
	}
	rec.Outcome, rec.CompletionTime = kvv1.DeletionSucceeded, d.stamp()
	if fence.Err != nil {
		rec.Message = "writes are not fenced (" + fence.Err.Error() + "): writes acknowledged after the final backup began are not in it"
		return rec, nil
	}
	rec.Revision, rec.Message = fence.Revision, fmt.Sprintf("clients drained for %s; writes fenced at revision %d", grace, fence.Revision)
	return rec, nil
}

// jobStep runs a step as one Job. Its time limit counts from its own start: it must start within
// limit of the previous step's end (since), and finish within limit of its Job's creation.
func (d *deletion) jobStep(step deletionStep, rec kvv1.DeletionStep, since time.Time) (kvv1.DeletionStep, *DeletionAction, error) {
	name := step.jobName
	fail := func(why string) kvv1.DeletionStep {
		return kvv1.DeletionStep{Name: rec.Name, Outcome: kvv1.DeletionFailed, Job: rec.Job, StartTime: rec.StartTime, CompletionTime: d.stamp(), Message: why}
	}
	observed, found := d.obs.Jobs[name]
	// A foreground deletion takes the KVCluster off the owners of its guarded Jobs: the cluster's
	// UID label still says whose they are.
	if found && observed.NotOurs != "" {
		return fail(fmt.Sprintf("a Job named %s exists and is not this KVCluster's (%s)", name, observed.NotOurs)), nil, nil
	}
	if !found { // not started yet, or (blocking) a person deleted the failed Job to retry
		if d.obs.NamespaceGone {
			return fail("its namespace is being deleted, so no Job can start there"), nil, nil
		}
		err, tried := d.obs.Acted.Started[name]
		switch {
		case !tried:
			return rec, &DeletionAction{Kind: StartJob, Job: step.job(d.status)}, nil
		case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			return fail("its namespace is being deleted, so no Job can start there"), nil, nil
		case err != nil && !d.blocking && d.now.Sub(since) > step.limit: // given up only after trying
			return fail(fmt.Sprintf("it could not start within %s: %v", step.limit, err)), nil, nil
		case err != nil:
			return rec, nil, fmt.Errorf("apply Job %s/%s: %w", d.kvc.Namespace, name, err)
		}
		return kvv1.DeletionStep{Name: rec.Name, Outcome: kvv1.DeletionRunning, Job: name, StartTime: d.stamp(), Message: "started Job " + name}, nil, nil
	}
	if rec.Job != name || rec.StartTime == nil { // the record was lost: the Job says when the step began
		rec.Job, rec.StartTime = name, &observed.Job.Job.CreationTimestamp
	}
	if rec.Outcome != kvv1.DeletionRunning { // a Job started again after a failure (Block)
		rec.Outcome, rec.CompletionTime, rec.Message = kvv1.DeletionRunning, nil, "started Job "+name
	}
	j := observed.Job
	if !j.Done {
		if !d.blocking && d.now.Sub(rec.StartTime.Time) > step.limit+time.Minute {
			// The Job's own deadline should have ended it; do not wait for ever if it did not.
			return fail(fmt.Sprintf("it did not finish within %s", step.limit)), nil, nil
		}
		return rec, nil, nil
	}
	report := j.Report
	if j.Succeeded && report == "" && rec.Name == kvv1.StepFinalBackup && d.now.Sub(j.FinishedAt) < time.Minute {
		return rec, nil, nil // its report (where it wrote, at which revision) is not readable yet
	}
	end := metav1.NewTime(j.FinishedAt.Truncate(time.Second))
	rec.CompletionTime = &end
	if rec.Name == kvv1.StepFinalBackup {
		RecordFinishedBackups(&d.status, d.kvc, []Job{j})
		report = d.status.LastBackup.Message
		if j.Succeeded {
			b := d.status.LastBackup
			report = fmt.Sprintf("wrote %s (%d bytes, revision %d)", b.Location, b.Size, b.Revision)
		}
	} else if report == "" && !j.Succeeded {
		report = JobFailureMessage(j.Job)
	}
	if rec.Outcome, rec.Message = kvv1.DeletionSucceeded, report; !j.Succeeded {
		rec.Outcome, rec.Message = kvv1.DeletionFailed, "it failed: "+report
	}
	return rec, nil, nil
}

// announce says what changed in a step, once: events, and for a final backup given up, what is
// lost.
func (d *deletion) announce(p *DeletionPass, before, after kvv1.DeletionStep) {
	if before.Outcome == after.Outcome && before.Job == after.Job && before.Message == after.Message {
		return
	}
	what := stepNoun(after.Name)
	event := func(eventType, reason, format string, args ...any) {
		p.Events = append(p.Events, Event{Type: eventType, Reason: reason, Action: "Delete", Message: fmt.Sprintf(format, args...)})
	}
	lost := func(reason, eventReason, why string) {
		p.Lost = &LostBackup{Reason: reason, Why: why, Lost: lastBackupSentence(d.kvc)}
		event(corev1.EventTypeWarning, eventReason, "%s; %s", why, p.Lost.Lost)
	}
	switch after.Outcome {
	case kvv1.DeletionRunning:
		if before.Outcome == kvv1.DeletionRunning && before.Job == after.Job {
			return // still running
		}
		if after.Name == kvv1.StepDrain {
			event(corev1.EventTypeNormal, StepEvent(after.Name, after.Outcome), "%s", after.Message)
			return
		}
		event(corev1.EventTypeNormal, StepEvent(after.Name, after.Outcome), "started the %s Job %s before deleting the cluster", what, after.Job)
	case kvv1.DeletionSucceeded:
		switch after.Name {
		case kvv1.StepDrain:
			if after.Revision == 0 {
				event(corev1.EventTypeWarning, EventWritesNotFenced, "%s", after.Message)
				return
			}
			event(corev1.EventTypeNormal, StepEvent(after.Name, after.Outcome), "%s", after.Message)
		case kvv1.StepFinalBackup:
			fenced := "writes were not fenced"
			if drain, _ := FindStep(d.status.Deletion, kvv1.StepDrain); drain.Revision > 0 {
				fenced = fmt.Sprintf("writes were fenced at revision %d: it holds the cluster's last state", drain.Revision)
			}
			event(corev1.EventTypeNormal, StepEvent(after.Name, after.Outcome), "final backup %s %s; %s; deleting the cluster", after.Job, after.Message, fenced)
		default:
			event(corev1.EventTypeNormal, StepEvent(after.Name, after.Outcome), "%s Job %s succeeded: %s", what, after.Job, after.Message)
		}
	case kvv1.DeletionSkipped:
		if after.Name == kvv1.StepFinalBackup {
			lost("skipped", StepEvent(after.Name, after.Outcome), "deleting without a final backup ("+after.Message+")")
		}
	case kvv1.DeletionFailed:
		if d.blocking {
			event(corev1.EventTypeWarning, ReasonFinalBackupFailed, "%s", blockedMessage(after))
			return
		}
		why := "deleting without the " + what + " because " + after.Message
		if after.Name == kvv1.StepFinalBackup {
			reason := "failed"
			if d.obs.NamespaceGone {
				reason = "namespace_deleted"
			}
			lost(reason, ReasonFinalBackupFailed, why)
			return
		}
		event(corev1.EventTypeWarning, StepEvent(after.Name, after.Outcome),
			"%s; the cluster may still be registered where the step would have removed it", why)
	}
}

// blockedMessage says why a deletion is held, and the ways on.
func blockedMessage(rec kvv1.DeletionStep) string {
	return fmt.Sprintf("the %s did not succeed: %s. Deletion is blocked (onFinalBackupFailure: Block); fix the cause and delete "+
		"the failed Job to retry, or annotate %s=true to delete without it", stepNoun(rec.Name), rec.Message, kvv1.AnnotationSkipFinalBackup)
}

func stepNoun(name kvv1.DeletionStepName) string {
	switch name {
	case kvv1.StepFinalBackup:
		return "final backup"
	case kvv1.StepDeregistration:
		return "deregistration"
	}
	return "drain"
}

// FindStep is the record of the named step in a deletion's status.
func FindStep(steps []kvv1.DeletionStep, name kvv1.DeletionStepName) (kvv1.DeletionStep, bool) {
	for _, s := range steps {
		if s.Name == name {
			return s, true
		}
	}
	return kvv1.DeletionStep{}, false
}

func setStep(steps *[]kvv1.DeletionStep, rec kvv1.DeletionStep) {
	for i := range *steps {
		if (*steps)[i].Name == rec.Name {
			(*steps)[i] = rec
			return
		}
	}
	*steps = append(*steps, rec)
}

// lastBackupSentence says what a deletion without a final backup loses.
func lastBackupSentence(kvc *kvv1.KVCluster) string {
	if kvc.Status.LastBackupTime == nil {
		return "no backup of this cluster exists: its data is lost"
	}
	loc := ""
	if kvc.Status.LastBackup != nil && kvc.Status.LastBackup.Succeeded {
		loc = " at " + kvc.Status.LastBackup.Location
	}
	return fmt.Sprintf("writes after the last successful backup%s (%s) are lost", loc, kvc.Status.LastBackupTime.UTC().Format(time.RFC3339))
}
