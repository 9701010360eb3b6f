package specs

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
)

// DeletionStepLabel marks the Jobs that run while a KVCluster is deleted, after its final backup.
const DeletionStepLabel = "kvcluster.io/deletion-step"

// DeregistrationJobName is the one Job of the deregistration step.
func DeregistrationJobName(kvc *kvv1.KVCluster) string { return kvc.Name + "-deregister" }

// DeregistrationJob runs the user's deregistration step once: an HTTP call made by the operator's
// image (the URL may come from a Secret, which only this pod sees; the program never writes more
// of it than scheme://host) or the user's own container. Only what a container writes to its
// termination log is reported, never its logs: they may hold what the Secret held. guard is the
// UID of the cluster's deletion guard (see Guard).
func DeregistrationJob(kvc *kvv1.KVCluster, operatorImage string, guard types.UID) *batchv1ac.JobApplyConfiguration {
	d := kvc.Spec.Deregistration
	c := corev1ac.Container().WithName("deregister").WithImagePullPolicy(corev1.PullIfNotPresent).
		WithTerminationMessagePolicy(corev1.TerminationMessageReadFile).
		WithSecurityContext(restrictedContainer())
	if h := d.HTTP; h != nil {
		url := corev1ac.EnvVar().WithName("DEREGISTRATION_URL")
		if h.URLSecret != nil {
			url.WithValueFrom(corev1ac.EnvVarSource().WithSecretKeyRef(
				corev1ac.SecretKeySelector().WithName(h.URLSecret.Name).WithKey(h.URLSecret.Key)))
		} else {
			url.WithValue(h.URL)
		}
		c.WithImage(operatorImage).WithEnv(url).WithArgs("http-call", "--url-env=DEREGISTRATION_URL",
			"--method="+h.Method, fmt.Sprintf("--retries=%d", h.Retries), fmt.Sprintf("--timeout=%ds", int64(d.TimeoutSeconds)-reportMargin(int64(d.TimeoutSeconds), 0)))
	} else {
		c.WithImage(d.Job.Image).WithCommand(d.Job.Command...).WithArgs(d.Job.Args...)
	}
	labels := Labels(kvc)
	labels[DeletionStepLabel] = "deregister"
	labels[ClusterUIDLabel] = string(kvc.UID) // whose it is, also once a foreground deletion took the KVCluster off its owners
	tmpl := corev1ac.PodTemplateSpec().
		WithLabels(JobPodLabels(labels)).
		WithSpec(corev1ac.PodSpec().
			WithRestartPolicy(corev1.RestartPolicyNever).
			WithAutomountServiceAccountToken(false).
			WithEnableServiceLinks(false).
			WithSecurityContext(restrictedPod()).
			WithContainers(c))
	placePod(kvc, tmpl)
	return batchv1ac.Job(DeregistrationJobName(kvc), kvc.Namespace).
		WithLabels(labels).
		WithOwnerReferences(Owners(kvc, guard)...).
		WithSpec(batchv1ac.JobSpec().
			WithBackoffLimit(0).
			WithActiveDeadlineSeconds(int64(d.TimeoutSeconds)).
			WithTemplate(tmpl))
}
