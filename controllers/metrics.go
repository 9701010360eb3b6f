package controllers

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
)

// The metrics endpoint asks the API server who a scraper is and whether it may get /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// The operator's own metrics, registered with controller-runtime's registry (served on the
// manager's metrics endpoint). Those about the clusters are read from their status at each scrape
// (ClusterCollector); those about what the operator saw happen are counted as it happens.
var (
	// finalBackupsLost counts the KVClusters deleted without their final backup, by why: the
	// operator's metrics outlive a deleted namespace, where events cannot be written any more.
	finalBackupsLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvcluster_final_backups_lost_total",
		Help: "KVClusters deleted without their final backup, by reason (failed, namespace_deleted, skipped).",
	}, []string{"reason"})
	leaderChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvcluster_leader_changes_total",
		Help: "Changes of a cluster's raft leader the operator saw (from one member to another, between two of its reconciles).",
	}, []string{"namespace", "name"})
	reconcileStepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvcluster_reconcile_step_duration_seconds",
		Help:    "Time one step of a reconcile took: observe (read the objects and ask etcd), plan, act (apply the plan), finalize (a cluster being deleted).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"step"})
	reconcileStepErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvcluster_reconcile_step_errors_total",
		Help: "Reconciles that ended with an error, by the step that returned it (load: reading the KVCluster, its finalizer, a leftover guard; observe; act; finalize).",
	}, []string{"step"})
)

func init() {
	metrics.Registry.MustRegister(finalBackupsLost, leaderChanges, reconcileStepDuration, reconcileStepErrors)
	// Every series exists from the start, at 0: rate() and increase() see the first event, and a
	// dashboard shows 0 rather than nothing.
	for _, step := range []string{"observe", "plan", "act", "finalize"} {
		reconcileStepDuration.WithLabelValues(step)
	}
	for _, step := range []string{"load", "observe", "plan", "act", "finalize"} {
		reconcileStepErrors.WithLabelValues(step)
	}
	for _, reason := range []string{"failed", "namespace_deleted", "skipped"} {
		finalBackupsLost.WithLabelValues(reason)
	}
}

// timeStep runs one step of a reconcile, timing it and counting its error.
func timeStep[T any](step string, run func() (T, error)) (T, error) {
	start := time.Now()
	out, err := run()
	reconcileStepDuration.WithLabelValues(step).Observe(time.Since(start).Seconds())
	return out, countError(step, err)
}

// countError counts err, if any, as an error of a reconcile's step, and returns it.
func countError(step string, err error) error {
	if err != nil {
		reconcileStepErrors.WithLabelValues(step).Inc()
	}
	return err
}

// leaderTracker counts leader changes: it remembers each cluster's last leader in memory, not in
// its status, which the cache may show stale to the next reconcile (counting the change twice).
type leaderTracker struct {
	mu   sync.Mutex
	last map[types.NamespacedName]seenLeader
}

type seenLeader struct {
	uid    types.UID // a cluster re-created under the same name starts afresh
	member string
}

// saw records the leader a reconcile observed ("" for none); a change from one member to another
// is counted. A cluster's first observation after the operator started is not a change.
func (l *leaderTracker) saw(kvc *kvv1.KVCluster, leader string) {
	if leader == "" {
		return // no leader for a while is not a change: the same one may come back
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[types.NamespacedName]seenLeader{}
	}
	key := types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}
	changes := leaderChanges.WithLabelValues(kvc.Namespace, kvc.Name) // at 0 from the first sight
	if before, ok := l.last[key]; ok && before.uid == kvc.UID && before.member != leader {
		changes.Inc()
	}
	l.last[key] = seenLeader{uid: kvc.UID, member: leader}
}

// forget drops a cluster that is gone, and its series.
func (l *leaderTracker) forget(key types.NamespacedName) {
	l.mu.Lock()
	delete(l.last, key)
	l.mu.Unlock()
	leaderChanges.DeleteLabelValues(key.Namespace, key.Name)
}

// ClusterCollector exports every KVCluster's state, read from its status at each scrape: what a
// platform team alerts on (members, leader, backups, space, certificates, conditions). Only the
// elected operator exports them, so that a standby replica's stale view is never scraped as a
// second truth.
type ClusterCollector struct {
	List    func(context.Context) ([]kvv1.KVCluster, error)
	Leading func() bool
	Now     func() time.Time

	gaps sync.Map // schedule and time zone → the longest gap between its slots
}

// NewClusterCollector reads the clusters from the manager's cache (reader); elected is closed
// once this replica leads (the manager's Elected()).
func NewClusterCollector(reader client.Reader, elected <-chan struct{}) *ClusterCollector {
	return &ClusterCollector{
		List: func(ctx context.Context) ([]kvv1.KVCluster, error) {
			var list kvv1.KVClusterList
			err := reader.List(ctx, &list)
			return list.Items, err
		},
		Leading: func() bool {
			select {
			case <-elected:
				return true
			default:
				return false
			}
		},
		Now: time.Now,
	}
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"namespace", "name"}, labels...), nil)
}

var (
	infoDesc           = desc("kvcluster_info", "1 for every KVCluster, with its desired (spec.version) and current (status.currentVersion) etcd version.", "version", "current_version")
	createdDesc        = desc("kvcluster_created_timestamp_seconds", "When the KVCluster was created (Unix time).")
	phaseDesc          = desc("kvcluster_phase", "1 for the cluster's phase (Creating, Ready, Upgrading, Failed), 0 for the others.", "phase")
	conditionDesc      = desc("kvcluster_condition", "1 while the condition is True, 0 while False or Unknown (Ready, Reconciling, Stalled, BackupSucceeded, SpacePressure).", "type")
	membersDesiredDesc = desc("kvcluster_members_desired", "Members the spec asks for (spec.partitions).")
	membersReadyDesc   = desc("kvcluster_members_ready", "Members whose pod is ready (status.readyPartitions).")
	votingDesc         = desc("kvcluster_members_voting", "Voting members in etcd's member list (learners excluded): quorum is a majority of them.")
	votingHealthyDesc  = desc("kvcluster_members_voting_healthy", "Voting members that answered the operator's last status request.")
	learnersDesc       = desc("kvcluster_members_learners", "Learners (members catching up, not voting) in etcd's member list.")
	leaderPresentDesc  = desc("kvcluster_leader_present", "1 while a member reports itself the raft leader, else 0 (the cluster cannot take writes).")
	memberHealthyDesc  = desc("kvcluster_member_healthy", "1 while the member answered the operator's last status request.", "member")
	memberLeaderDesc   = desc("kvcluster_member_leader", "1 for the member that is the raft leader.", "member")
	dbSizeDesc         = desc("kvcluster_member_db_size_bytes", "Size of the member's database file, which etcd compares with its quota.", "member")
	dbInUseDesc        = desc("kvcluster_member_db_size_in_use_bytes", "Part of the member's database file holding data (the rest is free pages a defragmentation returns).", "member")
	alarmDesc          = desc("kvcluster_member_alarm", "1 for each alarm etcd raised on the member (NOSPACE: the cluster refuses writes; CORRUPT).", "member", "alarm")
	quotaDesc          = desc("kvcluster_backend_quota_bytes", "The size a member's database may reach before etcd raises NOSPACE and refuses writes.")
	lastBackupTimeDesc = desc("kvcluster_last_backup_timestamp_seconds", "When the last successful backup completed (status.lastBackupTime, Unix time).")
	lastBackupOKDesc   = desc("kvcluster_last_backup_succeeded", "1 if the most recently finished backup succeeded, 0 if it failed.")
	lastBackupSizeDesc = desc("kvcluster_last_backup_size_bytes", "Size of the most recently finished backup's snapshot; absent when that backup failed.")
	lastBackupTookDesc = desc("kvcluster_last_backup_duration_seconds", "How long the most recently finished backup Job ran.")
	nextBackupDesc     = desc("kvcluster_next_backup_timestamp_seconds", "The next slot of spec.backupSchedule (Unix time).")
	intervalDesc       = desc("kvcluster_backup_interval_seconds", "The longest time between two slots of spec.backupSchedule (over the next year); absent while backups are suspended.")
	certExpiryDesc     = desc("kvcluster_certificate_expiry_timestamp_seconds", "When each of the cluster's TLS certificates (ca, server, peer, client) expires (Unix time).", "certificate")
)

// leadingDesc has no cluster labels: the one series says this replica leads, with or without
// clusters, so that an alert can tell "no cluster" from "no operator scraped".
var leadingDesc = prometheus.NewDesc("kvcluster_operator_leading", "1 on the elected operator replica, the one that exports the clusters' metrics (absent elsewhere).", nil, nil)

var clusterDescs = []*prometheus.Desc{leadingDesc, infoDesc, createdDesc, phaseDesc, conditionDesc, membersDesiredDesc, membersReadyDesc,
	votingDesc, votingHealthyDesc, learnersDesc, leaderPresentDesc, memberHealthyDesc, memberLeaderDesc, dbSizeDesc, dbInUseDesc,
	alarmDesc, quotaDesc, lastBackupTimeDesc, lastBackupOKDesc, lastBackupSizeDesc, lastBackupTookDesc, nextBackupDesc, intervalDesc, certExpiryDesc}

// Describe sends every metric's description.
func (c *ClusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range clusterDescs {
		ch <- d
	}
}

// Collect sends every cluster's metrics, when this replica leads.
func (c *ClusterCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.Leading() {
		return
	}
	ch <- prometheus.MustNewConstMetric(leadingDesc, prometheus.GaugeValue, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clusters, err := c.List(ctx)
	if err != nil {
		log.Log.WithName("metrics").Error(err, "cannot list the KVClusters for their metrics")
		return
	}
	now := c.Now()
	for i := range clusters {
		c.collect(ch, &clusters[i], now)
	}
}

func (c *ClusterCollector) collect(ch chan<- prometheus.Metric, kvc *kvv1.KVCluster, now time.Time) {
	id := []string{kvc.Namespace, kvc.Name}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(id, labels...)...)
	}
	boolean := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	st := &kvc.Status
	gauge(infoDesc, 1, kvc.Spec.Version, st.CurrentVersion)
	gauge(createdDesc, float64(kvc.CreationTimestamp.Unix()))
	for _, p := range []kvv1.Phase{kvv1.PhaseCreating, kvv1.PhaseReady, kvv1.PhaseUpgrading, kvv1.PhaseFailed} {
		gauge(phaseDesc, boolean(st.Phase == p), string(p))
	}
	for _, cond := range st.Conditions {
		gauge(conditionDesc, boolean(cond.Status == "True"), cond.Type)
	}
	gauge(membersDesiredDesc, float64(kvc.Spec.Partitions))
	gauge(membersReadyDesc, float64(st.ReadyPartitions))
	var voting, votingHealthy, learners int
	leader := false
	for _, m := range st.Members {
		if m.Learner {
			learners++
		} else {
			voting++
			if m.Healthy {
				votingHealthy++
			}
		}
		leader = leader || m.Leader
		gauge(memberHealthyDesc, boolean(m.Healthy), m.Name)
		gauge(memberLeaderDesc, boolean(m.Leader), m.Name)
		if m.DBSize != nil {
			gauge(dbSizeDesc, float64(m.DBSize.Value()), m.Name)
		}
		if m.DBSizeInUse != nil {
			gauge(dbInUseDesc, float64(m.DBSizeInUse.Value()), m.Name)
		}
		for _, a := range m.Alarms {
			gauge(alarmDesc, 1, m.Name, a)
		}
	}
	gauge(votingDesc, float64(voting))
	gauge(votingHealthyDesc, float64(votingHealthy))
	gauge(learnersDesc, float64(learners))
	gauge(leaderPresentDesc, boolean(leader))
	if st.BackendQuota != nil {
		gauge(quotaDesc, float64(st.BackendQuota.Value()))
	}
	if st.LastBackupTime != nil {
		gauge(lastBackupTimeDesc, float64(st.LastBackupTime.Unix()))
	}
	if b := st.LastBackup; b != nil {
		gauge(lastBackupOKDesc, boolean(b.Succeeded))
		if b.Succeeded {
			gauge(lastBackupSizeDesc, float64(b.Size))
		}
		if b.StartTime != nil && b.CompletionTime != nil {
			gauge(lastBackupTookDesc, b.CompletionTime.Sub(b.StartTime.Time).Seconds())
		}
	}
	if st.NextBackupTime != nil {
		gauge(nextBackupDesc, float64(st.NextBackupTime.Unix()))
	}
	if b := kvc.Spec.Backup; b != nil && !b.Suspend {
		if gap, ok := c.longestGap(kvc.Spec.BackupSchedule, b.TimeZone, now); ok {
			gauge(intervalDesc, gap.Seconds())
		}
	}
	for _, cert := range st.Certificates {
		gauge(certExpiryDesc, float64(cert.NotAfter.Unix()), cert.Name)
	}
}

// scheduleSpanMeasured is how far ahead a schedule's interval is measured: a year, so that a
// schedule of working days counts its weekend, and one of some days of the month or some months
// its longest pause, whatever the day the operator measured it on.
const scheduleSpanMeasured = 366 * 24 * time.Hour

// longestGap is the longest time between two slots of a schedule over the next year, measured
// once per schedule (a schedule's gaps do not change with time, but for a daylight saving hour).
func (c *ClusterCollector) longestGap(schedule, timeZone string, now time.Time) (time.Duration, bool) {
	key := timeZone + "\x00" + schedule
	if gap, ok := c.gaps.Load(key); ok {
		return gap.(time.Duration), true
	}
	sched, err := backup.Parse(schedule, timeZone, now)
	if err != nil {
		return 0, false // the BackupSucceeded condition says why
	}
	gap := sched.LongestGap(now, scheduleSpanMeasured)
	c.gaps.Store(key, gap)
	return gap, true
}

// observedLeader is the member ID of the leader an observation found, or "".
func observedLeader(obs plan.Observation) string {
	if obs.Cluster == nil {
		return ""
	}
	if m, ok := obs.Cluster.Leader(); ok {
		return strconv.FormatUint(m.ID, 16)
	}
	return ""
}
