// Command provisioner dynamically provisions PersistentVolumes for the local test cluster: for
// each claim of its StorageClass it creates a directory on the node and a `local` PersistentVolume
// bound to the claim; when such a volume is released, it deletes the directory and the volume.
// It also expands volumes, as a CSI driver's external resizer does: a bound claim asking for more
// than its volume has gets it. A directory has no size of its own, so growing one is recording
// the new size on the volume and the claim (as csi-driver-host-path does for its directories).
// It runs as a host process beside the kubelet, so it needs no image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

type provisioner struct {
	client.Client
	root, node, class string
}

func main() {
	root := flag.String("root", "", "directory holding the volumes")
	node := flag.String("node", "", "name of the node the volumes are on")
	class := flag.String("storage-class", "kvc-local", "StorageClass whose claims this provisions")
	qps := flag.Float64("kube-api-qps", 20, "requests per second to the API server (the fleet benchmark binds thousands of claims)")
	flag.Parse()
	ctrl.SetLogger(zap.New())
	cfg, err := ctrl.GetConfig() // --kubeconfig, registered by controller-runtime
	if err != nil {
		fail(err)
	}
	cfg.QPS, cfg.Burst = float32(*qps), int(2**qps)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fail(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		fail(err)
	}
	p := &provisioner{Client: mgr.GetClient(), root: *root, node: *node, class: *class}
	if err := ctrl.NewControllerManagedBy(mgr).For(&corev1.PersistentVolumeClaim{}).Named("provision").
		Complete(ctrlFunc(p.provision)); err != nil {
		fail(err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&corev1.PersistentVolume{}).Named("reclaim").
		Complete(ctrlFunc(p.reclaim)); err != nil {
		fail(err)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fail(err)
	}
}

type ctrlFunc func(context.Context, ctrl.Request) (ctrl.Result, error)

func (f ctrlFunc) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return f(ctx, req)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "provisioner:", err)
	os.Exit(1)
}

func (p *provisioner) provision(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pvc corev1.PersistentVolumeClaim
	if err := p.Get(ctx, req.NamespacedName, &pvc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pvc.DeletionTimestamp != nil || pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != p.class {
		return ctrl.Result{}, nil
	}
	if pvc.Spec.VolumeName != "" {
		return ctrl.Result{}, p.expand(ctx, &pvc)
	}
	name := "pvc-" + string(pvc.UID)
	dir := filepath.Join(p.root, name)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return ctrl.Result{}, err
	}
	// Any pod user may write: local volumes get the pod's fsGroup, but not every pod sets one.
	if err := os.Chmod(dir, 0o777); err != nil {
		return ctrl.Result{}, err
	}
	mode := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "kvcluster.io/local-volume"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              p.class,
			VolumeMode:                    &mode,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{p.node}}},
			}}}},
		},
	}
	if err := p.Create(ctx, pv); err != nil && !apierrors.IsAlreadyExists(err) {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("provisioned", "pvc", req.NamespacedName, "pv", name, "dir", dir)
	return ctrl.Result{}, nil
}

// expand gives a bound claim the size it asks for: first its volume, then the claim's status.
func (p *provisioner) expand(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	want := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if has := pvc.Status.Capacity[corev1.ResourceStorage]; pvc.Status.Phase != corev1.ClaimBound || want.Cmp(has) <= 0 {
		return nil
	}
	var pv corev1.PersistentVolume
	if err := p.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pv.Spec.StorageClassName != p.class || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		return nil
	}
	if has := pv.Spec.Capacity[corev1.ResourceStorage]; want.Cmp(has) > 0 {
		patch := client.MergeFrom(pv.DeepCopy())
		pv.Spec.Capacity[corev1.ResourceStorage] = want
		if err := p.Patch(ctx, &pv, patch); err != nil {
			return err
		}
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	pvc.Status.Capacity[corev1.ResourceStorage] = want
	if err := p.Status().Patch(ctx, pvc, patch); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("expanded", "pvc", client.ObjectKeyFromObject(pvc), "pv", pv.Name, "size", want.String())
	return nil
}

func (p *provisioner) reclaim(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pv corev1.PersistentVolume
	if err := p.Get(ctx, req.NamespacedName, &pv); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pv.Spec.StorageClassName != p.class || pv.Status.Phase != corev1.VolumeReleased ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Spec.Local == nil {
		return ctrl.Result{}, nil
	}
	dir := filepath.Clean(pv.Spec.Local.Path)
	if !strings.HasPrefix(dir, filepath.Clean(p.root)+"/") {
		return ctrl.Result{}, fmt.Errorf("volume %s points outside %s: %s", pv.Name, p.root, dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return ctrl.Result{}, err
	}
	if err := p.Delete(ctx, &pv); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("reclaimed", "pv", pv.Name, "dir", dir)
	return ctrl.Result{}, nil
}
