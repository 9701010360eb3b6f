package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// applyOwned writes the full desired object with server-side apply as the operator's field manager,
// forcing ownership of every field it sets. When the cached object already carries exactly this
// intent under our manager, nothing is sent: an idle reconcile makes no write request, while an
// edit by anyone else changes what we own (or takes it over) and is put back.
//
// current is the cached object, left empty (no name) when it does not exist; extract is the generated
// Extract<Kind> of its apply configuration package.
func applyOwned[O client.Object, AC runtime.ApplyConfiguration](ctx context.Context, c client.Client, desired AC, current O,
	extract func(O, string) (AC, error)) error {
	if current.GetName() != "" {
		if owned, err := extract(current, specs.FieldManager); err == nil && equality.Semantic.DeepEqual(owned, desired) {
			return nil
		}
	}
	if err := c.Apply(ctx, desired, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply %T: %w", current, err)
	}
	return nil
}

// applyStatus writes the whole status with server-side apply on the status subresource, unless the
// status our manager owns already equals it.
func applyStatus(ctx context.Context, c client.Client, kvc *kvv1.KVCluster, st kvv1.KVClusterStatus) error {
	desired := kvv1ac.KVCluster(kvc.Name, kvc.Namespace).WithStatus(statusApplyConfiguration(st))
	if owned, err := kvv1ac.ExtractKVClusterStatus(kvc, specs.FieldManager); err == nil &&
		equality.Semantic.DeepEqual(owned.Status, desired.Status) {
		return nil
	}
	if err := c.Status().Apply(ctx, desired, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply status of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	return nil
}

// statusApplyConfiguration turns a status into its apply configuration. Zero values are left out,
// as the API's omitempty tags leave them out of the stored object; sending them would make the
// owned and the desired status differ forever and turn every reconcile into a write.
func statusApplyConfiguration(st kvv1.KVClusterStatus) *kvv1ac.KVClusterStatusApplyConfiguration {
	ac := kvv1ac.KVClusterStatus()
	if st.ObservedGeneration != 0 {
		ac.WithObservedGeneration(st.ObservedGeneration)
	}
	if st.Phase != "" {
		ac.WithPhase(st.Phase)
	}
	if st.ReadyPartitions != 0 {
		ac.WithReadyPartitions(st.ReadyPartitions)
	}
	if st.CurrentVersion != "" {
		ac.WithCurrentVersion(st.CurrentVersion)
	}
	if st.LastBackupTime != nil {
		ac.WithLastBackupTime(*st.LastBackupTime)
	}
	if st.LastProgressTime != nil {
		ac.WithLastProgressTime(*st.LastProgressTime)
	}
	if st.ClientEndpoint != "" {
		ac.WithClientEndpoint(st.ClientEndpoint)
	}
	for _, m := range st.Members {
		mac := kvv1ac.MemberStatus().WithName(m.Name).WithID(m.ID)
		if m.Version != "" {
			mac.WithVersion(m.Version)
		}
		if m.Leader {
			mac.WithLeader(true)
		}
		if m.Learner {
			mac.WithLearner(true)
		}
		if m.Healthy {
			mac.WithHealthy(true)
		}
		ac.WithMembers(mac)
	}
	for _, cond := range st.Conditions {
		cac := metav1ac.Condition().
			WithType(cond.Type).
			WithStatus(cond.Status).
			WithReason(cond.Reason).
			WithMessage(cond.Message).
			WithLastTransitionTime(cond.LastTransitionTime)
		if cond.ObservedGeneration != 0 {
			cac.WithObservedGeneration(cond.ObservedGeneration)
		}
		ac.WithConditions(cac)
	}
	return ac
}
