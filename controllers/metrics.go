package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// finalBackupsLost counts the KVClusters deleted without their final backup, by why: the
// operator's metrics outlive a deleted namespace, where events cannot be written any more.
var finalBackupsLost = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvcluster_final_backups_lost_total",
	Help: "KVClusters deleted without their final backup, by reason (failed, namespace_deleted, skipped).",
}, []string{"reason"})

func init() {
	metrics.Registry.MustRegister(finalBackupsLost)
}
