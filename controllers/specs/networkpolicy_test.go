package specs

import (
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// policyNamespace is the namespace of the clusters of this test (see cluster).
const policyNamespace = "prod"

// admits says whether a rule's peer, as the policy engine reads it, lets a pod with these labels
// in namespace ns through: a peer without a namespace selector names the policy's own namespace.
// An ipBlock peer is taken to admit everything: a builder that added one would widen access.
func admits(p *networkingv1ac.NetworkPolicyPeerApplyConfiguration, ns string, podLabels map[string]string) bool {
	switch {
	case p.IPBlock != nil:
		return true
	case p.NamespaceSelector == nil && ns != policyNamespace:
		return false
	case p.NamespaceSelector != nil && !selector(p.NamespaceSelector).Matches(labels.Set{"kubernetes.io/metadata.name": ns}):
		return false
	}
	return p.PodSelector == nil || selector(p.PodSelector).Matches(labels.Set(podLabels))
}

func selector(s *metav1ac.LabelSelectorApplyConfiguration) labels.Selector {
	ls := &metav1.LabelSelector{MatchLabels: s.MatchLabels}
	for _, e := range s.MatchExpressions {
		ls.MatchExpressions = append(ls.MatchExpressions, metav1.LabelSelectorRequirement{Key: *e.Key, Operator: *e.Operator, Values: e.Values})
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		panic(err)
	}
	return sel
}

// ruleFor is the ingress rule of a port.
func ruleFor(t *testing.T, np *networkingv1ac.NetworkPolicyApplyConfiguration, port int32) *networkingv1ac.NetworkPolicyIngressRuleApplyConfiguration {
	t.Helper()
	for i := range np.Spec.Ingress {
		r := &np.Spec.Ingress[i]
		if len(r.Ports) == 1 && r.Ports[0].Port.IntVal == port {
			return r
		}
	}
	t.Fatalf("no ingress rule for port %d", port)
	return nil
}

func admittedBy(r *networkingv1ac.NetworkPolicyIngressRuleApplyConfiguration, ns string, podLabels map[string]string) bool {
	for i := range r.From {
		if admits(&r.From[i], ns, podLabels) {
			return true
		}
	}
	return false
}

// TestNetworkPolicyAdmitsWhatTheClusterNeeds: the policy applies to the members alone; the peer
// port admits the members and nothing else, not even the cluster's Jobs; the client port admits
// the members and the pods of the cluster's own backup and deregistration Jobs (as those Jobs
// label them: a label change there must not lock backups out), the operator's pods, and by
// default the namespace; the metrics port the cluster's pods and by default the namespace.
// Clients the spec names replace the namespace default.
func TestNetworkPolicyAdmitsWhatTheClusterNeeds(t *testing.T) {
	kvc := cluster(3)
	kvc.Spec.Backup = &kvv1.BackupSpec{PVC: &kvv1.PVCDestination{ClaimName: "backups"}}
	kvc.Spec.Deregistration = &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{URL: "https://registry.example/x", Method: "POST"}}
	kvc.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyManaged}
	operator := OperatorPods{Namespace: "kvcluster-system", Labels: map[string]string{"app.kubernetes.io/name": "kvcluster-operator"}}
	if kvc.Namespace != policyNamespace {
		t.Fatalf("cluster() is in namespace %q", kvc.Namespace)
	}
	np := NetworkPolicy(kvc, operator, "")

	memberPod := StatefulSet(kvc, MemberSet{Replicas: 3}).Spec.Template.Labels
	jobPods := map[string]map[string]string{}
	for name, job := range map[string]*batchv1ac.JobApplyConfiguration{
		"scheduled backup": BackupJob(kvc, ScheduledBackupRun(kvc, "kv-1"), "op:1"),
		"final backup":     BackupJob(kvc, FinalBackupRun(kvc, time.Now()), "op:1"),
		"deregistration":   DeregistrationJob(kvc, "op:1", ""),
	} {
		jobPods[name] = job.Spec.Template.Labels
	}
	application := map[string]string{"app": "shop"}

	if !selector(np.Spec.PodSelector).Matches(labels.Set(memberPod)) {
		t.Errorf("the policy does not apply to the member pods %v", memberPod)
	}
	for name, l := range jobPods {
		if selector(np.Spec.PodSelector).Matches(labels.Set(l)) {
			t.Errorf("the policy applies to the %s Job's pods: they would be cut off too", name)
		}
	}
	if got := np.Spec.PolicyTypes; len(got) != 1 || got[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("policy types %v, want Ingress only (what members reach is not restricted)", got)
	}

	peer, client, metrics := ruleFor(t, np, PeerPort), ruleFor(t, np, ClientPort), ruleFor(t, np, MetricsPort)
	if !admittedBy(peer, kvc.Namespace, memberPod) || admittedBy(peer, kvc.Namespace, application) {
		t.Errorf("peer port: members admitted %t, an application pod admitted %t; want only members",
			admittedBy(peer, kvc.Namespace, memberPod), admittedBy(peer, kvc.Namespace, application))
	}
	for name, l := range jobPods {
		if admittedBy(peer, kvc.Namespace, l) {
			t.Errorf("peer port admits the %s Job's pods", name)
		}
		if !admittedBy(client, kvc.Namespace, l) {
			t.Errorf("client port does not admit the %s Job's pods %v", name, l)
		}
		if !admittedBy(metrics, kvc.Namespace, l) {
			t.Errorf("metrics port does not admit the %s Job's pods %v", name, l)
		}
	}
	for _, r := range []*networkingv1ac.NetworkPolicyIngressRuleApplyConfiguration{client, metrics} {
		if !admittedBy(r, kvc.Namespace, memberPod) || !admittedBy(r, kvc.Namespace, application) {
			t.Errorf("port %d: members admitted %t, the namespace's pods %t; want both", r.Ports[0].Port.IntVal,
				admittedBy(r, kvc.Namespace, memberPod), admittedBy(r, kvc.Namespace, application))
		}
	}
	if !admittedBy(client, "kvcluster-system", operator.Labels) || admittedBy(client, "kvcluster-system", application) {
		t.Errorf("client port: operator admitted %t, another pod of its namespace %t; want only the operator",
			admittedBy(client, "kvcluster-system", operator.Labels), admittedBy(client, "kvcluster-system", application))
	}
	if admittedBy(metrics, "kvcluster-system", operator.Labels) || admittedBy(client, "elsewhere", application) {
		t.Error("the operator needs no metrics port, and other namespaces no client port")
	}

	// Clients the spec names replace the namespace's pods; the cluster's own and the operator stay.
	kvc.Spec.NetworkPolicy.ClientsFrom = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: application}}}
	client = ruleFor(t, NetworkPolicy(kvc, operator, ""), ClientPort)
	if !admittedBy(client, kvc.Namespace, application) || admittedBy(client, kvc.Namespace, map[string]string{"app": "other"}) {
		t.Errorf("with clientsFrom app=shop: shop admitted %t, other %t", admittedBy(client, kvc.Namespace, application),
			admittedBy(client, kvc.Namespace, map[string]string{"app": "other"}))
	}
	if !admittedBy(client, kvc.Namespace, jobPods["final backup"]) || !admittedBy(client, "kvcluster-system", operator.Labels) {
		t.Error("naming clients locked out the final backup or the operator")
	}
	// An operator outside the cluster is named nowhere (an empty namespace would mean all of them).
	for _, p := range NetworkPolicy(kvc, OperatorPods{}, "").Spec.Ingress[1].From {
		if p.NamespaceSelector != nil {
			t.Errorf("without operator pods the client rule names a namespace selector: %v", p.NamespaceSelector)
		}
	}
}
