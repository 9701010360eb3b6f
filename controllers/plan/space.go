package plan

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// nearQuotaPercent is the share of the quota past which a member's database puts the cluster
// under space pressure: etcd compares the database file's size (not the part in use) with it.
const nearQuotaPercent = 80

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

// setSpacePressure sets the SpacePressure condition from what etcd reports, and returns the
// events of a change: True with reason NoSpace while a NOSPACE alarm makes the cluster refuse
// writes, NearQuota while a database is past nearQuotaPercent of the quota. Unchanged while etcd
// does not answer. Stale alarms (inherited by a restored cluster, disarmed in this reconcile) are
// no space problem.
func setSpacePressure(st *kvv1.KVClusterStatus, kvc *kvv1.KVCluster, obs Observation, stale []members.Alarm, now time.Time) []Event {
	if obs.Cluster == nil || !obs.Cluster.HasLeader {
		return nil
	}
	status, reason, message := false, ReasonSpaceAvailable, fmt.Sprintf("every member's database is below %d%% of the quota", nearQuotaPercent)
	var noSpace []string
	for _, a := range obs.Cluster.Alarms {
		if a.Type == "NOSPACE" && !slices.Contains(stale, a) {
			noSpace = append(noSpace, memberName(kvc, obs.Cluster, a.MemberID))
		}
	}
	// Judged on the sizes status shows, which a member that does not answer now (restarting)
	// keeps from when it last did: the condition must not clear while it is away.
	var near []string
	for _, m := range st.Members {
		if quota := st.BackendQuota; m.DBSize != nil && quota != nil && !quota.IsZero() && m.DBSize.Value()*100 >= quota.Value()*nearQuotaPercent {
			near = append(near, fmt.Sprintf("%s %s of %s", m.Name, m.DBSize, quota))
		}
	}
	switch {
	case len(noSpace) > 0:
		status, reason = true, ReasonNoSpace
		message = fmt.Sprintf("etcd raised the NOSPACE alarm (%s): a database reached the quota and the cluster refuses writes "+
			"(reads and deletes still work). Free space: compact (etcdctl compact <revision>), defragment every member "+
			"(etcdctl defrag), then disarm (etcdctl alarm disarm); or delete data", strings.Join(noSpace, ", "))
	case len(near) > 0:
		status, reason = true, ReasonNearQuota
		message = fmt.Sprintf("databases at %d%% of the quota or more: %s; at the quota etcd refuses writes. Compact and defragment, or delete data",
			nearQuotaPercent, strings.Join(near, ", "))
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
		if m.ID == id {
			if m.Started() {
				return m.Name
			}
			if ord, ok := MemberOrdinal(kvc, m); ok {
				return specs.MemberName(kvc, ord)
			}
		}
	}
	return fmt.Sprintf("member %x", id)
}
