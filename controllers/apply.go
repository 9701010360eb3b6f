package controllers

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// applyOwned writes the full desired object with server-side apply as the operator's field manager,
// forcing ownership of every field it sets. It first reads the object (key) from the cache into
// current: when that already carries exactly this intent under our manager (holdsIntent), nothing
// is sent, so an idle reconcile makes no write request, while an edit by anyone else changes what
// we own (or takes it over) and is put back. current is left empty when the object did not exist.
func applyOwned(ctx context.Context, c client.Client, kvc *kvv1.KVCluster, key client.ObjectKey, current client.Object, desired runtime.ApplyConfiguration) error {
	switch err := c.Get(ctx, key, current); {
	case err == nil:
		if !controlledBy(current, kvc) { // never taken over: see foreignChildren
			return &notOwnedError{what: fmt.Sprintf("%T %s (%s)", current, key, ownerOf(current))}
		}
		if holdsIntent(current, desired) {
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

// intentAnnotation is where the cache keeps, of an object the operator applies, the digest of
// what the operator's field manager owns in it (cachedIntent), in place of its managed fields. The
// operator never writes a cached object back, it applies what it builds; and the same annotation
// set on the object itself is dropped, and could not hold a digest of this process (intentKey).
const intentAnnotation = "kvcluster.io/cached-owned-intent"

// intentKey keys the digests of intents (HMAC), drawn anew by each operator process: nobody who
// can annotate an object can make it look, to the operator, as if it held its intent.
var intentKey = func() []byte {
	key := make([]byte, sha256.Size)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return key
}()

// ownedIntent is what the operator's field manager owns in obj (the generated Extract of its
// kind), of the kinds applyOwned and applyGuard apply; of a KVCluster, its status (applyStatus).
func ownedIntent(obj client.Object) (any, error) {
	switch o := obj.(type) {
	case *kvv1.KVCluster:
		owned, err := kvv1ac.ExtractKVClusterStatus(o, specs.FieldManager)
		if err != nil {
			return nil, err
		}
		return owned.Status, nil
	case *appsv1.StatefulSet:
		return appsv1ac.ExtractStatefulSet(o, specs.FieldManager)
	case *corev1.Service:
		return corev1ac.ExtractService(o, specs.FieldManager)
	case *policyv1.PodDisruptionBudget:
		return policyv1ac.ExtractPodDisruptionBudget(o, specs.FieldManager)
	case *networkingv1.NetworkPolicy:
		return networkingv1ac.ExtractNetworkPolicy(o, specs.FieldManager)
	case *corev1.ConfigMap:
		return corev1ac.ExtractConfigMap(o, specs.FieldManager)
	case *corev1.Secret:
		return corev1ac.ExtractSecret(o, specs.FieldManager)
	}
	return nil, fmt.Errorf("the operator applies no %T", obj)
}

// intentDigest is the digest of an intent (an apply configuration) in its JSON form: the form it
// is sent in, where zero values are left out and maps are sorted, so an intent Extract read back
// and the same intent built by specs have the same digest.
func intentDigest(intent any) (string, error) {
	data, err := json.Marshal(intent)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, intentKey)
	mac.Write(data)
	return hex.EncodeToString(mac.Sum(nil)), nil
}

// cachedIntent is what the cache keeps of an object the operator applies: instead of its managed
// fields (a third of a StatefulSet's size in the cache, even when only the operator's are kept),
// the digest of the operator's part of them (intentAnnotation), computed once per version of the
// object, as the informer stores it; and of the rest only what the operator reads (unreadDropped).
// It changes obj in place (the informer's own copy); an object without managed fields is left as
// it is, so a second pass changes nothing (the informer may make two). (Such an object, from the
// API server, would have no digest of this process and be applied again, which gives it some.)
func cachedIntent(obj any) any {
	o, ok := obj.(client.Object)
	if !ok || len(o.GetManagedFields()) == 0 {
		return obj
	}
	annotations := o.GetAnnotations()
	delete(annotations, intentAnnotation) // the object's own, if someone set it
	if intent, err := ownedIntent(o); err == nil {
		if digest, err := intentDigest(intent); err == nil {
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[intentAnnotation] = digest
			o.SetAnnotations(annotations)
		}
	}
	o.SetManagedFields(nil)
	unreadDropped(o)
	return o
}

// unreadDropped drops, of an object the operator applies, what it never reads once the digest of
// its intent is had: of the StatefulSet, all of its spec but what statefulSetObserved reads (the
// pod template's probes, environment, mounts, the init containers: most of its size); of Services,
// PodDisruptionBudgets and NetworkPolicies, all but their metadata (their owners, annotations and
// deletion are read). ConfigMaps (the membership) and Secrets (the certificates) are read whole.
func unreadDropped(obj client.Object) {
	switch o := obj.(type) {
	case *appsv1.StatefulSet:
		template := o.Spec.Template
		spec := appsv1.StatefulSetSpec{Replicas: o.Spec.Replicas}
		spec.Template.Annotations = template.Annotations
		for _, c := range template.Spec.Containers {
			spec.Template.Spec.Containers = append(spec.Template.Spec.Containers, corev1.Container{Name: c.Name, Args: specs.TemplateArgs(c.Args)})
		}
		for _, v := range template.Spec.Volumes {
			if v.Secret != nil {
				spec.Template.Spec.Volumes = append(spec.Template.Spec.Volumes, corev1.Volume{Name: v.Name,
					VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: v.Secret.SecretName}}})
			}
		}
		if len(o.Spec.VolumeClaimTemplates) > 0 {
			claim := o.Spec.VolumeClaimTemplates[0]
			spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Labels: claim.Labels},
				Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: sharedStorage.of(claim.Spec.Resources.Requests)}}}}
		}
		o.Spec = spec
	case *corev1.Service:
		o.Spec, o.Status = corev1.ServiceSpec{}, corev1.ServiceStatus{}
	case *policyv1.PodDisruptionBudget:
		o.Spec, o.Status = policyv1.PodDisruptionBudgetSpec{}, policyv1.PodDisruptionBudgetStatus{}
	case *networkingv1.NetworkPolicy:
		o.Spec = networkingv1.NetworkPolicySpec{}
	}
}

// holdsIntent reports whether current, as read, holds desired under the operator's field
// manager: from the digest the cache keeps (cachedIntent), or, of an object read from the API
// server, from its managed fields. An object the digest cannot be had of does not hold it.
func holdsIntent(current client.Object, desired any) bool {
	want, err := intentDigest(desired)
	if err != nil {
		return false
	}
	if have, cached := current.GetAnnotations()[intentAnnotation]; cached && len(current.GetManagedFields()) == 0 {
		return have == want
	}
	intent, err := ownedIntent(current)
	if err != nil {
		return false
	}
	have, err := intentDigest(intent)
	return err == nil && have == want
}

// notOwnedError: an object the cluster would write exists and is someone else's.
type notOwnedError struct{ what string }

func (e *notOwnedError) Error() string { return e.what + " is not this KVCluster's" }

// applyStatus writes the whole status with server-side apply on the status subresource, unless the
// status our manager owns already equals it (holdsIntent: of a cached KVCluster, the digest the
// cache keeps of it).
func applyStatus(ctx context.Context, c client.Client, writes *statusWrites, kvc *kvv1.KVCluster, st kvv1.KVClusterStatus) error {
	sac, err := statusApplyConfiguration(st)
	if err != nil {
		return fmt.Errorf("status of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	if holdsIntent(kvc, sac) {
		return nil
	}
	desired := kvv1ac.KVCluster(kvc.Name, kvc.Namespace).WithStatus(sac)
	if err := c.Status().Apply(ctx, desired, client.FieldOwner(specs.FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply status of KVCluster %s/%s: %w", kvc.Namespace, kvc.Name, err)
	}
	if desired.ResourceVersion != nil { // the API server's answer: the version this write made
		writes.wrote(kvc, *desired.ResourceVersion, time.Now()) // the cache lags in real time
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

// statusWrites remembers, per cluster, the version of the KVCluster the operator's last status
// write made, until the cache shows it (behind). The zero value is ready.
type statusWrites struct {
	mu      sync.Mutex
	written map[types.NamespacedName]ownWrite
}

// ownWrite is the version of a KVCluster the operator's status write made, and when (the time on
// the wall: the cache lags in real time).
type ownWrite struct {
	uid             types.UID
	resourceVersion string
	at              time.Time
}

// cacheLagLimit is how long a KVCluster read older than the operator's last status write to it is
// taken for a cache that has not caught up yet (a matter of milliseconds); past it, what is read
// is believed: an API server whose store went back to an older snapshot would never show the write.
const cacheLagLimit = 10 * time.Second

// wrote remembers the version of kvc that the operator's status write made.
func (h *statusWrites) wrote(kvc *kvv1.KVCluster, resourceVersion string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.written == nil {
		h.written = map[types.NamespacedName]ownWrite{}
	}
	h.written[types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}] = ownWrite{uid: kvc.UID, resourceVersion: resourceVersion, at: now}
}

// behind reports whether kvc, as read, is older than the version the operator's last status write
// to it made: the cache has not caught up with that write yet, and what a reconcile would decide
// on it was decided already (and announced). A version of another object of the same name, one
// that cannot be ordered, or one still older after cacheLagLimit is not behind.
func (h *statusWrites) behind(kvc *kvv1.KVCluster, now time.Time) bool {
	cluster := types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}
	h.mu.Lock()
	defer h.mu.Unlock()
	w, ok := h.written[cluster]
	if !ok {
		return false
	}
	if w.uid == kvc.UID && now.Sub(w.at) < cacheLagLimit {
		if order, err := resourceversion.CompareResourceVersion(kvc.ResourceVersion, w.resourceVersion); err == nil && order < 0 {
			return true
		}
	}
	delete(h.written, cluster) // caught up, or never will
	return false
}

// forget drops a cluster that is gone.
func (h *statusWrites) forget(cluster types.NamespacedName) {
	h.mu.Lock()
	delete(h.written, cluster)
	h.mu.Unlock()
}
