package specs

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// placeMembers puts spec.pods on the members' pod template: where they run (node selector,
// tolerations, affinity, topology spread, priority), the image pull secrets, the service account, and the extra labels
// and annotations (the operator's own labels win). Unset affinity: preferably no two members on
// one node; unset spread: across zones and nodes, softly.
func placeMembers(kvc *kvv1.KVCluster, tmpl *corev1ac.PodTemplateSpecApplyConfiguration) {
	policy := kvc.Spec.Pods
	placePod(kvc, tmpl)
	reachStore(kvc, tmpl)
	members := metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(kvc))
	if policy.Affinity != nil {
		tmpl.Spec.WithAffinity(applyConfigOf[corev1ac.AffinityApplyConfiguration](policy.Affinity))
	} else {
		tmpl.Spec.WithAffinity(corev1ac.Affinity().WithPodAntiAffinity(corev1ac.PodAntiAffinity().
			WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.WeightedPodAffinityTerm().
				WithWeight(100).
				WithPodAffinityTerm(corev1ac.PodAffinityTerm().
					WithTopologyKey(corev1.LabelHostname).
					WithLabelSelector(members)))))
	}
	if len(policy.TopologySpreadConstraints) == 0 {
		for _, key := range []string{corev1.LabelTopologyZone, corev1.LabelHostname} {
			tmpl.Spec.WithTopologySpreadConstraints(corev1ac.TopologySpreadConstraint().
				WithMaxSkew(1).
				WithTopologyKey(key).
				WithWhenUnsatisfiable(corev1.ScheduleAnyway).
				WithLabelSelector(members))
		}
	}
	for i := range policy.TopologySpreadConstraints {
		c := applyConfigOf[corev1ac.TopologySpreadConstraintApplyConfiguration](&policy.TopologySpreadConstraints[i])
		tmpl.Spec.WithTopologySpreadConstraints(c.WithLabelSelector(members))
	}
}

// placePod puts what spec.pods says of every pod, a member's or a Job's, on a pod template: node
// selector, tolerations, priority, image pull secrets, extra labels and annotations. The
// template's own labels are set already and win, and no extra label may take a key of the
// operator's (admission refuses them too). Affinity and spread are the members' alone.
func placePod(kvc *kvv1.KVCluster, tmpl *corev1ac.PodTemplateSpecApplyConfiguration) {
	policy := kvc.Spec.Pods
	operators := Labels(kvc) // a Job's pod lacks the instance label on purpose: it must stay off
	for k, v := range policy.Labels {
		_, own := tmpl.Labels[k]
		if _, reserved := operators[k]; !own && !reserved {
			tmpl.WithLabels(map[string]string{k: v})
		}
	}
	tmpl.WithAnnotations(policy.Annotations)
	tmpl.Spec.WithNodeSelector(policy.NodeSelector)
	for i := range policy.Tolerations {
		tmpl.Spec.WithTolerations(applyConfigOf[corev1ac.TolerationApplyConfiguration](&policy.Tolerations[i]))
	}
	if policy.PriorityClassName != "" {
		tmpl.Spec.WithPriorityClassName(policy.PriorityClassName)
	}
	for _, s := range policy.ImagePullSecrets {
		tmpl.Spec.WithImagePullSecrets(corev1ac.LocalObjectReference().WithName(s.Name))
	}
}

// reachStore gives the pods that reach the backups' store (members, which restore, and backup
// Jobs) spec.pods.serviceAccountName, whose cloud identity s3.workloadIdentity uses. Not the
// deregistration Job: it runs an image of the user's choosing and needs no bucket.
func reachStore(kvc *kvv1.KVCluster, tmpl *corev1ac.PodTemplateSpecApplyConfiguration) {
	if name := kvc.Spec.Pods.ServiceAccountName; name != "" {
		tmpl.Spec.WithServiceAccountName(name)
	}
}

// applyConfigOf turns a typed API object into its apply configuration through its JSON form,
// which both share field for field.
func applyConfigOf[T any](typed any) *T {
	data, err := json.Marshal(typed)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", typed, err)) // API types always marshal
	}
	out := new(T)
	if err := json.Unmarshal(data, out); err != nil {
		panic(fmt.Sprintf("%T into %T: %v", typed, out, err)) // the same JSON form
	}
	return out
}
