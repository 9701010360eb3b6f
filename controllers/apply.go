package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// applyOwned writes the full desired object with server-side apply as the operator's field manager,
// forcing ownership of every field it sets. It first reads the object (key) from the cache into
// current: when that already carries exactly this intent under our manager, nothing is sent, so an
// idle reconcile makes no write request, while an edit by anyone else changes what we own (or
// takes it over) and is put back. extract is the generated Extract<Kind> of the object's apply
// configuration package; held spares it when this version of the object was already found to
// hold this intent. current is left empty when the object did not exist.
func applyOwned[O client.Object, AC runtime.ApplyConfiguration](ctx context.Context, c client.Client, held *heldIntents, kvc *kvv1.KVCluster,
	key client.ObjectKey, current O, desired AC, extract func(O, string) (AC, error)) error {
	switch err := c.Get(ctx, key, current); {
	case err == nil:
		if !controlledBy(current, kvc) { // never taken over: see foreignChildren
			return &notOwnedError{what: fmt.Sprintf("%T %s (%s)", current, key, ownerOf(current))}
		}
		if held.holds(kvc, current, fmt.Sprintf("%T", current), desired, func() bool {
			owned, err := extract(current, specs.FieldManager)
			return err == nil && equality.Semantic.DeepEqual(owned, desired)
		}) {
			return nil
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("get %T %s: %w", current, key, err)
	}
	if err := c.Apply(ctx, desired, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply %T %s: %w", current, key, err)
	}
	return nil
}

// notOwnedError: an object the cluster would write exists and is someone else's.
type notOwnedError struct{ what string }

func (e *notOwnedError) Error() string { return e.what + " is not this KVCluster's" }

// applyStatus writes the whole status with server-side apply on the status subresource, unless the
// status our manager owns already equals it.
func applyStatus(ctx context.Context, c client.Client, held *heldIntents, kvc *kvv1.KVCluster, st kvv1.KVClusterStatus) error {
	sac, err := statusApplyConfiguration(st)
	if err != nil {
		return fmt.Errorf("status of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	desired := kvv1ac.KVCluster(kvc.Name, kvc.Namespace).WithStatus(sac)
	if held.holds(kvc, kvc, "status", desired, func() bool {
		owned, err := kvv1ac.ExtractKVClusterStatus(kvc, specs.FieldManager)
		return err == nil && equality.Semantic.DeepEqual(owned.Status, desired.Status)
	}) {
		return nil
	}
	if err := c.Status().Apply(ctx, desired, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply status of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	return nil
}

// statusApplyConfiguration turns a status into its apply configuration through its JSON form.
// Every field of KVClusterStatus is omitempty, a pointer, or always set, so the JSON is exactly
// what the API server stores and what Extract reads back: zero values are not sent (which would
// make owned and desired differ for ever), and no field is forgotten when the API grows. (Marshalling
// typed objects is unsafe for ObjectMeta's zero values; the status has none.)
func statusApplyConfiguration(st kvv1.KVClusterStatus) (*kvv1ac.KVClusterStatusApplyConfiguration, error) {
	data, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	ac := &kvv1ac.KVClusterStatusApplyConfiguration{}
	if err := json.Unmarshal(data, ac); err != nil {
		return nil, err
	}
	return ac, nil
}

// heldIntents remembers, per cluster, the version (UID and resource version) of each object it
// applies at which that object was found to hold the operator's intent, and a digest of that
// intent. Comparing through Extract reads the object's managed fields: over 1 ms and 300 KB of
// garbage for a StatefulSet, on every reconcile of every cluster; an object that has not changed
// since, asked for the same intent, holds it still. Any change to the object (its own status
// included) gives it a new resource version, and is compared afresh. The zero value is ready.
type heldIntents struct {
	mu        sync.Mutex
	byCluster map[types.NamespacedName]map[string]heldIntent
}

type heldIntent struct {
	uid             types.UID
	resourceVersion string
	digest          [sha256.Size]byte
}

// holds reports whether obj, of the cluster, holds desired: from memory when this version of it
// was found to hold it before, else by compare, remembered when true. kind tells apart the cluster's
// objects that share a name (its StatefulSet and PodDisruptionBudget); what makes the memory
// right is the UID, resource version and digest, the key only bounds how much is kept. An object
// with no resource version (not read from the API server) is always compared.
func (h *heldIntents) holds(kvc *kvv1.KVCluster, obj client.Object, kind string, desired any, compare func() bool) bool {
	if obj.GetResourceVersion() == "" {
		return compare()
	}
	data, err := json.Marshal(desired)
	if err != nil {
		return compare()
	}
	seen := heldIntent{uid: obj.GetUID(), resourceVersion: obj.GetResourceVersion(), digest: sha256.Sum256(data)}
	cluster, name := types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}, kind+"/"+obj.GetName()
	h.mu.Lock()
	known := h.byCluster[cluster][name] == seen
	h.mu.Unlock()
	if known {
		return true
	}
	if !compare() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byCluster == nil {
		h.byCluster = map[types.NamespacedName]map[string]heldIntent{}
	}
	if h.byCluster[cluster] == nil {
		h.byCluster[cluster] = map[string]heldIntent{}
	}
	h.byCluster[cluster][name] = seen
	return true
}

// forget drops a cluster that is gone.
func (h *heldIntents) forget(cluster types.NamespacedName) {
	h.mu.Lock()
	delete(h.byCluster, cluster)
	h.mu.Unlock()
}
