package specs

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// podOf reads a pod template apply configuration back as the typed template the API server stores.
func podOf(t *testing.T, tmpl *corev1ac.PodTemplateSpecApplyConfiguration) corev1.PodTemplateSpec {
	t.Helper()
	data, err := json.Marshal(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.PodTemplateSpec
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPodPolicy: spec.pods places the members (node selector, tolerations, affinity, topology
// spread over the cluster's members, priority, pull secrets, extra labels and annotations under the
// operator's own, service account) and the Jobs it starts (all but affinity and spread); unset, members spread
// softly across zones and nodes and preferably one per node.
func TestPodPolicy(t *testing.T) {
	members := &metav1.LabelSelector{MatchLabels: SelectorLabels(cluster(3))}
	softSpread := []corev1.TopologySpreadConstraint{
		{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: members},
		{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: members},
	}
	onePerNode := &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{
		{Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: members}}}}}
	storageNodes := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "disk", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}}}}}}}
	tolerate := []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "etcd", Effect: corev1.TaintEffectNoSchedule}}
	tests := []struct {
		name       string
		policy     kvv1.PodPolicy
		wantMember func(t *testing.T, pod corev1.PodTemplateSpec)
		wantJob    func(t *testing.T, pod corev1.PodTemplateSpec)
	}{{
		name: "unset: soft spread across zones and nodes, preferably one member per node, nothing on Jobs",
		wantMember: func(t *testing.T, pod corev1.PodTemplateSpec) {
			if !reflect.DeepEqual(pod.Spec.TopologySpreadConstraints, softSpread) || !reflect.DeepEqual(pod.Spec.Affinity, onePerNode) {
				t.Errorf("spread %+v, affinity %+v", pod.Spec.TopologySpreadConstraints, pod.Spec.Affinity)
			}
		},
		wantJob: func(t *testing.T, pod corev1.PodTemplateSpec) {
			if pod.Spec.NodeSelector != nil || pod.Spec.Tolerations != nil || pod.Spec.Affinity != nil || pod.Spec.TopologySpreadConstraints != nil || pod.Annotations != nil {
				t.Errorf("a Job placed without a policy: %+v", pod)
			}
		},
	}, {
		name: "everything set",
		policy: kvv1.PodPolicy{NodeSelector: map[string]string{"pool": "etcd"}, Tolerations: tolerate, Affinity: storageNodes,
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule}},
			PriorityClassName:         "etcd-critical", Labels: map[string]string{"team": "payments"}, Annotations: map[string]string{"cost-center": "42"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}}, ServiceAccountName: "backups"},
		wantMember: func(t *testing.T, pod corev1.PodTemplateSpec) {
			s := pod.Spec
			hardZones := []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: members}}
			if s.NodeSelector["pool"] != "etcd" || !reflect.DeepEqual(s.Tolerations, tolerate) || !reflect.DeepEqual(s.Affinity, storageNodes) ||
				!reflect.DeepEqual(s.TopologySpreadConstraints, hardZones) || s.PriorityClassName != "etcd-critical" ||
				len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "registry" || s.ServiceAccountName != "backups" {
				t.Errorf("member pod spec %+v", s)
			}
			if pod.Labels["team"] != "payments" || pod.Annotations["cost-center"] != "42" || pod.Labels[instanceLbl] != "kv" {
				t.Errorf("member labels %v, annotations %v", pod.Labels, pod.Annotations)
			}
		},
		wantJob: func(t *testing.T, pod corev1.PodTemplateSpec) {
			s := pod.Spec
			if s.NodeSelector["pool"] != "etcd" || !reflect.DeepEqual(s.Tolerations, tolerate) || s.PriorityClassName != "etcd-critical" ||
				len(s.ImagePullSecrets) != 1 || pod.Labels["team"] != "payments" || pod.Annotations["cost-center"] != "42" {
				t.Errorf("Job pod %+v", pod)
			}
			if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
				t.Error("a Job mounts its ServiceAccount's API token: it never calls the API server")
			}
			if s.Affinity != nil || s.TopologySpreadConstraints != nil {
				t.Errorf("a Job took the members' affinity or spread: %+v", s)
			}
			if _, member := pod.Labels[instanceLbl]; member {
				t.Errorf("a Job's pod carries the members' instance label: %v", pod.Labels)
			}
		},
	}, {
		name:   "extra labels never replace the operator's",
		policy: kvv1.PodPolicy{Labels: map[string]string{instanceLbl: "other", ClusterLabel: "other"}},
		wantMember: func(t *testing.T, pod corev1.PodTemplateSpec) {
			if pod.Labels[instanceLbl] != "kv" || pod.Labels[ClusterLabel] != "kv" {
				t.Errorf("member labels %v", pod.Labels)
			}
		},
		wantJob: func(t *testing.T, pod corev1.PodTemplateSpec) {
			if _, member := pod.Labels[instanceLbl]; member || pod.Labels[ClusterLabel] != "kv" {
				t.Errorf("Job pod labels %v: the members' selector would take it for one", pod.Labels)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kvc := cluster(3)
			kvc.Spec.Pods = tt.policy
			kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}}
			kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{TimeoutSeconds: 60, HTTP: &kvv1.HTTPDeregistration{URL: "https://registry.example/kv", Method: "DELETE"}}
			tt.wantMember(t, podOf(t, StatefulSet(kvc, MemberSet{Replicas: 3}).Spec.Template))
			for name, job := range map[string]*corev1ac.PodTemplateSpecApplyConfiguration{
				"backup":         OnDemandBackupJob(kvc, "now", "http", "op:1", time.Unix(0, 0)).Spec.Template,
				"deregistration": DeregistrationJob(kvc, "op:1", "").Spec.Template,
			} {
				t.Run(name, func(t *testing.T) {
					pod := podOf(t, job)
					tt.wantJob(t, pod)
					want := tt.policy.ServiceAccountName
					if name == "deregistration" {
						want = "" // it runs an image of the user's choosing and needs no bucket
					}
					if pod.Spec.ServiceAccountName != want {
						t.Errorf("service account %q, want %q", pod.Spec.ServiceAccountName, want)
					}
				})
			}
		})
	}
}
