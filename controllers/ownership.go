package controllers

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// lookup reads an object from the cache and, when the cache lacks it, from the API server: the
// cache holds only objects labelled as the operator's, so an object someone else created under a
// name the operator derives would otherwise look absent and be taken over by the next apply.
func (r *KVClusterReconciler) lookup(ctx context.Context, key client.ObjectKey, obj client.Object) (bool, error) {
	err := r.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, obj)
	}
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("get %T %s: %w", obj, key, err)
}

// controlledBy reports whether this incarnation of the KVCluster controls obj.
func controlledBy(obj metav1.Object, kvc *kvv1.KVCluster) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == kvc.UID
}

func ownerOf(obj metav1.Object) string {
	if ref := metav1.GetControllerOf(obj); ref != nil {
		return fmt.Sprintf("controlled by %s %s, uid %s", ref.Kind, ref.Name, ref.UID)
	}
	return "not created by this KVCluster"
}

// ownedBy: one of obj's owners has this UID.
func ownedBy(obj metav1.Object, uid types.UID) bool {
	return slices.ContainsFunc(obj.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == uid })
}
