package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The simulated node every member pod runs on, and the StorageClass of their claims.
const (
	nodeName     = "kwok-node-0"
	storageClass = "kvc-bench"
	clusterName  = "kvc-bench"
)

// controlPlane is a Kubernetes control plane (etcd, kube-apiserver, controller manager, scheduler)
// from the project's cached binaries, with kwok simulating a node: pods scheduled there become
// Ready without running anything. kwokctl starts it on 127.0.0.1 with an audit log, and the
// benchmark's volume provisioner (the local cluster's) binds the member claims.
type controlPlane struct {
	work, kubeconfig string
	cfg              *rest.Config
	c                client.Client
	processes        []*exec.Cmd
}

func (t tools) kwokctl(work string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(t.kwok, "kwokctl"), append([]string{"--name", clusterName}, args...)...)
	// kwokctl writes its clusters under KWOK_WORKDIR and, without these, into ~/.kwok and ~/.kube.
	cmd.Env = append(os.Environ(), "HOME="+work, "KWOK_WORKDIR="+filepath.Join(work, "kwok"))
	return cmd
}

// startControlPlane starts it in work, a folder that is the same for every run: a run killed
// before it could stop its cluster leaves it there, and the next one stops it first.
func startControlPlane(ctx context.Context, t tools, work string) (_ *controlPlane, err error) {
	cp := &controlPlane{work: work, kubeconfig: filepath.Join(work, "kubeconfig")}
	_ = t.kwokctl(work, "delete", "cluster", "--kubeconfig", cp.kubeconfig).Run()
	defer func() {
		if err != nil {
			cp.stop(t)
		}
	}()
	config := filepath.Join(work, "kwokctl.yaml")
	audit := filepath.Join(work, "audit-policy.yaml")
	// kwok plays pod stages 4 at a time by default: with thousands of pods it falls seconds behind,
	// and its late deletion of a pod the operator restarted (by name, not UID) then deletes the
	// pod that replaced it. The upgrade table reports any deletion nobody asked for.
	kwokctl := "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\noptions:\n  bindAddress: 127.0.0.1\n" +
		// Every cluster has a client Service with a cluster IP: kube-apiserver's default range, a
		// /24, runs out at about 250 clusters.
		"componentsPatches:\n- name: kube-apiserver\n  extraArgs:\n  - key: service-cluster-ip-range\n    value: 10.96.0.0/16\n" +
		// The audit log is rotated at 100 MB by default, which a run of 1,000 clusters passes: the
		// requests are counted from one file, so it must stay one (a run writes a few hundred MB).
		"  - key: audit-log-maxsize\n    value: \"100000\"\n" +
		// Given a KwokConfiguration, kwok takes no defaults for what it leaves out.
		"---\napiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n  podPlayStageParallelism: 32\n" +
		"  nodePlayStageParallelism: 4\n  nodeLeaseParallelism: 4\n  podsOnNodeSyncParallelism: 1\n"
	if err := os.WriteFile(config, []byte(kwokctl), 0o644); err != nil {
		return nil, err
	}
	// Every request's verb, resource and user agent: the operator's requests are counted from it.
	if err := os.WriteFile(audit, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n"), 0o644); err != nil {
		return nil, err
	}
	create := t.kwokctl(work, "--config", config, "create", "cluster", "--runtime", "binary",
		"--kube-apiserver-binary", filepath.Join(t.kubernetes, "kube-apiserver"),
		"--kube-controller-manager-binary", filepath.Join(t.kubernetes, "kube-controller-manager"),
		"--kube-scheduler-binary", filepath.Join(t.kubernetes, "kube-scheduler"),
		"--etcd-binary", filepath.Join(t.etcd, "etcd"),
		"--kwok-controller-binary", filepath.Join(t.kwok, "kwok"),
		"--kube-audit-policy", audit,
		// The controller manager and scheduler must not be what limits how fast pods appear: the
		// benchmark measures the operator against its pods' readiness.
		"--disable-qps-limits",
		"--kubeconfig", cp.kubeconfig, "--wait", "2m")
	if out, err := create.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kwokctl create cluster: %v\n%s", err, out)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000 // the harness's own requests must not queue behind a client-side limit
	cp.cfg = cfg
	if cp.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if err := cp.install(ctx, t); err != nil {
		return nil, err
	}
	return cp, nil
}

// auditLog is the API server's audit log; an error if it was rotated, since the requests counted
// from it would then miss the rotated part.
func (cp *controlPlane) auditLog() (string, error) {
	logs := filepath.Join(cp.work, "kwok", "clusters", clusterName, "logs")
	if rotated, _ := filepath.Glob(filepath.Join(logs, "audit-*.log")); len(rotated) > 0 {
		return "", fmt.Errorf("the API server rotated its audit log (%s): requests cannot be counted", filepath.Base(rotated[0]))
	}
	return filepath.Join(logs, "audit.log"), nil
}

// install adds the node, the StorageClass and its provisioner, and the KVCluster CRD.
func (cp *controlPlane) install(ctx context.Context, t tools) error {
	lots := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("100k"), corev1.ResourceCPU: resource.MustParse("10k"), corev1.ResourceMemory: resource.MustParse("100Ti")}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName, "type": "kwok"},
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
		Status: corev1.NodeStatus{Capacity: lots, Allocatable: lots},
	}
	if err := cp.c.Create(ctx, node); err != nil {
		return fmt.Errorf("create node: %w", err)
	}
	immediate, expand := storagev1.VolumeBindingImmediate, true
	reclaim := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storageClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "kvcluster.io/local-volume", VolumeBindingMode: &immediate, ReclaimPolicy: &reclaim, AllowVolumeExpansion: &expand}
	if err := cp.c.Create(ctx, sc); err != nil {
		return fmt.Errorf("create StorageClass: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cp.work, "volumes"), 0o755); err != nil {
		return err
	}
	prov := exec.Command(filepath.Join(cp.work, "provisioner"), "--kubeconfig", cp.kubeconfig, "--root", filepath.Join(cp.work, "volumes"),
		"--node", nodeName, "--storage-class", storageClass, "--kube-api-qps", "500")
	if err := cp.startLogged(prov, "provisioner"); err != nil {
		return err
	}
	crd := exec.Command(filepath.Join(t.kubernetes, "kubectl"), "--kubeconfig", cp.kubeconfig, "apply", "--server-side", "-f", "deploy/crd/kvcluster.io_kvclusters.yaml")
	if out, err := crd.CombinedOutput(); err != nil {
		return fmt.Errorf("install the CRD: %v\n%s", err, out)
	}
	// Polled here: kubectl wait fails at once on a CRD whose status has no conditions yet.
	if waitAll([]types.NamespacedName{{Name: "kvclusters.kvcluster.io"}}, time.Minute, func(key types.NamespacedName) bool {
		var crd apiextensionsv1.CustomResourceDefinition
		return cp.c.Get(ctx, key, &crd) == nil && slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
			return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
		})
	}) > 0 {
		return fmt.Errorf("the KVCluster CRD was not established within a minute")
	}
	if waitAll([]types.NamespacedName{{Name: nodeName}}, time.Minute, func(key types.NamespacedName) bool {
		var n corev1.Node
		return cp.c.Get(ctx, key, &n) == nil && nodeReady(&n)
	}) > 0 {
		return fmt.Errorf("kwok did not make node %s Ready within a minute", nodeName)
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startLogged starts a helper process whose output goes to work/<name>.log; stop ends it.
func (cp *controlPlane) startLogged(cmd *exec.Cmd, name string) error {
	log, err := os.Create(filepath.Join(cp.work, name+".log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the harness, however it ends
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	cp.processes = append(cp.processes, cmd)
	return nil
}

func (cp *controlPlane) stop(t tools) {
	for _, p := range cp.processes {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	if out, err := t.kwokctl(cp.work, "delete", "cluster", "--kubeconfig", cp.kubeconfig).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "kwokctl delete cluster: %v\n%s", err, out)
	}
}
