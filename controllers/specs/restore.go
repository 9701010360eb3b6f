package specs

import (
	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

const (
	restoreToolsVolume = "restore-tools"
	restoreToolsMount  = "/restore-tools"
	restoreSnapshot    = dataMount + "/restore.db"
)

// restoreInitContainers restore every member of a new cluster from a backup before etcd starts.
// The first runs the operator's image: it copies the operator's static binary into a shared
// emptyDir and downloads the snapshot, verifying its sha256 (it alone sees the credentials). The
// second runs the etcd image of the cluster's version — a snapshot must be restored by the etcdutl
// of the version that will run it — using that copied binary, since the etcd image has no shell.
// Both do nothing once the member has data, so a restarted pod never restores twice, and nothing
// when the member joins the running cluster (scale-up, replacement), which sends it its data.
func restoreInitContainers(kvc *kvv1.KVCluster, img Images) []*corev1ac.ContainerApplyConfiguration {
	r := kvc.Spec.Restore
	access := accessTo(r.S3, r.PVC, true)
	fetchArgs := append([]string{
		"restore-fetch",
		"--key=" + r.Key,
		"--data-dir=" + dataDir,
		"--out=" + restoreSnapshot,
		"--copy-self-to=" + restoreToolsMount + "/kvcluster-operator",
		"--initial-cluster-state=$(" + envInitialClusterState + ")",
	}, access.args...)
	if r.SHA256 != "" {
		fetchArgs = append(fetchArgs, "--sha256="+r.SHA256)
	}
	mounts := []*corev1ac.VolumeMountApplyConfiguration{
		corev1ac.VolumeMount().WithName(dataVolume).WithMountPath(dataMount),
		corev1ac.VolumeMount().WithName(restoreToolsVolume).WithMountPath(restoreToolsMount),
	}
	fetch := corev1ac.Container().
		WithName("restore-fetch").
		WithImage(img.Operator).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithArgs(fetchArgs...).
		WithEnv(access.env...).
		WithEnv(membershipEnv(kvc)...).
		WithVolumeMounts(mounts...).
		WithTerminationMessagePolicy(corev1.TerminationMessageFallbackToLogsOnError).
		WithSecurityContext(restrictedContainer())
	apply := corev1ac.Container().
		WithName("restore-apply").
		WithImage(Image(kvc, img.EtcdRepository)).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand(restoreToolsMount+"/kvcluster-operator").
		WithArgs(
			"restore-apply",
			"--etcdutl=/usr/local/bin/etcdutl",
			"--snapshot="+restoreSnapshot,
			"--data-dir="+dataDir,
			"--name=$(POD_NAME)",
			"--initial-cluster=$("+envInitialCluster+")",
			"--initial-cluster-state=$("+envInitialClusterState+")",
			"--initial-cluster-token="+clusterToken(kvc),
			"--initial-advertise-peer-urls="+selfPeerURL(kvc),
		).
		WithEnv(podNameEnv()).
		WithEnv(membershipEnv(kvc)...).
		WithVolumeMounts(mounts...).
		WithTerminationMessagePolicy(corev1.TerminationMessageFallbackToLogsOnError).
		WithSecurityContext(restrictedContainer())
	if access.mount != nil {
		fetch.WithVolumeMounts(access.mount)
	}
	return []*corev1ac.ContainerApplyConfiguration{fetch, apply}
}

// restoreVolumes are the pod volumes the restore needs: the shared emptyDir, and the claim the
// snapshot is on, if it is on one.
func restoreVolumes(kvc *kvv1.KVCluster) []*corev1ac.VolumeApplyConfiguration {
	vols := []*corev1ac.VolumeApplyConfiguration{corev1ac.Volume().WithName(restoreToolsVolume).WithEmptyDir(corev1ac.EmptyDirVolumeSource())}
	if a := accessTo(kvc.Spec.Restore.S3, kvc.Spec.Restore.PVC, true); a.volume != nil {
		vols = append(vols, a.volume)
	}
	return vols
}
