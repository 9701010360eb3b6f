package plan

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// NearQuotaPercent is the share of the quota past which a member's database puts the cluster
// under space pressure: etcd compares the database file's size (not the part in use) with it.
const NearQuotaPercent = 80

// mebibytes rounds a size up to a MiB, so status changes once per MiB a database grows, not on
// every write.
func mebibytes(bytes int64) *resource.Quantity {
	const mi = 1 << 20
	return resource.NewQuantity((bytes+mi-1)/mi*mi, resource.BinarySI)
}

// memberAlarms are the alarms etcd raised for one member, as status lists them.
func memberAlarms(cluster *members.Cluster, id uint64) []string {
	var out []string
	for _, a := range cluster.Alarms {
		if a.MemberID == id {
			out = append(out, a.Type)
		}
	}
	return out
}

// backendQuota is the quota the members report (they all run with the same flag), rounded down
// to a MiB, or the last one recorded while none answers.
func backendQuota(kvc *kvv1.KVCluster, obs Observation) *resource.Quantity {
	var quota int64
	if obs.Cluster != nil {
		for _, m := range obs.Cluster.Members {
			quota = max(quota, m.DBSizeQuota)
		}
	}
	if quota < 1<<20 {
		return kvc.Status.BackendQuota
	}
	return resource.NewQuantity(quota>>20<<20, resource.BinarySI)
}

// FreeSpace is the next step of freeing space. After etcd raised the NOSPACE alarm: compact every
// revision but the latest, defragment one member at a time (followers first, the leader last),
// then disarm the alarm once the databases are well below the quota. In routine operation:
// defragment a member worth it (spec.space.defragmentation). One step per reconcile, each
// planned from the sizes the last one left.
type FreeSpace struct {
	// Active: the cluster's own NOSPACE alarm is raised and announced, and space is being freed.
	// Waiting says what keeps freeing from starting.
	Active  bool
	Waiting string
	// CompactTo is the revision to compact to (0: none). A step that compacted, defragmented or
	// disarmed is observed (Observation.Compacted, Defragmented, Disarmed) and planned again, to
	// record it in status.
	CompactTo int64
	// Defragment is the member to defragment, at Endpoint ("": none). Leader: it leads the
	// cluster as observed (the leader goes last, and its event says so).
	Defragment, Endpoint string
	Leader               bool
	// Disarm are the NOSPACE alarms to clear: there is room again.
	Disarm []members.Alarm
	// Exhausted: compacted and defragmented as far as the operator does, and still no room;
	// TooLarge are the members it leaves fragmented (see maxOnlineDefragmentBytes).
	Exhausted bool
	TooLarge  []string
	// Requested is the kvcluster.io/defragment-now value the defragmentation answers ("": none).
	Requested string
}

// maxOnlineDefragmentBytes is the largest database the operator defragments: a member answers
// nothing while defragmented, its liveness probe included (60 s of failures restart it), and
// etcd rewrites about 70 MB a second on these machines: 2 GiB takes half that budget.
const maxOnlineDefragmentBytes = 2 << 30

// worthDefragmenting: at least a MiB of the member's database file is free pages, and either a
// tenth of it, or enough to bring a file past the space-pressure mark back under it, or the file
// is past the mark while another member holds the same data under it (a defragmentation packs
// pages fuller than a long-written file has them).
func worthDefragmenting(m members.Member, mark, minInUse int64) bool {
	free := m.DBSize - m.DBSizeInUse
	return free >= 1<<20 && (free*10 >= m.DBSize || m.DBSize >= mark && (m.DBSizeInUse < mark || minInUse < mark))
}

// lastDefragmented is when status records the member was last defragmented: nil when never, or
// when the record is of a former member of the same name (another ID).
func lastDefragmented(kvc *kvv1.KVCluster, m members.Member) *metav1.MicroTime {
	if recorded := recordedMember(kvc, m.Name); recorded != nil && recorded.ID == fmt.Sprintf("%x", m.ID) {
		return recorded.LastDefragmentTime
	}
	return nil
}

// defragmentedSince: status records a defragmentation of the member (by this ID) after the
// compaction, or at all when the operator never compacted.
func defragmentedSince(kvc *kvv1.KVCluster, m members.Member, compaction *kvv1.Compaction) bool {
	last := lastDefragmented(kvc, m)
	return last != nil && (compaction == nil || compaction.Time.Before(last))
}

// planFreeSpace frees space while a NOSPACE alarm of the cluster's own (not a stale one, see
// staleAlarms) holds a Ready cluster, every member answering: a member that does not could not be
// defragmented, and would keep its full database. Rollouts, scaling and deletion come first (the
// phase is not Ready then; the deletion's fence is its own NOSPACE alarm, and is never planned
// here), and a CORRUPT alarm is a person's to look at. The first step waits for status to say
// NoSpace, so what happened is announced before what is done.
//
// The compaction comes first, on its own (status records it), then every member whose file is
// past the space-pressure mark is defragmented once after it, whatever it shows free: etcd
// counts the pages a compaction freed as in use until its next write commits, which a cluster
// refusing writes may not make. Only what a defragmentation leaves says there is no room.
func planFreeSpace(kvc *kvv1.KVCluster, obs Observation, phase kvv1.Phase, stale []members.Alarm, quota *resource.Quantity, now time.Time) FreeSpace {
	own := noSpaceAlarms(obs.Cluster, stale)
	said := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionSpacePressure)
	announced := said != nil && (said.Reason == ReasonNoSpace || said.Reason == ReasonSpaceExhausted)
	switch {
	case len(own) == 0:
		return planRoutineDefragmentation(kvc, obs, phase, quota, now)
	case phase != kvv1.PhaseReady:
		return FreeSpace{Waiting: fmt.Sprintf("while the cluster is %s", phase)}
	case slices.ContainsFunc(obs.Cluster.Alarms, func(a members.Alarm) bool { return a.Type != "NOSPACE" }):
		return FreeSpace{Waiting: "while etcd reports another alarm (CORRUPT: a person's to look at)"}
	case !obs.membersHealthy(kvc):
		return FreeSpace{Waiting: "until every member answers"}
	case !announced || quota == nil || quota.IsZero(): // announced in this reconcile; freed from the next
		return FreeSpace{}
	case obs.Compacted > 0 || obs.Defragmented != "" || obs.Disarmed: // planned again to record it; what it freed shows next time
		return FreeSpace{Active: true, Exhausted: said.Reason == ReasonSpaceExhausted}
	}
	mark := quota.Value() * NearQuotaPercent / 100
	room, minInUse := true, int64(math.MaxInt64)
	for _, m := range obs.Cluster.Members {
		room = room && m.DBSize < mark
		minInUse = min(minInUse, m.DBSizeInUse)
	}
	if room {
		return FreeSpace{Active: true, Disarm: own}
	}
	leader, _ := obs.Cluster.Leader()
	compaction := kvc.Status.LastCompaction
	// The revision moves under the alarm too (deletes, expiring leases): a pass of
	// defragmentations under way is finished before the next compaction, which would start it over.
	// A pass ends when the alarm is disarmed: the next alarm starts with a compaction.
	moved := leader.Revision > 1 && (compaction == nil || leader.Revision > compaction.Revision)
	due := func(m members.Member) bool { return m.DBSize >= mark && !defragmentedSince(kvc, m, compaction) }
	underway := compaction != nil && compaction.DisarmedTime == nil && slices.ContainsFunc(obs.Cluster.Members, due) &&
		slices.ContainsFunc(obs.Cluster.Members, func(m members.Member) bool { return defragmentedSince(kvc, m, compaction) })
	if moved && !underway {
		return FreeSpace{Active: true, CompactTo: leader.Revision}
	}
	step := FreeSpace{Active: true}
	scheme := obs.ClientScheme(kvc)
	pick := func(m members.Member) bool {
		ord, ok := specs.OrdinalOfMember(kvc, m.Name)
		switch {
		case !ok || !worthDefragmenting(m, mark, minInUse) && !due(m):
			return false
		case m.DBSize > maxOnlineDefragmentBytes:
			step.TooLarge = append(step.TooLarge, m.Name)
			return false
		}
		step.Defragment, step.Endpoint, step.Leader = m.Name, specs.MemberClientURL(kvc, scheme, ord), m.ID == leader.ID
		return true
	}
	for _, m := range obs.Cluster.Members { // sorted by name
		if m.ID != leader.ID && pick(m) {
			return step
		}
	}
	switch {
	case pick(leader): // the leader goes last
	case moved: // the pass is over: compact what was deleted meanwhile, and start another
		return FreeSpace{Active: true, CompactTo: leader.Revision}
	default:
		step.Exhausted = true
	}
	return step
}

// routineDefragmentationInterval is how often at most a member is defragmented in routine
// operation, and how long a schedule's window lasts.
const routineDefragmentationInterval = time.Hour

// worthRoutineDefragmentation: the member's database file reached half the quota, at least a MiB
// of it is free pages, and either a quarter of it, or enough to bring a file past the
// space-pressure mark back under it. A smaller file has headroom enough, and the disk is sized
// for the quota.
func worthRoutineDefragmentation(m members.Member, quota int64) bool {
	free, mark := m.DBSize-m.DBSizeInUse, quota*NearQuotaPercent/100
	return free >= 1<<20 && m.DBSize*2 >= quota && (free*4 >= m.DBSize || m.DBSize >= mark && m.DBSizeInUse < mark)
}

// planRoutineDefragmentation picks the member to defragment in routine operation (see
// kvv1.DefragmentationSpec): the followers by name, then the leader, each at most once an hour
// (with a schedule: within the hour after a slot), only while the cluster is Ready, every member
// answers, etcd reports no alarm and no backup runs (its snapshot would stall behind the
// defragmentation). A Ready cluster is looked at every minute: an opening window is seen within one.
func planRoutineDefragmentation(kvc *kvv1.KVCluster, obs Observation, phase kvv1.Phase, quota *resource.Quantity, now time.Time) FreeSpace {
	policy := kvc.Spec.Space.Defragmentation
	if policy.Mode == kvv1.DefragmentationOff || phase != kvv1.PhaseReady || !obs.membersHealthy(kvc) || len(obs.Cluster.Alarms) > 0 ||
		quota == nil || quota.IsZero() || slices.ContainsFunc(obs.Jobs, func(j Job) bool { return !j.Done }) {
		return FreeSpace{}
	}
	doneSince := now.Add(-routineDefragmentationInterval) // a window lasts as long: once in each
	if policy.Schedule != "" {
		sched, err := backup.Parse(policy.Schedule, "", now)
		if err != nil { // announced by defragmentationScheduleProblem
			return FreeSpace{}
		}
		if opened, _ := sched.MostRecentSlot(doneSince, now, 0); opened.IsZero() {
			return FreeSpace{} // outside the window
		}
	}
	leader, _ := obs.Cluster.Leader()
	scheme := obs.ClientScheme(kvc)
	for _, m := range append(slices.DeleteFunc(slices.Clone(obs.Cluster.Members), func(m members.Member) bool { return m.ID == leader.ID }), leader) {
		ord, ok := specs.OrdinalOfMember(kvc, m.Name)
		if !ok || !worthRoutineDefragmentation(m, quota.Value()) || m.DBSize > maxOnlineDefragmentBytes {
			continue
		}
		if last := lastDefragmented(kvc, m); last != nil && !last.Time.Before(doneSince) {
			continue
		}
		return FreeSpace{Defragment: m.Name, Endpoint: specs.MemberClientURL(kvc, scheme, ord), Leader: m.ID == leader.ID}
	}
	return FreeSpace{}
}

// defragmentationScheduleProblem warns, once per spec, of a defragmentation schedule the
// operator cannot follow: one admission cannot check (an unknown CRON_TZ zone, no slot at all).
func defragmentationScheduleProblem(kvc *kvv1.KVCluster, now time.Time) []Event {
	schedule := kvc.Spec.Space.Defragmentation.Schedule
	if schedule == "" || kvc.Status.ObservedGeneration == kvc.Generation {
		return nil
	}
	if _, err := backup.Parse(schedule, "", now); err != nil {
		return []Event{{Type: corev1.EventTypeWarning, Reason: EventInvalidDefragmentationSchedule, Action: "CheckSpace",
			Message: fmt.Sprintf("spec.space.defragmentation: %v; members are defragmented only to recover from NOSPACE until it is fixed", err)}}
	}
	return nil
}

// noSpaceAlarms are the cluster's own NOSPACE alarms: not the stale ones.
func noSpaceAlarms(cluster *members.Cluster, stale []members.Alarm) []members.Alarm {
	var out []members.Alarm
	if cluster != nil {
		for _, a := range cluster.Alarms {
			if a.Type == "NOSPACE" && !slices.Contains(stale, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// setSpacePressure sets the SpacePressure condition from what etcd reports, and returns the
// events of a change: True with reason NoSpace while a NOSPACE alarm makes the cluster refuse
// writes and the operator frees space (SpaceExhausted once freeing found no room), NearQuota
// while a database is past NearQuotaPercent of the quota. Unchanged while etcd does not answer.
// Stale alarms (inherited by a restored cluster, disarmed in this reconcile) are no space problem.
func setSpacePressure(st *kvv1.KVClusterStatus, kvc *kvv1.KVCluster, obs Observation, stale []members.Alarm, free FreeSpace, now time.Time) []Event {
	if obs.Cluster == nil || !obs.Cluster.HasLeader {
		return nil
	}
	status, reason, message := false, ReasonSpaceAvailable, fmt.Sprintf("every member's database is below %d%% of the quota", NearQuotaPercent)
	var noSpace []string
	for _, a := range noSpaceAlarms(obs.Cluster, stale) {
		noSpace = append(noSpace, memberName(kvc, obs.Cluster, a.MemberID))
	}
	// Judged on the sizes status shows, which a member that does not answer now (restarting)
	// keeps from when it last did: the condition must not clear while it is away.
	var near []string
	for _, m := range st.Members {
		if quota := st.BackendQuota; m.DBSize != nil && quota != nil && !quota.IsZero() && m.DBSize.Value()*100 >= quota.Value()*NearQuotaPercent {
			near = append(near, fmt.Sprintf("%s %s of %s", m.Name, m.DBSize, quota))
		}
	}
	switch {
	case len(noSpace) > 0 && free.Exhausted:
		status, reason = true, ReasonSpaceExhausted
		message = fmt.Sprintf("etcd raised the NOSPACE alarm (%s) and the cluster refuses writes (reads and deletes still work). "+
			"The operator compacted every old revision away and defragmented the members worth it, and databases still fill %d%% of the quota or more (%s)",
			strings.Join(noSpace, ", "), NearQuotaPercent, strings.Join(near, ", "))
		if len(free.TooLarge) > 0 {
			message += fmt.Sprintf("; it does not defragment %s: larger than %d GiB, which a member cannot rewrite before its liveness probe restarts it",
				strings.Join(free.TooLarge, ", "), maxOnlineDefragmentBytes>>30)
		}
		message += ". Delete keys that are no longer needed (the operator then frees the space and disarms the alarm)"
		if most := specs.MaxQuotaBytes(specs.StorageSize(kvc)); st.BackendQuota != nil && most > st.BackendQuota.Value()+1<<20 {
			message += fmt.Sprintf(", raise spec.space.backendQuota (storage.size holds a quota of up to %s)", sizeOf(most))
		}
		message += ", or grow storage.size"
	case len(noSpace) > 0:
		status, reason = true, ReasonNoSpace
		message = fmt.Sprintf("etcd raised the NOSPACE alarm (%s): a database reached the quota and the cluster refuses writes "+
			"(reads and deletes still work). The operator frees space: it compacts every old revision away, defragments "+
			"one member at a time, then disarms the alarm", strings.Join(noSpace, ", "))
		if free.Waiting != "" {
			message += "; it waits " + free.Waiting
		}
	case len(near) > 0:
		status, reason = true, ReasonNearQuota
		message = fmt.Sprintf("databases at %d%% of the quota or more: %s; at the quota etcd refuses writes. Compact and defragment, or delete data",
			NearQuotaPercent, strings.Join(near, ", "))
	}
	prev := meta.FindStatusCondition(kvc.Status.Conditions, kvv1.ConditionSpacePressure)
	SetCondition(st, kvc, kvv1.ConditionSpacePressure, status, reason, message, now)
	if prev != nil && prev.Reason == reason {
		return nil
	}
	switch {
	case status:
		return []Event{{Type: corev1.EventTypeWarning, Reason: reason, Action: "CheckSpace", Message: message}}
	case prev != nil && prev.Status == "True":
		return []Event{{Type: corev1.EventTypeNormal, Reason: EventSpaceRecovered, Action: "CheckSpace", Message: message}}
	}
	return nil
}

// memberName is the name of a member by ID, or its ID when it has none (not started, or gone).
func memberName(kvc *kvv1.KVCluster, cluster *members.Cluster, id uint64) string {
	for _, m := range cluster.Members {
		if name := memberPodName(kvc, m); m.ID == id && name != "" {
			return name
		}
	}
	return fmt.Sprintf("member %x", id)
}

// quotaOf is the quota the members report, or, before any has (or from a version that does not
// say), the one the operator gives them.
func quotaOf(st kvv1.KVClusterStatus, given int64) *resource.Quantity {
	if st.BackendQuota != nil {
		return st.BackendQuota
	}
	return resource.NewQuantity(given, resource.BinarySI)
}

// answerDefragmentRequest follows the defragmentation asked for with kvcluster.io/defragment-now
// in st.DefragmentRequest, and returns the member to defragment now (ok: the request decides the
// step, not routine defragmentation). Every member is defragmented once, the followers by name and
// the leader last, one per reconcile, each recorded as it is done (Observation.Defragmented). It
// waits, like routine defragmentation, until the cluster is Ready, every member answers, etcd
// reports no alarm (freeing: the operator frees space itself under NOSPACE) and no backup runs or
// starts in this reconcile (startingBackup). The value status answered is not taken again; a new
// one waits for a running defragmentation to finish, and replaces one still pending. A status the
// cache does not hold yet can make a member's defragmentation repeat: harmless, it frees nothing.
func answerDefragmentRequest(kvc *kvv1.KVCluster, obs Observation, st *kvv1.KVClusterStatus, phase kvv1.Phase, freeing bool, startingBackup string, now time.Time) (step FreeSpace, ok bool, events []Event) {
	prev := st.DefragmentRequest
	token := kvc.Annotations[kvv1.AnnotationDefragmentNow]
	answered := func(r *kvv1.DefragmentRequest) bool {
		return r.State == kvv1.BackupRequestSucceeded || r.State == kvv1.BackupRequestFailed
	}
	withdrawn := token == "" // the annotation went: a defragmentation under way is finished; none starts
	switch {
	case withdrawn && (prev == nil || answered(prev)):
		return FreeSpace{}, false, nil
	case withdrawn, prev != nil && prev.Token != token && prev.State == kvv1.BackupRequestRunning: // never two at once
		token = prev.Token
	}
	req := &kvv1.DefragmentRequest{Token: token, State: kvv1.BackupRequestPending}
	if prev != nil && prev.Token == token {
		req = prev.DeepCopy()
	}
	if answered(req) {
		return FreeSpace{}, false, nil
	}
	// While a request is open every defragmentation outside NOSPACE is its own (routine ones wait);
	// status may not say Running yet when the first one was just taken.
	if obs.Defragmented != "" && !freeing && !slices.Contains(req.Defragmented, obs.Defragmented) {
		req.Defragmented = append(req.Defragmented, obs.Defragmented)
	}
	st.DefragmentRequest = req
	fail := func(message string) (FreeSpace, bool, []Event) {
		req.State, req.Message = kvv1.BackupRequestFailed, message
		return FreeSpace{}, true, []Event{{Type: corev1.EventTypeWarning, Reason: EventDefragmentationFailed, Action: "Defragment",
			Message: fmt.Sprintf("the defragmentation asked for with %s=%s: %s", kvv1.AnnotationDefragmentNow, token, message)}}
	}
	busy := startingBackup
	if i := slices.IndexFunc(obs.Jobs, func(j Job) bool { return !j.Done }); i >= 0 {
		busy = obs.Jobs[i].Job.Name
	}
	switch {
	case len(token) > kvv1.MaxBackupNowToken:
		return fail(fmt.Sprintf("the value has %d characters, more than %d: set a shorter one, e.g. the date", len(token), kvv1.MaxBackupNowToken))
	case withdrawn && req.State == kvv1.BackupRequestPending:
		return fail(kvv1.AnnotationDefragmentNow + " was removed before the defragmentation started")
	case phase != kvv1.PhaseReady:
		req.Message = fmt.Sprintf("waiting while the cluster is %s", phase)
	case !obs.membersHealthy(kvc):
		req.Message = "waiting until every member answers"
	case freeing || len(obs.Cluster.Alarms) > 0:
		req.Message = "waiting while etcd reports an alarm (under NOSPACE the operator frees space itself)"
	case busy != "":
		req.Message = fmt.Sprintf("waiting for backup %s to finish (its snapshot would stall behind a defragmentation)", busy)
	default:
		req.Message = ""
		if req.State == kvv1.BackupRequestPending {
			at := metav1.NewTime(now)
			req.State, req.StartTime = kvv1.BackupRequestRunning, &at
			events = append(events, Event{Type: corev1.EventTypeNormal, Reason: EventDefragmentationStarted, Action: "Defragment",
				Message: fmt.Sprintf("defragmenting every member, one at a time, asked for with %s=%s", kvv1.AnnotationDefragmentNow, token)})
		}
		leader, _ := obs.Cluster.Leader()
		scheme := obs.ClientScheme(kvc)
		var tooLarge []string
		for _, m := range append(slices.DeleteFunc(slices.Clone(obs.Cluster.Members), func(m members.Member) bool { return m.ID == leader.ID }), leader) {
			ord, ok := specs.OrdinalOfMember(kvc, m.Name)
			switch {
			case !ok || slices.Contains(req.Defragmented, m.Name):
			case m.DBSize > maxOnlineDefragmentBytes:
				tooLarge = append(tooLarge, m.Name)
			default:
				return FreeSpace{Defragment: m.Name, Endpoint: specs.MemberClientURL(kvc, scheme, ord), Leader: m.ID == leader.ID, Requested: token}, true, events
			}
		}
		if len(tooLarge) > 0 {
			step, ok, failed := fail(fmt.Sprintf("defragmented %s; not %s: larger than %d GiB, which a member cannot rewrite before its liveness probe restarts it",
				listOrNone(req.Defragmented), strings.Join(tooLarge, ", "), maxOnlineDefragmentBytes>>30))
			return step, ok, append(events, failed...)
		}
		req.State = kvv1.BackupRequestSucceeded
		events = append(events, Event{Type: corev1.EventTypeNormal, Reason: EventDefragmentationFinished, Action: "Defragment",
			Message: fmt.Sprintf("defragmented %s, asked for with %s=%s", listOrNone(req.Defragmented), kvv1.AnnotationDefragmentNow, token)})
	}
	return FreeSpace{}, true, events
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "no member"
	}
	return strings.Join(names, ", ")
}
