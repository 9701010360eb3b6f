package controllers

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/deploy/monitoring"
)

func quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func metaTime(s string) *metav1.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return &metav1.Time{Time: t}
}

// degradedCluster has every part of the status the collector reads: a member down and one
// learner, an alarm, a failed backup after a successful one, TLS certificates.
func degradedCluster() kvv1.KVCluster {
	return kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "u1", CreationTimestamp: *metaTime("2026-11-30T00:00:00Z")},
		Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, BackupSchedule: "0 */6 * * *",
			Backup: &kvv1.BackupSpec{}},
		Status: kvv1.KVClusterStatus{
			Phase: kvv1.PhaseUpgrading, ReadyPartitions: 2, CurrentVersion: "3.6.16",
			LastBackupTime: metaTime("2026-11-30T06:00:30Z"),
			NextBackupTime: metaTime("2026-11-30T18:00:00Z"),
			LastBackup: &kvv1.BackupRecord{Job: "orders-1", Succeeded: false,
				StartTime: metaTime("2026-11-30T12:00:01Z"), CompletionTime: metaTime("2026-11-30T12:01:31Z")},
			BackendQuota: quantity("2Gi"),
			Members: []kvv1.MemberStatus{
				{Name: "orders-0", ID: "a", Healthy: true, Leader: true, DBSize: quantity("1Gi"), DBSizeInUse: quantity("512Mi"), Alarms: []string{"NOSPACE"}},
				{Name: "orders-1", ID: "b", Healthy: false},
				{Name: "orders-2", ID: "c", Healthy: true, Learner: true},
			},
			Certificates: []kvv1.CertificateStatus{{Name: "ca", Secret: "orders-tls-ca", NotAfter: *metaTime("2036-11-30T00:00:00Z")}},
			Conditions: []metav1.Condition{
				{Type: kvv1.ConditionReady, Status: metav1.ConditionFalse},
				{Type: kvv1.ConditionStalled, Status: metav1.ConditionTrue},
			},
		},
	}
}

func staticCollector(leading bool, clusters ...kvv1.KVCluster) *ClusterCollector {
	return &ClusterCollector{
		List:    func(context.Context) ([]kvv1.KVCluster, error) { return clusters, nil },
		Leading: func() bool { return leading },
		Now:     func() time.Time { return time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC) },
	}
}

// What a scraper reads of a degraded cluster, series by series.
func TestClusterCollectorExportsTheStatus(t *testing.T) {
	want := `
# HELP kvcluster_backend_quota_bytes The size a member's database may reach before etcd raises NOSPACE and refuses writes.
# TYPE kvcluster_backend_quota_bytes gauge
kvcluster_backend_quota_bytes{name="orders",namespace="shop"} 2.147483648e+09
# HELP kvcluster_backup_interval_seconds The longest time between two slots of spec.backupSchedule (over the next year); absent while backups are suspended.
# TYPE kvcluster_backup_interval_seconds gauge
kvcluster_backup_interval_seconds{name="orders",namespace="shop"} 21600
# HELP kvcluster_certificate_expiry_timestamp_seconds When each of the cluster's TLS certificates (ca, server, peer, client) expires (Unix time).
# TYPE kvcluster_certificate_expiry_timestamp_seconds gauge
kvcluster_certificate_expiry_timestamp_seconds{certificate="ca",name="orders",namespace="shop"} 2.111616e+09
# HELP kvcluster_condition 1 while the condition is True, 0 while False or Unknown (Ready, Reconciling, Stalled, BackupSucceeded, SpacePressure).
# TYPE kvcluster_condition gauge
kvcluster_condition{name="orders",namespace="shop",type="Ready"} 0
kvcluster_condition{name="orders",namespace="shop",type="Stalled"} 1
# HELP kvcluster_created_timestamp_seconds When the KVCluster was created (Unix time).
# TYPE kvcluster_created_timestamp_seconds gauge
kvcluster_created_timestamp_seconds{name="orders",namespace="shop"} 1.7959968e+09
# HELP kvcluster_info 1 for every KVCluster, with its desired (spec.version) and current (status.currentVersion) etcd version.
# TYPE kvcluster_info gauge
kvcluster_info{current_version="3.6.16",name="orders",namespace="shop",version="3.7.3"} 1
# HELP kvcluster_last_backup_duration_seconds How long the most recently finished backup Job ran.
# TYPE kvcluster_last_backup_duration_seconds gauge
kvcluster_last_backup_duration_seconds{name="orders",namespace="shop"} 90
# HELP kvcluster_last_backup_succeeded 1 if the most recently finished backup succeeded, 0 if it failed.
# TYPE kvcluster_last_backup_succeeded gauge
kvcluster_last_backup_succeeded{name="orders",namespace="shop"} 0
# HELP kvcluster_last_backup_timestamp_seconds When the last successful backup completed (status.lastBackupTime, Unix time).
# TYPE kvcluster_last_backup_timestamp_seconds gauge
kvcluster_last_backup_timestamp_seconds{name="orders",namespace="shop"} 1.79601843e+09
# HELP kvcluster_leader_present 1 while a member reports itself the raft leader, else 0 (the cluster cannot take writes).
# TYPE kvcluster_leader_present gauge
kvcluster_leader_present{name="orders",namespace="shop"} 1
# HELP kvcluster_member_alarm 1 for each alarm etcd raised on the member (NOSPACE: the cluster refuses writes; CORRUPT).
# TYPE kvcluster_member_alarm gauge
kvcluster_member_alarm{alarm="NOSPACE",member="orders-0",name="orders",namespace="shop"} 1
# HELP kvcluster_member_db_size_bytes Size of the member's database file, which etcd compares with its quota.
# TYPE kvcluster_member_db_size_bytes gauge
kvcluster_member_db_size_bytes{member="orders-0",name="orders",namespace="shop"} 1.073741824e+09
# HELP kvcluster_member_db_size_in_use_bytes Part of the member's database file holding data (the rest is free pages a defragmentation returns).
# TYPE kvcluster_member_db_size_in_use_bytes gauge
kvcluster_member_db_size_in_use_bytes{member="orders-0",name="orders",namespace="shop"} 5.36870912e+08
# HELP kvcluster_member_healthy 1 while the member answered the operator's last status request.
# TYPE kvcluster_member_healthy gauge
kvcluster_member_healthy{member="orders-0",name="orders",namespace="shop"} 1
kvcluster_member_healthy{member="orders-1",name="orders",namespace="shop"} 0
kvcluster_member_healthy{member="orders-2",name="orders",namespace="shop"} 1
# HELP kvcluster_member_leader 1 for the member that is the raft leader.
# TYPE kvcluster_member_leader gauge
kvcluster_member_leader{member="orders-0",name="orders",namespace="shop"} 1
kvcluster_member_leader{member="orders-1",name="orders",namespace="shop"} 0
kvcluster_member_leader{member="orders-2",name="orders",namespace="shop"} 0
# HELP kvcluster_members_desired Members the spec asks for (spec.partitions).
# TYPE kvcluster_members_desired gauge
kvcluster_members_desired{name="orders",namespace="shop"} 3
# HELP kvcluster_members_learners Learners (members catching up, not voting) in etcd's member list.
# TYPE kvcluster_members_learners gauge
kvcluster_members_learners{name="orders",namespace="shop"} 1
# HELP kvcluster_members_ready Members whose pod is ready (status.readyPartitions).
# TYPE kvcluster_members_ready gauge
kvcluster_members_ready{name="orders",namespace="shop"} 2
# HELP kvcluster_members_voting Voting members in etcd's member list (learners excluded): quorum is a majority of them.
# TYPE kvcluster_members_voting gauge
kvcluster_members_voting{name="orders",namespace="shop"} 2
# HELP kvcluster_members_voting_healthy Voting members that answered the operator's last status request.
# TYPE kvcluster_members_voting_healthy gauge
kvcluster_members_voting_healthy{name="orders",namespace="shop"} 1
# HELP kvcluster_next_backup_timestamp_seconds The next slot of spec.backupSchedule (Unix time).
# TYPE kvcluster_next_backup_timestamp_seconds gauge
kvcluster_next_backup_timestamp_seconds{name="orders",namespace="shop"} 1.7960616e+09
# HELP kvcluster_operator_leading 1 on the elected operator replica, the one that exports the clusters' metrics (absent elsewhere).
# TYPE kvcluster_operator_leading gauge
kvcluster_operator_leading 1
# HELP kvcluster_phase 1 for the cluster's phase (Creating, Ready, Upgrading, Failed), 0 for the others.
# TYPE kvcluster_phase gauge
kvcluster_phase{name="orders",namespace="shop",phase="Creating"} 0
kvcluster_phase{name="orders",namespace="shop",phase="Failed"} 0
kvcluster_phase{name="orders",namespace="shop",phase="Ready"} 0
kvcluster_phase{name="orders",namespace="shop",phase="Upgrading"} 1
`
	if err := testutil.CollectAndCompare(staticCollector(true, degradedCluster()), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// A new cluster has no members, backups or quota yet: only what is known is exported (no zero
// that an alert would read as a fact), and a standby replica exports nothing.
func TestClusterCollectorExportsOnlyWhatIsKnown(t *testing.T) {
	fresh := kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "new"}, Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 1}}
	suspended := degradedCluster()
	suspended.Spec.Backup.Suspend = true
	tests := []struct {
		name    string
		c       *ClusterCollector
		metric  string
		present bool
	}{
		{"no backup yet: no last backup time", staticCollector(true, fresh), "kvcluster_last_backup_timestamp_seconds", false},
		{"no backup yet: no last backup result", staticCollector(true, fresh), "kvcluster_last_backup_succeeded", false},
		{"no quota reported yet", staticCollector(true, fresh), "kvcluster_backend_quota_bytes", false},
		{"no schedule: no interval", staticCollector(true, fresh), "kvcluster_backup_interval_seconds", false},
		{"suspended backups: no interval, so no stale backup alert", staticCollector(true, suspended), "kvcluster_backup_interval_seconds", false},
		{"a new cluster has its phase series", staticCollector(true, fresh), "kvcluster_phase", true},
		{"a standby replica exports nothing", staticCollector(false, degradedCluster()), "kvcluster_info", false},
		{"a standby replica does not say it leads", staticCollector(false, degradedCluster()), "kvcluster_operator_leading", false},
		{"the leader says so without any cluster", staticCollector(true), "kvcluster_operator_leading", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testutil.CollectAndCount(tt.c, tt.metric); (n > 0) != tt.present {
				t.Errorf("%s: %d series, want present=%t", tt.metric, n, tt.present)
			}
		})
	}
}

func TestLeaderChangesAreCountedOncePerChange(t *testing.T) {
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "leaders", UID: "u1"}}
	recreated := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "leaders", UID: "u2"}}
	var l leaderTracker
	changes := func() float64 { return testutil.ToFloat64(leaderChanges.WithLabelValues("shop", "leaders")) }
	steps := []struct {
		kvc    *kvv1.KVCluster
		leader string
		want   float64
	}{
		{kvc, "a", 0},       // first sight after a start: not a change
		{kvc, "a", 0},       // the same leader again (a stale cache shows nothing else)
		{kvc, "", 0},        // no leader for a while
		{kvc, "a", 0},       // the same one back
		{kvc, "b", 1},       // moved
		{kvc, "b", 1},       // seen twice, counted once
		{recreated, "c", 1}, // a new cluster under the same name starts afresh
		{recreated, "d", 2},
	}
	for i, s := range steps {
		l.saw(s.kvc, s.leader)
		if got := changes(); got != s.want {
			t.Fatalf("step %d (%s): %v leader changes, want %v", i, s.leader, got, s.want)
		}
	}
	l.forget(types.NamespacedName{Namespace: "shop", Name: "leaders"})
	if leaderChanges.DeleteLabelValues("shop", "leaders") {
		t.Error("a deleted cluster keeps its leader change series")
	}
}

var _ prometheus.Collector = (*ClusterCollector)(nil)

// exportedNames are the names of every kvcluster_ metric the operator serves: the clusters'
// (from clusters whose status has every part: a failed and a successful last backup) and the
// counters and histograms, each with a series so that it shows.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	backedUp := degradedCluster()
	backedUp.Name, backedUp.Status.LastBackup.Succeeded, backedUp.Status.LastBackup.Size = "backed-up", true, 77856
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(staticCollector(true, degradedCluster(), backedUp))
	finalBackupsLost.WithLabelValues("failed")
	leaderChanges.WithLabelValues("names", "names")
	reconcileStepDuration.WithLabelValues("names")
	reconcileStepErrors.WithLabelValues("names")
	t.Cleanup(func() {
		leaderChanges.DeleteLabelValues("names", "names")
		reconcileStepDuration.DeleteLabelValues("names")
		reconcileStepErrors.DeleteLabelValues("names")
	})
	names := map[string]bool{}
	for _, g := range []prometheus.Gatherer{reg, metrics.Registry} {
		families, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if strings.HasPrefix(f.GetName(), "kvcluster_") {
				names[f.GetName()] = true
			}
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\bkvcluster_[a-z0-9_]+`)

// Every metric the alert rules and the dashboard read is one the operator exports (an alert on a
// name that does not exist never fires), and the README documents exactly the metrics exported.
func TestRulesDashboardAndREADMEUseTheExportedMetrics(t *testing.T) {
	exported := exportedNames(t)
	for file, text := range map[string][]byte{"prometheusrule.yaml": monitoring.PrometheusRule, "dashboard.json": monitoring.Dashboard} {
		for _, name := range metricName.FindAllString(string(text), -1) {
			if base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum"); !exported[name] && !exported[base] {
				t.Errorf("deploy/monitoring/%s reads %s, which the operator does not export", file, name)
			}
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, row := range regexp.MustCompile("(?m)^\\| `(kvcluster_[a-z0-9_]+)`").FindAllStringSubmatch(string(readme), -1) {
		documented[row[1]] = true
	}
	for name := range exported {
		if !documented[name] {
			t.Errorf("%s is exported but not in the README's table of metrics", name)
		}
	}
	for name := range documented {
		if !exported[name] {
			t.Errorf("the README documents %s, which the operator does not export", name)
		}
	}
}

// BenchmarkScrape measures one scrape of the clusters' metrics for fleets of 1, 100 and 1,000
// healthy clusters of 3 members with TLS (four certificates), a backup schedule and a backup:
// the series and the bytes of the text exposition a scraper reads, and the time to make them.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			clusters := make([]kvv1.KVCluster, n)
			for i := range clusters {
				c := degradedCluster()
				c.Name = fmt.Sprintf("cluster-%04d", i)
				c.Status.Members[0].Alarms, c.Status.Members[1].Healthy, c.Status.Members[2].Learner = nil, true, false
				for _, part := range []string{"server", "peer", "client"} {
					c.Status.Certificates = append(c.Status.Certificates, kvv1.CertificateStatus{Name: part, NotAfter: *metaTime("2027-11-30T00:00:00Z")})
				}
				clusters[i] = c
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(staticCollector(true, clusters...))
			var series, size int
			b.ReportAllocs()
			for b.Loop() {
				families, err := reg.Gather()
				if err != nil {
					b.Fatal(err)
				}
				var out strings.Builder
				series = 0
				for _, f := range families {
					series += len(f.GetMetric())
					if _, err := expfmt.MetricFamilyToText(&out, f); err != nil {
						b.Fatal(err)
					}
				}
				size = out.Len()
			}
			b.ReportMetric(float64(series), "series")
			b.ReportMetric(float64(size), "exposition-bytes")
		})
	}
}
