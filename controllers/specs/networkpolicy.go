package specs

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// OperatorPods says where the operator's own pods run, so that every cluster's NetworkPolicy
// admits them to the client port. Zero when the operator does not run in a pod of this Kubernetes
// cluster: its traffic then comes from a node, not from a pod a policy could name.
type OperatorPods struct {
	Namespace string
	Labels    map[string]string
}

// NetworkPolicyName is the NetworkPolicy of a cluster (spec.networkPolicy mode Managed).
func NetworkPolicyName(kvc *kvv1.KVCluster) string { return kvc.Name + "-members" }

// WantsNetworkPolicy says whether the operator keeps a NetworkPolicy for the cluster.
func WantsNetworkPolicy(kvc *kvv1.KVCluster) bool {
	np := kvc.Spec.NetworkPolicy
	return np != nil && np.Mode != kvv1.NetworkPolicyDisabled
}

// NetworkPolicy admits to the members only what they need (ingress only; what the members reach
// is theirs): the peer port from the other members; the client port from the cluster's own pods
// (members, backup and deregistration Jobs), the operator and spec.networkPolicy.clientsFrom; the
// metrics port from the cluster's own pods and spec.networkPolicy.metricsFrom. An empty "from"
// list of the spec means the KVCluster's namespace. The kubelet's probes come from the node,
// which policy engines let through. guard is the UID of the cluster's deletion guard, if it has
// one: the policy keeps protecting the members until the final backup ran.
func NetworkPolicy(kvc *kvv1.KVCluster, operator OperatorPods, guard types.UID) *networkingv1ac.NetworkPolicyApplyConfiguration {
	members := networkingv1ac.NetworkPolicyPeer().WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(kvc)))
	clusterPods := networkingv1ac.NetworkPolicyPeer().WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(clusterPodLabels(kvc)))

	clients := []*networkingv1ac.NetworkPolicyPeerApplyConfiguration{clusterPods}
	if operator.Namespace != "" {
		clients = append(clients, networkingv1ac.NetworkPolicyPeer().
			WithNamespaceSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{corev1.LabelMetadataName: operator.Namespace})).
			WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(operator.Labels)))
	}
	clients = append(clients, peersOrNamespace(kvc.Spec.NetworkPolicy.ClientsFrom)...)
	scrapers := append([]*networkingv1ac.NetworkPolicyPeerApplyConfiguration{clusterPods}, peersOrNamespace(kvc.Spec.NetworkPolicy.MetricsFrom)...)

	return networkingv1ac.NetworkPolicy(NetworkPolicyName(kvc), kvc.Namespace).
		WithLabels(Labels(kvc)).
		WithOwnerReferences(Owners(kvc, guard)...).
		WithSpec(networkingv1ac.NetworkPolicySpec().
			WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(SelectorLabels(kvc))).
			WithPolicyTypes(networkingv1.PolicyTypeIngress).
			WithIngress(
				networkingv1ac.NetworkPolicyIngressRule().WithPorts(policyPort(PeerPort)).WithFrom(members),
				networkingv1ac.NetworkPolicyIngressRule().WithPorts(policyPort(ClientPort)).WithFrom(clients...),
				networkingv1ac.NetworkPolicyIngressRule().WithPorts(policyPort(MetricsPort)).WithFrom(scrapers...),
			))
}

// clusterPodLabels select every pod of the cluster: its members and its Jobs' pods (JobPodLabels).
func clusterPodLabels(kvc *kvv1.KVCluster) map[string]string {
	return map[string]string{nameLabel: nameValue, ClusterLabel: kvc.Name, ManagedByLabel: ManagedByValue}
}

func policyPort(port int32) *networkingv1ac.NetworkPolicyPortApplyConfiguration {
	return networkingv1ac.NetworkPolicyPort().WithProtocol(corev1.ProtocolTCP).WithPort(intstr.FromInt32(port))
}

// peersOrNamespace turns the spec's peers into their apply configurations; none means every pod
// of the policy's own namespace (an empty pod selector and no namespace selector).
func peersOrNamespace(peers []networkingv1.NetworkPolicyPeer) []*networkingv1ac.NetworkPolicyPeerApplyConfiguration {
	if len(peers) == 0 {
		return []*networkingv1ac.NetworkPolicyPeerApplyConfiguration{networkingv1ac.NetworkPolicyPeer().WithPodSelector(metav1ac.LabelSelector())}
	}
	out := make([]*networkingv1ac.NetworkPolicyPeerApplyConfiguration, 0, len(peers))
	for _, p := range peers {
		ac := networkingv1ac.NetworkPolicyPeer()
		if p.PodSelector != nil {
			ac.WithPodSelector(labelSelector(p.PodSelector))
		}
		if p.NamespaceSelector != nil {
			ac.WithNamespaceSelector(labelSelector(p.NamespaceSelector))
		}
		if p.IPBlock != nil {
			ac.WithIPBlock(networkingv1ac.IPBlock().WithCIDR(p.IPBlock.CIDR).WithExcept(p.IPBlock.Except...))
		}
		out = append(out, ac)
	}
	return out
}

func labelSelector(s *metav1.LabelSelector) *metav1ac.LabelSelectorApplyConfiguration {
	ac := metav1ac.LabelSelector().WithMatchLabels(s.MatchLabels)
	for _, e := range s.MatchExpressions {
		ac.WithMatchExpressions(metav1ac.LabelSelectorRequirement().WithKey(e.Key).WithOperator(e.Operator).WithValues(e.Values...))
	}
	return ac
}
