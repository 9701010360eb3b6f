package specs

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// PeerService is the headless Service behind the members' stable DNS names. It publishes
// not-ready addresses because members must find each other before any of them is ready: readiness
// needs a quorum, and a quorum needs the peers to resolve.
func PeerService(kvc *kvv1.KVCluster) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(PeerServiceName(kvc), kvc.Namespace).
		WithLabels(Labels(kvc)).
		WithOwnerReferences(OwnerReference(kvc)).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(corev1.ClusterIPNone).
			WithPublishNotReadyAddresses(true).
			WithSelector(SelectorLabels(kvc)).
			WithPorts(
				servicePort("client", ClientPort),
				servicePort("peer", PeerPort),
			))
}

// ClientService load-balances clients over the ready members.
func ClientService(kvc *kvv1.KVCluster) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(ClientServiceName(kvc), kvc.Namespace).
		WithLabels(Labels(kvc)).
		WithOwnerReferences(OwnerReference(kvc)).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceTypeClusterIP).
			WithSelector(SelectorLabels(kvc)).
			WithPorts(servicePort("client", ClientPort)))
}

func servicePort(name string, port int32) *corev1ac.ServicePortApplyConfiguration {
	return corev1ac.ServicePort().
		WithName(name).
		WithProtocol(corev1.ProtocolTCP).
		WithPort(port).
		WithTargetPort(intstr.FromString(name))
}
