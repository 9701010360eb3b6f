package plan

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// Observation is what one reconcile saw of a cluster, read once before anything is decided:
// Kubernetes (from the cache) and etcd (live). Outcomes of acting are observed too: an apply the
// API server refuses (ApplyRejected, ForeignChildren), or a step freeing space (Compacted,
// Defragmented, Disarmed), after which the cluster is planned again.
type Observation struct {
	// ReadyMembers is the count of member pods within spec.partitions that run, are Ready and are
	// not being deleted, read from the pods themselves: the StatefulSet's readyReplicas (which
	// also counts pods being deleted or scaled away) comes later, when the StatefulSet controller
	// gets to it (seconds later when it has many StatefulSets to sync).
	ReadyMembers int32
	// Cluster is etcd's own view; nil when etcd could not be asked or did not answer with a quorum.
	Cluster *members.Cluster
	// EtcdErr says why Cluster is nil.
	EtcdErr error

	// Pods are the member pods by ordinal.
	Pods map[int]Pod
	// STSReplicas is the StatefulSet's current replicas (nil before it exists); STSSettled is true
	// when its controller has seen its latest spec, so pod revisions can be compared with it.
	STSReplicas *int32
	STSSettled  bool
	// STSClaimsUnlabelled: the StatefulSet was made by a release that did not label claims.
	STSClaimsUnlabelled bool
	// STSClaimSize is the size its claim template asks for (zero before it exists): storage.size
	// when it was made. STSQuota is the backend quota its template gives members (0: unknown).
	STSClaimSize resource.Quantity
	STSQuota     int64
	// Claims are the members' data claims by ordinal (claims being deleted left out);
	// ClaimsBeingDeleted the ordinals of claims being deleted.
	Claims             map[int]Claim
	ClaimsBeingDeleted []int
	// STSAwaitedPods is the StatefulSet's specs.AwaitedPodsAnnotation.
	STSAwaitedPods string
	// MissingPodReferences are what spec.pods names that does not exist ("ServiceAccount x",
	// "PriorityClass y"): a pod naming one is not created. Read only while a member pod is
	// missing or outdated.
	MissingPodReferences []string
	// ExpandableClasses says, for the StorageClass of each claim still to be expanded, whether it
	// allows volume expansion; a class that does not exist is absent.
	ExpandableClasses map[string]bool
	// STSTrust is the CA bundle its template tells members to trust (specs.TrustAnnotation).
	STSTrust string
	// STSTransport is how its template makes members listen (nil before it exists): pods made
	// from now on listen so.
	STSTransport *specs.Transport
	// STSTLSSecrets are the Secrets its template mounts, by part (server, peer).
	STSTLSSecrets map[string]string
	// Membership is what the membership ConfigMap says now (nil before it exists).
	Membership *specs.Membership

	// Jobs are the cluster's backup Jobs (scheduled, on-demand, pre-upgrade, final) by name; the newest
	// finished one carries its report.
	Jobs []Job
	// PreUpgradeJob is the pre-upgrade backup Job, of this or an earlier upgrade.
	PreUpgradeJob *batchv1.Job
	// BackupRequestJobGone: the Job status.backupRequest says is running is not on the API server
	// (asked there, not in the cache, which may not hold a Job created a moment ago).
	BackupRequestJobGone bool

	// ForeignChildren and LeftoverClaims are objects the cluster needs that belong to someone
	// else; while there are any, nothing is written but status.
	ForeignChildren, LeftoverClaims []string
	// STSForeign: the StatefulSet under the cluster's name is someone else's, so is what answers
	// at the members' names: it is never backed up.
	STSForeign bool
	// ApplyRejected is why the API server refused to apply the cluster's objects.
	ApplyRejected string
	// Compacted is the revision a compaction just went to (0: none), and Defragmented the member
	// just defragmented: the sizes in Cluster, read before, do not show what they freed. Disarmed:
	// the cluster's NOSPACE alarm was just disarmed (Cluster still lists it).
	Compacted    int64
	Defragmented string
	Disarmed     bool

	// TLS is the data of the cluster's TLS Secrets that exist, by part (specs.TLSCA, TLSServer,
	// TLSPeer, TLSClient).
	TLS map[string]map[string][]byte

	// tlsProblem is why the cluster cannot use its certificates (see planTLS).
	tlsProblem string
	// volumeProblem is why the members' volumes cannot grow to storage.size (see planVolumeGrowth).
	volumeProblem string
}

// Pod is what Kubernetes says about one member's pod.
type Pod struct {
	UID         types.UID
	Ready       bool
	Terminating bool
	// Running: its etcd container runs, so its member may answer. One being created, waiting to
	// restart or exited cannot.
	Running bool
	// Outdated: the pod does not run the StatefulSet's current template (version, resources, …).
	Outdated bool
	// Created is when the pod was made.
	Created time.Time
	// Restarts of the etcd container.
	Restarts int32
	// VolumeUID is the UID of the pod's data claim, one being deleted too (unless the pod was
	// made in a later second than the deletion began); empty while it has none.
	VolumeUID types.UID
	// Transport is how its member listens (specs.PodTransport); nil when unknown.
	Transport *specs.Transport
}

// Job is a backup Job with its outcome and what its pod reported.
type Job struct {
	Job *batchv1.Job
	// Done and Succeeded come from the Job's conditions.
	Done, Succeeded bool
	FinishedAt      time.Time
	// Report is the backup program's termination message: its JSON result, or why it failed.
	// Read for the newest finished Job only.
	Report string
}

// TerminationMessage is what the program a Job ran reported as it ended (for a backup, its
// result or why it failed): the termination message of the first of pods that left one.
func TerminationMessage(pods []corev1.Pod) string {
	for _, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil && t.Message != "" {
				return strings.TrimSpace(t.Message)
			}
		}
	}
	return ""
}

// NewJob reads a Job's outcome from its Complete/Failed condition.
func NewJob(job *batchv1.Job, report string) Job {
	j := Job{Job: job, Report: report}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			j.Done, j.Succeeded, j.FinishedAt = true, true, c.LastTransitionTime.Time
			return j
		case batchv1.JobFailed:
			j.Done, j.FinishedAt = true, c.LastTransitionTime.Time
			return j
		}
	}
	return j
}

// jobState is the state of one Job the rollout waits for.
type jobState int

const (
	jobMissing jobState = iota
	jobRunning
	jobSucceeded
	jobFailed
)

// preUpgradeBackup is the state of this upgrade's pre-upgrade backup (an earlier upgrade's Job
// does not count).
func (o Observation) preUpgradeBackup(kvc *kvv1.KVCluster) jobState {
	job := o.PreUpgradeJob
	if job == nil || job.Annotations[specs.TargetVersionAnnotation] != kvc.Spec.Version {
		return jobMissing
	}
	switch j := NewJob(job, ""); {
	case !j.Done:
		return jobRunning
	case j.Succeeded:
		return jobSucceeded
	}
	return jobFailed
}

func (o Observation) outdatedPods() int {
	n := 0
	for _, p := range o.Pods {
		if p.Outdated {
			n++
		}
	}
	return n
}

// healthy is the Ready criterion: the members are (membersHealthy), and etcd has raised no alarm
// (under which it refuses writes).
func (o Observation) healthy(kvc *kvv1.KVCluster) bool {
	return o.membersHealthy(kvc) && len(o.Cluster.Alarms) == 0
}

// membersHealthy: every member pod ready, and etcd reporting a leader and exactly the expected
// voting members, all of them answering.
func (o Observation) membersHealthy(kvc *kvv1.KVCluster) bool {
	n := int(kvc.Spec.Partitions)
	return o.ReadyMembers == kvc.Spec.Partitions && o.Cluster != nil && o.Cluster.HasLeader &&
		o.Cluster.AllHealthy() && len(o.Cluster.Members) == n && o.Cluster.Voting() == n
}

// rolled: every member runs the StatefulSet's current template, and is ready.
func (o Observation) rolled(kvc *kvv1.KVCluster) bool {
	if !o.STSSettled || o.outdatedPods() > 0 {
		return false
	}
	for ord := range int(kvc.Spec.Partitions) {
		if p, ok := o.Pods[ord]; !ok || !p.Ready || p.Terminating {
			return false
		}
	}
	return true
}

func (o Observation) quorumLost() bool { return o.Cluster == nil || !o.Cluster.HasLeader }

// conflicted: the cluster needs objects that are someone else's; nothing is written but status.
func (o Observation) conflicted() bool {
	return len(o.ForeignChildren) > 0 || len(o.LeftoverClaims) > 0 || o.tlsProblem != ""
}

// summary is a one-line account of the members for condition messages.
func (o Observation) summary(kvc *kvv1.KVCluster) string {
	s := fmt.Sprintf("%d/%d members ready", o.ReadyMembers, kvc.Spec.Partitions)
	switch {
	case o.EtcdErr != nil:
		s += "; etcd: " + o.EtcdErr.Error()
	case o.Cluster != nil && !o.Cluster.HasLeader:
		s += "; etcd reports no leader"
	case o.Cluster != nil && o.Cluster.Voting() != int(kvc.Spec.Partitions):
		s += fmt.Sprintf("; etcd has %d voting members", o.Cluster.Voting())
	}
	if o.Cluster != nil {
		for _, a := range o.Cluster.Alarms {
			s += fmt.Sprintf("; etcd raised the %s alarm for member %x", a.Type, a.MemberID)
		}
	}
	return s
}

// missingReferences says why the StatefulSet controller cannot create member pods; "" when
// nothing observed says so.
func (o Observation) missingReferences() string {
	if len(o.MissingPodReferences) == 0 {
		return ""
	}
	return fmt.Sprintf("spec.pods names %s, which does not exist (create it, or change spec.pods)", strings.Join(o.MissingPodReferences, " and "))
}

// memberPodMissing: a member (below spec.partitions) has no pod.
func (o Observation) memberPodMissing(kvc *kvv1.KVCluster) bool {
	for ord := range int(kvc.Spec.Partitions) {
		if _, ok := o.Pods[ord]; !ok {
			return true
		}
	}
	return false
}

// ClientURLs are the members to ask: the spec's, and any other member pod that exists.
func (o Observation) ClientURLs(kvc *kvv1.KVCluster) []string {
	scheme := o.ClientScheme(kvc)
	urls := specs.MemberClientURLs(kvc, scheme)
	for _, ord := range slices.Sorted(maps.Keys(o.Pods)) {
		if ord >= int(kvc.Spec.Partitions) {
			urls = append(urls, specs.MemberClientURL(kvc, scheme, ord))
		}
	}
	return urls
}

// AskableURLs are the members etcd is asked through: those whose etcd container runs. Asking one
// that cannot answer (being created, waiting to restart, exited) costs the whole timeout, during
// which the worker reconciles no other cluster. A pod being deleted is still asked: its etcd
// serves until it exits, and may be the leader (a pod evicted from a node that lost its kubelet
// stays Terminating while its etcd leads). Before any pod is seen (the StatefulSet controller has
// not made them, or the cache has not caught up), every member ClientURLs names.
func (o Observation) AskableURLs(kvc *kvv1.KVCluster) []string {
	if len(o.Pods) == 0 {
		return o.ClientURLs(kvc)
	}
	scheme := o.ClientScheme(kvc)
	var urls []string
	for _, ord := range slices.Sorted(maps.Keys(o.Pods)) {
		if o.Askable(ord) {
			urls = append(urls, specs.MemberClientURL(kvc, scheme, ord))
		}
	}
	return urls
}

// memberRuns: some member pod's etcd container runs.
func (o Observation) memberRuns() bool {
	for _, p := range o.Pods {
		if p.Running {
			return true
		}
	}
	return false
}

// podAwaited: the member pod at ordinal has yet to come, go or turn Ready, each of which is a
// change the operator watches.
func (o Observation) podAwaited(ordinal int) bool {
	pod, ok := o.Pods[ordinal]
	return !ok || pod.Terminating || !pod.Ready
}

// Askable reports whether the member with the given ordinal is among AskableURLs.
func (o Observation) Askable(ordinal int) bool {
	p, ok := o.Pods[ordinal]
	return len(o.Pods) == 0 || ok && p.Running
}

// ClientScheme is how the operator, backup Jobs and applications reach the members now: the
// scheme the spec wants once every member pod, and the StatefulSet's template (which pods that
// are gone come back on), accepts it; else the other one while they all accept that (a cluster
// moving between plaintext and TLS accepts both on the way); the spec's before there are any.
func (o Observation) ClientScheme(kvc *kvv1.KVCluster) string {
	desired := specs.DesiredTransport(kvc)
	tls, plain := true, true
	accept := func(t *specs.Transport) {
		if t != nil { // a pod whose flags are unknown decides nothing
			tls, plain = tls && t.ClientTLS, plain && t.ClientPlain
		}
	}
	accept(o.STSTransport)
	for _, p := range o.Pods {
		accept(p.Transport)
	}
	switch {
	case tls && (desired.ClientTLS || !plain):
		return "https"
	case plain:
		return "http"
	}
	return desired.ClientScheme()
}
