package controllers

import (
	"context"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// clientRulePeers describes who the policy admits to the client port, one entry per peer.
func clientRulePeers(np *networkingv1.NetworkPolicy) []string {
	var out []string
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) != 1 || r.Ports[0].Port.IntVal != specs.ClientPort {
			continue
		}
		for _, p := range r.From {
			var parts []string
			if p.NamespaceSelector != nil {
				parts = append(parts, "ns "+metav1.FormatLabelSelector(p.NamespaceSelector))
			}
			if p.PodSelector != nil {
				parts = append(parts, "pods "+metav1.FormatLabelSelector(p.PodSelector))
			}
			out = append(out, strings.Join(parts, " "))
		}
	}
	return out
}

// TestTheNetworkPolicyFollowsTheSpec: a cluster without spec.networkPolicy gets none (clusters
// from before it keep every client); mode Managed gets one, controlled by the KVCluster and
// written by our manager alone, admitting the operator's pods; a change of clientsFrom reaches it
// and an idle reconcile writes nothing; mode Disabled deletes it with an event. A policy of the
// same name that is someone else's is never touched: left alone while Disabled, and reported (not
// overwritten) when the cluster wants its own.
func TestTheNetworkPolicyFollowsTheSpec(t *testing.T) {
	h := newHarness(t)
	h.r.Operator = specs.OperatorPods{Namespace: "kvcluster-system", Labels: map[string]string{"app.kubernetes.io/name": "kvcluster-operator"}}
	ctx := context.Background()
	ns := h.namespace("netpol")
	kvc := newKVCluster(ns, "kv", 3)
	h.create(kvc)
	h.members.set(members.Cluster{}, errNoQuorum)
	update := func(k *kvv1.KVCluster) {
		t.Helper()
		if err := h.client.Update(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	policy := func() (*networkingv1.NetworkPolicy, bool) {
		np := &networkingv1.NetworkPolicy{}
		err := h.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kv-members"}, np)
		if apierrors.IsNotFound(err) {
			return nil, false
		} else if err != nil {
			t.Fatal(err)
		}
		return np, true
	}

	h.reconcile(kvc)
	if _, found := policy(); found {
		t.Fatal("a cluster without spec.networkPolicy got a NetworkPolicy")
	}

	got := h.fresh(kvc)
	got.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyManaged}
	update(got)
	h.reconcile(kvc)
	np, found := policy()
	if !found {
		t.Fatal("mode Managed: no NetworkPolicy")
	}
	if ref := metav1.GetControllerOf(np); ref == nil || ref.UID != got.UID {
		t.Errorf("the NetworkPolicy is not controlled by the KVCluster: %v", np.OwnerReferences)
	}
	for _, mf := range np.ManagedFields {
		if mf.Manager != specs.FieldManager || mf.Operation != metav1.ManagedFieldsOperationApply {
			t.Errorf("the NetworkPolicy has fields managed by %q (%s)", mf.Manager, mf.Operation)
		}
	}
	operator := "ns kubernetes.io/metadata.name=kvcluster-system pods app.kubernetes.io/name=kvcluster-operator"
	if peers := clientRulePeers(np); len(peers) != 3 || peers[1] != operator || peers[2] != "pods <none>" {
		t.Errorf("client port admits %q; want the cluster's pods, %q and the namespace (pods <none>)", peers, operator)
	}
	h.assertIdle(kvc, "with a NetworkPolicy")

	got = h.fresh(kvc)
	got.Spec.NetworkPolicy.ClientsFrom = []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}}, PodSelector: &metav1.LabelSelector{}}}
	update(got)
	h.reconcile(kvc)
	np, _ = policy()
	if peers := clientRulePeers(np); len(peers) != 3 || peers[2] != "ns team=shop pods <none>" {
		t.Errorf("after clientsFrom changed the client port admits %q", peers)
	}

	got = h.fresh(kvc)
	got.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyDisabled}
	update(got)
	drainEvents(h)
	h.reconcile(kvc)
	if _, found := policy(); found {
		t.Error("mode Disabled: the operator's NetworkPolicy is still there")
	}
	if ev := drainEvents(h); !strings.Contains(ev, plan.EventNetworkPolicyDeleted) {
		t.Errorf("events %q, want %s", ev, plan.EventNetworkPolicyDeleted)
	}

	// The user's own policy under the same name.
	own := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "kv-members", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if err := h.client.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	h.reconcile(kvc)
	if np, found := policy(); !found || np.UID != own.UID {
		t.Fatal("mode Disabled: the user's own NetworkPolicy of the same name was deleted")
	}
	if c := meta.FindStatusCondition(h.fresh(kvc).Status.Conditions, kvv1.ConditionReady); c != nil && c.Reason == plan.ReasonObjectConflict {
		t.Errorf("mode Disabled: the user's own policy is reported as a conflict: %s", c.Message)
	}
	got = h.fresh(kvc)
	got.Spec.NetworkPolicy = &kvv1.NetworkPolicySpec{Mode: kvv1.NetworkPolicyManaged}
	update(got)
	h.reconcile(kvc)
	if np, _ := policy(); len(np.Spec.Ingress) != 0 || len(np.OwnerReferences) != 0 {
		t.Errorf("mode Managed took over the user's own NetworkPolicy: %+v", np)
	}
	if got := h.fresh(kvc); got.Status.Phase != kvv1.PhaseFailed || !strings.Contains(conditionMessages(got), "NetworkPolicy kv-members") {
		t.Errorf("mode Managed next to the user's own policy: phase %s, conditions %q; want Failed naming NetworkPolicy kv-members",
			got.Status.Phase, conditionMessages(got))
	}
}

func conditionMessages(kvc *kvv1.KVCluster) string {
	var out []string
	for _, c := range kvc.Status.Conditions {
		out = append(out, c.Type+": "+c.Message)
	}
	return strings.Join(out, "; ")
}
