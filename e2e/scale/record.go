package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// timeline is what the harness saw happen, at the moment its watches delivered it: when each pod
// was first Ready, when each cluster was first Ready on a version, when each cluster was gone.
// The operator's overhead is measured between two such moments seen by the same watches.
type timeline struct {
	mu       sync.Mutex
	podReady map[types.UID]podReady
	ready    map[versioned]time.Time
	gone     map[types.NamespacedName]time.Time
}

type podReady struct {
	cluster types.NamespacedName
	at      time.Time
}

type versioned struct {
	cluster types.NamespacedName
	version string
}

func watchTimeline(ctx context.Context, c cache.Cache) (*timeline, error) {
	tl := &timeline{podReady: map[types.UID]podReady{}, ready: map[versioned]time.Time{}, gone: map[types.NamespacedName]time.Time{}}
	pods, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, err
	}
	onPod := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !isReady(pod) {
			return
		}
		tl.mu.Lock()
		defer tl.mu.Unlock()
		if _, seen := tl.podReady[pod.UID]; !seen {
			tl.podReady[pod.UID] = podReady{cluster: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Labels[specs.ClusterLabel]}, at: time.Now()}
		}
	}
	if _, err := pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onPod, UpdateFunc: func(_, o any) { onPod(o) }}); err != nil {
		return nil, err
	}
	clusters, err := c.GetInformer(ctx, &kvv1.KVCluster{})
	if err != nil {
		return nil, err
	}
	onCluster := func(obj any) {
		kvc, ok := obj.(*kvv1.KVCluster)
		if !ok || kvc.Status.Phase != kvv1.PhaseReady || kvc.Status.ObservedGeneration != kvc.Generation {
			return
		}
		tl.mu.Lock()
		defer tl.mu.Unlock()
		key := versioned{types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}, kvc.Status.CurrentVersion}
		if _, seen := tl.ready[key]; !seen {
			tl.ready[key] = time.Now()
		}
	}
	onGone := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if kvc, ok := obj.(*kvv1.KVCluster); ok {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			tl.gone[types.NamespacedName{Namespace: kvc.Namespace, Name: kvc.Name}] = time.Now()
		}
	}
	if _, err := clusters.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onCluster, UpdateFunc: func(_, o any) { onCluster(o) }, DeleteFunc: onGone}); err != nil {
		return nil, err
	}
	return tl, nil
}

func isReady(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

func (tl *timeline) readyAt(cluster types.NamespacedName, version string) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	at, ok := tl.ready[versioned{cluster, version}]
	return at, ok
}

func (tl *timeline) goneAt(cluster types.NamespacedName) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	at, ok := tl.gone[cluster]
	return at, ok
}

// podsReadyAt is when the last of the cluster's pods first became Ready.
func (tl *timeline) podsReadyAt(cluster types.NamespacedName) time.Time {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var last time.Time
	for _, p := range tl.podReady {
		if p.cluster == cluster && p.at.After(last) {
			last = p.at
		}
	}
	return last
}

// waitAll waits until done holds for every cluster, or the timeout; it returns how many did not.
func waitAll(clusters []types.NamespacedName, timeout time.Duration, done func(types.NamespacedName) bool) int {
	deadline := time.Now().Add(timeout)
	for {
		left := 0
		for _, c := range clusters {
			if !done(c) {
				left++
			}
		}
		if left == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// distribution summarizes durations: p50, p99 and max (nearest rank).
type distribution struct{ p50, p99, max time.Duration }

func summarize(ds []time.Duration) distribution {
	if len(ds) == 0 {
		return distribution{}
	}
	slices.Sort(ds)
	rank := func(q float64) time.Duration { return ds[max(0, int(math.Ceil(q*float64(len(ds))))-1)] }
	return distribution{rank(0.50), rank(0.99), ds[len(ds)-1]}
}

func (d distribution) String() string {
	return fmt.Sprintf("%s / %s / %s", seconds(d.p50), seconds(d.p99), seconds(d.max))
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// requests are the operator's API requests in a window, by verb, from the audit log.
type requests struct {
	byVerb map[string]int
	// leases are the leader election's requests, counted apart: they are per operator, not per
	// cluster (its Lease's, and the Event it records on the Lease when it becomes leader).
	leases int
	// podDeletes are the operator's deletions of pods; simulatorPodDeletes kwok's, which end a
	// graceful deletion as a kubelet does (one per pod the operator deleted) — more means it
	// deleted a pod nobody asked it to.
	podDeletes, simulatorPodDeletes int
}

var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

func (r requests) writes() int {
	n := 0
	for _, v := range writeVerbs {
		n += r.byVerb[v]
	}
	return n
}

func (r requests) reads() int {
	n := 0
	for v, c := range r.byVerb {
		if !slices.Contains(writeVerbs, v) {
			n += c
		}
	}
	return n
}

// perCluster prints the counts by verb divided by n (clusters, or clusters × minutes).
func (r requests) perCluster(n float64) string {
	if len(r.byVerb) == 0 {
		return "0"
	}
	verbs := make([]string, 0, len(r.byVerb))
	for v := range r.byVerb {
		verbs = append(verbs, v)
	}
	slices.Sort(verbs)
	parts := make([]string, 0, len(verbs))
	for _, v := range verbs {
		parts = append(parts, fmt.Sprintf("%s %s", v, trim(float64(r.byVerb[v])/n)))
	}
	return strings.Join(parts, ", ")
}

func trim(f float64) string {
	s := fmt.Sprintf("%.2f", f)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

type auditEvent struct {
	Verb           string    `json:"verb"`
	UserAgent      string    `json:"userAgent"`
	StageTimestamp time.Time `json:"stageTimestamp"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
}

// leaderElected reports whether e is the leader election's Event on its Lease (client-go names an
// Event after its object and the time).
func (e auditEvent) leaderElected() bool {
	return e.ObjectRef.Resource == "events" && e.ObjectRef.Namespace == leaseNamespace && strings.HasPrefix(e.ObjectRef.Name, specs.LeaderElectionID+".")
}

// operatorRequests counts the requests the operator's user agent made between from and to
// (completed then), read from the API server's audit log; and the pods kwok deleted meanwhile.
func operatorRequests(auditLog string, from, to time.Time) (requests, error) {
	time.Sleep(time.Second) // the audit log is written as requests complete
	f, err := os.Open(auditLog)
	if err != nil {
		return requests{}, err
	}
	defer func() { _ = f.Close() }()
	r := requests{byVerb: map[string]int{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		operator := strings.Contains(string(line), `"userAgent":"kvcluster-operator/`)
		kwok := strings.Contains(string(line), `"userAgent":"kwok-controller/`)
		if !operator && !kwok {
			continue
		}
		var e auditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return r, fmt.Errorf("audit log: %w", err)
		}
		if e.StageTimestamp.Before(from) || e.StageTimestamp.After(to) {
			continue
		}
		// A pod deleted, not one already gone (404).
		podDelete := e.Verb == "delete" && e.ObjectRef.Resource == "pods" && e.ObjectRef.Subresource == "" && e.ResponseStatus.Code < 300
		switch {
		case kwok:
			if podDelete {
				r.simulatorPodDeletes++
			}
		case e.ObjectRef.Resource == "leases", e.leaderElected():
			r.leases++
		default:
			r.byVerb[e.Verb]++
			if podDelete {
				r.podDeletes++
			}
		}
	}
	return r, sc.Err()
}
