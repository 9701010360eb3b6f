//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
	"github.com/kvcluster/kvcluster-operator/e2e/chaos"
)

// faultKind is one way the chaos suite breaks things.
type faultKind string

const (
	operatorKilled     faultKind = "operator SIGKILL"
	apiServerRestarted faultKind = "API server restart"
	memberKilled       faultKind = "member etcd SIGKILL"
	memberPodDeleted   faultKind = "member pod deleted"
	memberFrozen       faultKind = "member etcd frozen"
)

// faultWeights: how often each fault is picked. The operator is the subject, so it dies most.
var faultWeights = []struct {
	kind   faultKind
	weight int
}{{operatorKilled, 3}, {memberKilled, 2}, {memberPodDeleted, 2}, {memberFrozen, 2}, {apiServerRestarted, 1}}

type fault struct {
	At     time.Time
	Kind   faultKind
	Target string
	Phase  string
	Took   time.Duration
}

func (f fault) String() string {
	s := fmt.Sprintf("%s %s", f.At.UTC().Format("15:04:05"), f.Kind)
	if f.Target != "" {
		s += " " + f.Target
	}
	return s + " (" + f.Phase + ")"
}

// chaosSettings come from the environment (make chaos sets them; make test runs the smoke variant).
type chaosSettings struct {
	seed     uint64
	faults   int           // inject no more than this many in all, and start no pass once there
	duration time.Duration // start no pass after this
	smoke    bool
}

func chaosSettingsFromEnv(t *testing.T) chaosSettings {
	s := chaosSettings{seed: uint64(time.Now().UnixNano()), faults: 4, duration: 0, smoke: true}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		s.seed = n
	}
	if v := os.Getenv("CHAOS_FAULTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CHAOS_FAULTS=%q: want a positive number", v)
		}
		s.faults, s.smoke = n, false
	}
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_DURATION=%q: %v", v, err)
		}
		s.duration = d
	}
	return s
}

// chaosViolation is an invariant broken in one pass, with what a replay needs.
type chaosViolation struct {
	pass  int
	phase string
	chaos.Violation
}

// chaosRun is one `make chaos` run: passes of the scenario, each in its own namespace, until the
// fault budget is spent. The injector and the monitor run beside the scenario; mu guards what
// they share with it.
type chaosRun struct {
	t        *testing.T
	cfg      *envconf.Config
	settings chaosSettings
	rng      *rand.Rand // the injector's alone (one runs at a time)

	mu         sync.Mutex
	pass       int
	step       string          // the scenario step running now
	kvc        *kvv1.KVCluster // the incarnation the monitor follows
	faults     []fault
	violations []chaosViolation
	rows       []chaos.Row
	members    *chaos.Members
	// What the monitor saw of the current incarnation, for the backup invariants.
	jobSlots  map[int64][]chaos.SlotJob // scheduled Jobs by their slot's Unix time
	succeeded map[string]bool           // scheduled Jobs that succeeded, by name
	jobSpans  map[types.UID]chaos.Interval
	leases    []leaseHolder // the operator's leader, when it changed
	createdAt time.Time
	formedAt  time.Time // the first sample out of Creating
	// Samples the monitor took of the pass, and how many saw a member Ready: a monitor that sees
	// nothing checks nothing.
	samples, samplesReady int
}

type leaseHolder struct {
	at     time.Time
	holder string
}

const chaosDeadline = 300 * time.Second // spec.progressDeadlineSeconds of the chaos cluster

// TestChaos runs the scenario (create, upgrade, scale out and in, member replacement, scheduled
// backups, deletion with its final backup, restore) while faults land at random moments: the
// operator SIGKILLed, member etcds SIGKILLed or frozen, member pods deleted, the API server
// restarted. After each step and at the end of each pass it checks the invariants, and it ends
// with a table. `make chaos` sets CHAOS_FAULTS (the budget) and CHAOS_DURATION; without them one
// pass with a few faults runs (the smoke variant in make test). CHAOS_SEED replays a run's
// choices (which fault, where, after how long); the moments still depend on the cluster.
func TestChaos(t *testing.T) {
	if !localCluster {
		t.Skip("the faults are injected from the host of the project's local cluster (make chaos, make e2e-local)")
	}
	s := chaosSettingsFromEnv(t)
	run := &chaosRun{t: t, cfg: testenv.EnvConf(), settings: s, rng: rand.New(rand.NewPCG(s.seed, s.seed^0x5eed))}
	t.Logf("chaos: seed %d (CHAOS_SEED=%d replays it), budget %d faults, duration %s", s.seed, s.seed, s.faults, s.duration)
	start := time.Now()
	// The table and the violations are reported however the run ends (a fatal error mid-pass too).
	t.Cleanup(func() {
		run.mu.Lock()
		table, passes, violations := chaos.Table(run.rows), run.pass, slices.Clone(run.violations)
		run.mu.Unlock()
		fmt.Printf("\nchaos: seed %d, %d passes, %d faults in %s\n%s\n", s.seed, passes, run.injected(), time.Since(start).Round(time.Second), table)
		t.Logf("faults:\n%s", run.faultList(0))
		for _, v := range violations {
			t.Errorf("pass %d, %s (seed %d): %s\n  faults of the pass: %s", v.pass, v.phase, s.seed, v.Violation, run.faultList(v.pass))
		}
	})
	for pass := 1; ; pass++ {
		run.mu.Lock()
		run.pass = pass
		run.mu.Unlock()
		run.scenario(context.Background())
		if run.injected() >= s.faults || s.smoke || (s.duration > 0 && time.Since(start) > s.duration) {
			break
		}
	}
}

// logMembers logs what a violation needs to be diagnosed from the log alone (a run's moments
// cannot be replayed): the members' pods and claims, the namespace's events, and each member's
// etcd log, the previous container's too.
func (r *chaosRun) logMembers(ctx context.Context) {
	r.mu.Lock()
	kvc := r.kvc
	r.mu.Unlock()
	if kvc == nil {
		return
	}
	ns := kvc.Namespace
	objects, _ := kubectl(r.cfg, "-n", ns, "get", "pods,pvc", "-o", "wide")
	events, _ := kubectl(r.cfg, "-n", ns, "get", "events", "--sort-by=.lastTimestamp")
	r.t.Logf("pods and claims:\n%s\nevents:\n%s", objects, events)
	var pods corev1.PodList
	if err := r.cfg.Client().Resources(ns).List(ctx, &pods); err != nil {
		r.t.Logf("list pods: %v", err)
		return
	}
	for _, pod := range pods.Items {
		if _, member := specs.OrdinalOfMember(kvc, pod.Name); !member {
			continue
		}
		for _, previous := range []bool{true, false} {
			logs, err := kubectl(r.cfg, "-n", ns, "logs", pod.Name, "-c", "etcd", "--tail=30", fmt.Sprintf("--previous=%t", previous))
			if err == nil {
				r.t.Logf("etcd log of %s (previous container: %t):\n%s", pod.Name, previous, logs)
			}
		}
	}
}

func (r *chaosRun) injected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.faults)
}

// faultList lists the faults of a pass (all when pass is 0).
func (r *chaosRun) faultList(pass int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, f := range r.faults {
		if pass == 0 || strings.HasPrefix(f.Phase, fmt.Sprintf("pass %d ", pass)) {
			out = append(out, f.String())
		}
	}
	return strings.Join(out, "; ")
}

func (r *chaosRun) violate(phase string, vs ...chaos.Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range vs {
		r.t.Logf("VIOLATION pass %d %s: %s", r.pass, phase, v)
		r.violations = append(r.violations, chaosViolation{pass: r.pass, phase: phase, Violation: v})
		r.row(phase).Violations++
	}
}

// row is the table's row of a scenario step; mu held.
func (r *chaosRun) row(phase string) *chaos.Row {
	i := slices.IndexFunc(r.rows, func(row chaos.Row) bool { return row.Scenario == phase })
	if i < 0 {
		r.rows = append(r.rows, chaos.Row{Scenario: phase})
		i = len(r.rows) - 1
	}
	return &r.rows[i]
}

func chaosCluster(ns string) *kvv1.KVCluster {
	return &kvv1.KVCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "chaos", Namespace: ns},
		Spec: kvv1.KVClusterSpec{
			Version: "3.6.16", Partitions: 3, BackupSchedule: "*/1 * * * *",
			Storage:                 kvv1.StorageSpec{Size: resource.MustParse("512Mi")},
			ProgressDeadlineSeconds: int32(chaosDeadline / time.Second),
			Backup: &kvv1.BackupSpec{
				S3: &kvv1.S3Destination{Endpoint: "s3." + ns + ".svc:7070", Bucket: bucket, Prefix: "chaos", Insecure: true, CredentialsSecret: "s3-credentials"},
				// Every slot's snapshot stays, so each can be found.
				Retention: kvv1.BackupRetention{KeepLast: 100}, DrainSeconds: ptr.To[int32](3),
			},
			// A real call on deletion, to a member's plain-HTTP metrics port (still up then).
			Deregistration: &kvv1.DeregistrationSpec{HTTP: &kvv1.HTTPDeregistration{
				URL: "http://chaos-0.chaos-peer." + ns + ".svc:2381/livez", Method: "GET", Retries: 3}},
		},
	}
}

// scenario is one pass: the whole life of a cluster under faults, in a new namespace.
func (r *chaosRun) scenario(ctx context.Context) {
	t, cfg := r.t, r.cfg
	ns := envconf.RandomName("kvc-chaos", 16)
	if err := cfg.Client().Resources().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// The next pass needs the machine: wait for the namespace to go (it never hangs).
		_ = cfg.Client().Resources().Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		_ = poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
			err := cfg.Client().Resources().Get(ctx, ns, "", &corev1.Namespace{})
			return apierrors.IsNotFound(err), nil
		})
	}()
	s3 := startS3(ctx, t, cfg, ns)
	s3.stop() // reconnected for each look: an API server restart ends a port-forward
	kvc := chaosCluster(ns)
	r.follow(kvc)
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	monitorDone := make(chan struct{})
	go func() { defer close(monitorDone); r.monitor(monitorCtx) }()
	defer func() {
		stopMonitor()
		<-monitorDone
		r.mu.Lock()
		samples, ready := r.samples, r.samplesReady
		r.samples, r.samplesReady = 0, 0
		r.mu.Unlock()
		t.Logf("pass %d: the monitor took %d samples, %d with a member Ready", r.pass, samples, ready)
		if ready < 60 {
			t.Errorf("pass %d: the monitor saw a Ready member in %d samples only: the member invariants were not checked", r.pass, ready)
		}
	}()

	converged := func(n int, extra func(*kvv1.KVCluster) bool) func(context.Context) (bool, string) {
		return func(ctx context.Context) (bool, string) {
			k := &kvv1.KVCluster{}
			if err := cfg.Client().Resources().Get(ctx, kvc.Name, ns, k); err != nil {
				return false, err.Error()
			}
			ok := readyWith(k, n) && (extra == nil || extra(k))
			return ok, fmt.Sprintf("phase %s, observed generation %d of %d, members %+v, conditions %s", k.Status.Phase,
				k.Status.ObservedGeneration, k.Generation, k.Status.Members, conditionSummary(k))
		}
	}
	create := func(ctx context.Context) error {
		fresh := kvc.DeepCopy()
		if err := cfg.Client().Resources().Create(ctx, fresh); err != nil {
			return err
		}
		r.follow(fresh)
		return nil
	}
	if !r.phase(ctx, "create", create, converged(3, nil)) {
		return
	}
	startWriter(ctx, t, cfg, kvc)

	setSpec := func(mutate func(*kvv1.KVCluster)) func(context.Context) error {
		return func(ctx context.Context) error {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error { // the operator writes status meanwhile
				k := &kvv1.KVCluster{}
				if err := cfg.Client().Resources().Get(ctx, kvc.Name, ns, k); err != nil {
					return err
				}
				mutate(k)
				return cfg.Client().Resources().Update(ctx, k)
			})
		}
	}
	if !r.phase(ctx, "upgrade", setSpec(func(k *kvv1.KVCluster) { k.Spec.Version = "3.7.3" }),
		converged(3, func(k *kvv1.KVCluster) bool { return k.Status.CurrentVersion == "3.7.3" })) {
		return
	}
	if !r.phase(ctx, "scale out", setSpec(func(k *kvv1.KVCluster) { k.Spec.Partitions = 5 }), converged(5, nil)) {
		return
	}
	if !r.phase(ctx, "scale in", setSpec(func(k *kvv1.KVCluster) { k.Spec.Partitions = 3 }), converged(3, nil)) {
		return
	}
	// A member's volume is lost with its pod: the operator replaces the member.
	oldID := memberID(get(ctx, t, cfg, kvc), kvc.Name+"-1")
	replace := func(ctx context.Context) error {
		r.hit(kvc.Name+"-1", time.Now())
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-" + kvc.Name + "-1", Namespace: ns}}
		if err := cfg.Client().Resources().Delete(ctx, pvc); err != nil {
			return err
		}
		return cfg.Client().Resources().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: kvc.Name + "-1", Namespace: ns}})
	}
	if !r.phase(ctx, "member replacement", replace, converged(3, func(k *kvv1.KVCluster) bool {
		id := memberID(k, kvc.Name+"-1")
		return id != "" && id != oldID
	})) {
		return
	}
	// Scheduled backups go on through every step; this one waits for two slots after its start.
	from := time.Now().Unix()
	if !r.phase(ctx, "scheduled backups", func(context.Context) error { return nil }, converged(3, func(*kvv1.KVCluster) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		done := 0
		for job := range r.succeeded {
			if slot, ok := slotOf(kvc.Name, job); ok && slot >= from {
				done++
			}
		}
		return done >= 2
	})) {
		return
	}

	// No acknowledged write is lost by the cluster.
	rep := writerAsk(ctx, t, cfg, kvc, "stop")
	if !rep.Checked || len(rep.Missing) > 0 {
		r.violate("scheduled backups", chaos.Violation{At: time.Now(), Invariant: "the writer loses no acknowledged write",
			Message: fmt.Sprintf("%d of %d acknowledged writes missing (%v)", len(rep.Missing), rep.Acknowledged, rep.Missing[:min(len(rep.Missing), 5)])})
	}
	t.Logf("pass %d: writer %s", r.pass, rep)

	first := get(ctx, t, cfg, kvc)
	deletedAt := time.Now()
	del := func(ctx context.Context) error { return cfg.Client().Resources().Delete(ctx, first) }
	gone := func(ctx context.Context) (bool, string) {
		k := &kvv1.KVCluster{}
		err := cfg.Client().Resources().Get(ctx, kvc.Name, ns, k)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("still there, deletion steps %+v", k.Status.Deletion)
	}
	if !r.phase(ctx, "delete", del, gone) {
		return
	}
	r.checkBackups(ctx, first, deletedAt)
	finalKey := r.checkDeleted(ctx, first)
	if finalKey == "" {
		return
	}

	// Restored under the same name into new volumes, it holds every acknowledged write.
	restore := func(ctx context.Context) error {
		var claims corev1.PersistentVolumeClaimList
		if err := cfg.Client().Resources(ns).List(ctx, &claims); err != nil {
			return err
		}
		for i := range claims.Items {
			if strings.HasPrefix(claims.Items[i].Name, "data-"+kvc.Name+"-") {
				if err := cfg.Client().Resources().Delete(ctx, &claims.Items[i]); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		}
		if err := poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
			var left corev1.PersistentVolumeClaimList
			err := cfg.Client().Resources(ns).List(ctx, &left)
			return err == nil && !slices.ContainsFunc(left.Items, func(c corev1.PersistentVolumeClaim) bool {
				return strings.HasPrefix(c.Name, "data-"+kvc.Name+"-")
			}), nil
		}); err != nil {
			return fmt.Errorf("the old member volumes did not go: %w", err)
		}
		restored := chaosCluster(ns)
		restored.Spec.Version = "3.7.3"
		restored.Spec.Restore = &kvv1.RestoreSpec{S3: restored.Spec.Backup.S3, Key: finalKey}
		if err := cfg.Client().Resources().Create(ctx, restored); err != nil {
			return err
		}
		r.follow(restored)
		return nil
	}
	if !r.phase(ctx, "restore", restore, converged(3, nil)) {
		return
	}
	var restoredRep writerReport
	if err := poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		raw, err := writerGet(ctx, t, cfg, kvc, "stop", "endpoints", clientService(kvc, schemeOf(get(ctx, t, cfg, kvc))))
		return err == nil && json.Unmarshal(raw, &restoredRep) == nil, nil
	}); err != nil {
		t.Fatalf("the writer cannot check the restored cluster: %v", err)
	}
	if !restoredRep.Checked || len(restoredRep.Missing) > 0 || restoredRep.Acknowledged != rep.Acknowledged {
		r.violate("restore", chaos.Violation{At: time.Now(), Invariant: "the final backup holds every acknowledged write",
			Message: fmt.Sprintf("%d of %d acknowledged writes missing from the restored cluster (%v)",
				len(restoredRep.Missing), restoredRep.Acknowledged, restoredRep.Missing[:min(len(restoredRep.Missing), 5)])})
	}
	t.Logf("pass %d: restored cluster holds %d of %d acknowledged writes", r.pass, restoredRep.Present, restoredRep.Acknowledged)
}

// phase runs one step of the scenario: act, then faults at random moments until the cluster has
// converged; then it must converge again within the progress deadline of the last fault.
func (r *chaosRun) phase(ctx context.Context, name string, act func(context.Context) error, converged func(context.Context) (bool, string)) bool {
	r.mu.Lock()
	r.step = name
	r.row(name).Runs++
	faultsBefore := len(r.faults)
	r.mu.Unlock()
	began := time.Now()
	if err := act(ctx); err != nil {
		r.t.Fatalf("pass %d, %s: %v", r.pass, name, err)
	}
	injectCtx, stopInjecting := context.WithCancel(ctx)
	injectorDone := make(chan struct{})
	go func() { defer close(injectorDone); r.inject(injectCtx) }()
	var last string
	check := func(ctx context.Context) (bool, error) {
		ok, why := converged(ctx)
		last = why
		return ok, nil
	}
	_ = poll(ctx, chaosDeadline, check)
	stopInjecting()
	<-injectorDone
	// What the last fault did shows within a readiness probe's failures (3 × 5 s): converged
	// before that may be what the status said before the fault.
	r.mu.Lock()
	lastFault := time.Time{}
	if n := len(r.faults); n > faultsBefore {
		lastFault = r.faults[n-1].At.Add(r.faults[n-1].Took)
	}
	r.mu.Unlock()
	time.Sleep(time.Until(lastFault.Add(20 * time.Second)))
	start := time.Now()
	if err := poll(ctx, chaosDeadline, check); err != nil {
		r.violate(name, chaos.Violation{At: time.Now(), Invariant: "converges to its spec within the progress deadline",
			Message: fmt.Sprintf("not converged %s after the last fault: %s", chaosDeadline, last)})
		logs, _ := kubectl(r.cfg, "-n", operatorNamespace, "logs", "deploy/"+operatorDeployment, "--tail=40")
		r.t.Logf("operator logs:\n%s", logs)
		r.logMembers(ctx)
		return false
	}
	r.t.Logf("pass %d: %s converged in %s, %d faults (%s after they stopped)", r.pass, name,
		time.Since(began).Round(time.Second), r.injected()-faultsBefore, time.Since(start).Round(time.Second))
	return true
}

// inject injects faults at random moments until ctx ends (the one in flight completes) or the
// budget is spent.
func (r *chaosRun) inject(ctx context.Context) {
	gap := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.rng.Int64N(int64(hi-lo))) }
	wait := gap(time.Second, 10*time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = gap(5*time.Second, 20*time.Second)
		if r.injected() >= r.settings.faults {
			return
		}
		kind := r.pickFault()
		f, ok := r.injectOne(kind)
		if !ok {
			continue
		}
		r.mu.Lock()
		f.Phase = fmt.Sprintf("pass %d %s", r.pass, r.step)
		r.faults = append(r.faults, f)
		r.row(r.step).Faults++
		r.mu.Unlock()
		r.t.Logf("fault: %s, took %s", f, f.Took.Round(100*time.Millisecond))
	}
}

func (r *chaosRun) pickFault() faultKind {
	total := 0
	for _, w := range faultWeights {
		total += w.weight
	}
	n := r.rng.IntN(total)
	for _, w := range faultWeights {
		if n -= w.weight; n < 0 {
			return w.kind
		}
	}
	panic("unreachable")
}

// injectOne injects one fault; false when it has no target now (no member to hit while another
// one is still down from a fault: one failure at a time is what a cluster is built to survive).
// A fault always completes (a frozen member is thawed), whatever happens to the scenario.
func (r *chaosRun) injectOne(kind faultKind) (fault, bool) {
	ctx := context.Background()
	f := fault{At: time.Now(), Kind: kind}
	switch kind {
	case operatorKilled:
		pod, id := r.runningContainer(ctx, operatorNamespace, "", "")
		if pod == "" {
			return f, false
		}
		f.Target = pod
		if err := clusterScript("signal", "KILL", id); err != nil {
			r.t.Logf("fault %s: %v", kind, err)
			return f, false
		}
		// A new pod, as after a node loss: restarting in place would back off longer each time.
		_ = r.cfg.Client().Resources().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: operatorNamespace}},
			func(o *metav1.DeleteOptions) { o.GracePeriodSeconds = ptr.To[int64](0) })
	case apiServerRestarted:
		if err := clusterScript("restart", "kube-apiserver"); err != nil {
			r.t.Errorf("restart the API server: %v", err)
			return f, false
		}
	case memberKilled, memberPodDeleted, memberFrozen:
		r.mu.Lock()
		faulted, kvc := r.members.Faulted(), r.kvc
		r.mu.Unlock()
		if faulted {
			return f, false
		}
		pod, id := r.runningContainer(ctx, kvc.Namespace, "app.kubernetes.io/instance="+kvc.Name+","+appsv1.StatefulSetRevisionLabel, "etcd")
		if pod == "" {
			return f, false
		}
		f.Target = pod
		r.hit(pod, f.At)
		switch kind {
		case memberKilled:
			if err := clusterScript("signal", "KILL", id); err != nil {
				r.t.Logf("fault %s: %v", kind, err)
			}
		case memberPodDeleted:
			_ = r.cfg.Client().Resources().Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: kvc.Namespace}})
		case memberFrozen:
			// Long enough to fail its readiness (3 × 5 s), short of its liveness limit (6 × 10 s).
			// Thawed whatever happened, even when the freeze reached only some processes.
			frozen := clusterScript("signal", "STOP", id)
			if frozen == nil {
				time.Sleep(20*time.Second + time.Duration(r.rng.Int64N(int64(20*time.Second))))
			}
			if err := clusterScript("signal", "CONT", id); err != nil || frozen != nil {
				r.t.Logf("freeze %s: %v; thaw: %v", pod, frozen, err)
			}
		}
	}
	f.Took = time.Since(f.At)
	return f, true
}

// runningContainer picks a running pod at random among those selector matches in ns (the
// operator's when selector is empty) and returns its name and the ID of its container (the first
// when container is empty); "" when there is none.
func (r *chaosRun) runningContainer(ctx context.Context, ns, selector, container string) (string, string) {
	var pods corev1.PodList
	if err := r.cfg.Client().Resources(ns).List(ctx, &pods, func(o *metav1.ListOptions) { o.LabelSelector = selector }); err != nil {
		return "", ""
	}
	type candidate struct{ pod, id string }
	var running []candidate
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			if (container == "" || c.Name == container) && c.State.Running != nil && strings.HasPrefix(c.ContainerID, "containerd://") {
				running = append(running, candidate{p.Name, strings.TrimPrefix(c.ContainerID, "containerd://")})
				break
			}
		}
	}
	if len(running) == 0 {
		return "", ""
	}
	slices.SortFunc(running, func(a, b candidate) int { return strings.Compare(a.pod, b.pod) }) // the seed picks the same one
	c := running[r.rng.IntN(len(running))]
	return c.pod, c.id
}

// clusterScript runs the local cluster's script (e2e/localcluster/cluster.sh) with args.
func clusterScript(args ...string) error {
	out, err := exec.Command(filepath.Join("localcluster", "cluster.sh"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster.sh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (r *chaosRun) hit(member string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members.Hit(member, at)
}

// follow makes kvc the incarnation the monitor watches, starting afresh.
func (r *chaosRun) follow(kvc *kvv1.KVCluster) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kvc = kvc
	r.members = chaos.NewMembers()
	r.jobSlots, r.succeeded, r.jobSpans = map[int64][]chaos.SlotJob{}, map[string]bool{}, map[types.UID]chaos.Interval{}
	r.createdAt, r.formedAt = kvc.CreationTimestamp.Time, time.Time{}
}

// monitor samples the cluster every second: its members (for the member invariants), its Jobs
// and the operator's lease (for the backup invariants). A sample the API server does not answer
// (it is being restarted) is skipped.
func (r *chaosRun) monitor(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.sample(ctx)
	}
}

func (r *chaosRun) sample(ctx context.Context) {
	res := r.cfg.Client().Resources()
	now := time.Now()
	var lease coordinationv1.Lease
	// A Lease let go (no holder: an operator stopped gracefully) is no leader yet.
	if err := res.Get(ctx, specs.LeaderElectionID, operatorNamespace, &lease); err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
		r.mu.Lock()
		if n := len(r.leases); n == 0 || r.leases[n-1].holder != *lease.Spec.HolderIdentity {
			r.leases = append(r.leases, leaseHolder{at: now, holder: *lease.Spec.HolderIdentity})
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	kvc := r.kvc
	r.mu.Unlock()
	live := &kvv1.KVCluster{}
	if err := res.Get(ctx, kvc.Name, kvc.Namespace, live); err != nil {
		return
	}
	var sts appsv1.StatefulSet
	var pods corev1.PodList
	var jobs batchv1.JobList
	if err := res.Get(ctx, kvc.Name, kvc.Namespace, &sts); err != nil && !apierrors.IsNotFound(err) {
		return
	}
	if err := res.List(ctx, &pods, func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/instance=" + kvc.Name + "," + appsv1.StatefulSetRevisionLabel
	}); err != nil {
		return
	}
	if err := res.List(ctx, &jobs, func(o *metav1.ListOptions) { o.LabelSelector = specs.ClusterUIDLabel + "=" + string(live.UID) }); err != nil {
		return
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Namespace == kvc.Namespace && !p.CreationTimestamp.Before(&live.CreationTimestamp) {
			byName[p.Name] = p
		}
	}
	// The members of the spec: one being added is not one yet, one being removed no longer is.
	var members []chaos.Member
	if sts.Spec.Replicas != nil {
		for i := range min(int(*sts.Spec.Replicas), int(live.Spec.Partitions)) {
			name := fmt.Sprintf("%s-%d", kvc.Name, i)
			p := byName[name]
			up := p != nil && p.DeletionTimestamp == nil && slices.ContainsFunc(p.Status.ContainerStatuses, func(c corev1.ContainerStatus) bool {
				return c.Name == "etcd" && c.State.Running != nil
			})
			members = append(members, chaos.Member{Name: name, Running: up, Ready: up && isPodReady(p)})
		}
	}
	r.mu.Lock()
	r.samples++
	if slices.ContainsFunc(members, func(m chaos.Member) bool { return m.Ready }) {
		r.samplesReady++
	}
	if r.createdAt.IsZero() || live.CreationTimestamp.After(r.createdAt) {
		r.createdAt = live.CreationTimestamp.Time
	}
	if r.formedAt.IsZero() && live.Status.Phase != "" && live.Status.Phase != kvv1.PhaseCreating && live.Status.CurrentVersion != "" {
		r.formedAt = now
	}
	broken, step := r.members.Observe(now, members), r.step
	for _, j := range jobs.Items {
		span := chaos.Interval{From: j.CreationTimestamp.Time, To: now, Why: "backup Job " + j.Name + " running"}
		done := false
		for _, c := range j.Status.Conditions {
			if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
				span.To, done = c.LastTransitionTime.Time, true
				if c.Type == batchv1.JobComplete && j.Labels[specs.BackupKindLabel] == specs.BackupScheduled {
					r.succeeded[j.Name] = true
				}
			}
		}
		if prev, seen := r.jobSpans[j.UID]; !seen || !done || prev.To.Before(span.To) {
			r.jobSpans[j.UID] = span
		}
		if j.Labels[specs.BackupKindLabel] != specs.BackupScheduled {
			continue
		}
		if slot, ok := slotOf(kvc.Name, j.Name); ok {
			seen := chaos.SlotJob{UID: string(j.UID), Created: j.CreationTimestamp.Time}
			if !slices.Contains(r.jobSlots[slot], seen) {
				r.jobSlots[slot] = append(r.jobSlots[slot], seen)
			}
		}
	}
	r.mu.Unlock()
	r.violate(step, broken...)
}

// slotOf is the Unix time of the slot a scheduled Job is named after (backup.JobName:
// <cluster>-<unix minutes>).
func slotOf(cluster, job string) (int64, bool) {
	minutes, err := strconv.ParseInt(strings.TrimPrefix(job, cluster+"-"), 10, 64)
	return minutes * 60, err == nil
}

// checkBackups checks the scheduled backups of an incarnation, from its creation to its deletion:
// one Job per slot, no slot missed but where the missed-slot rules allow, and every successful
// slot's snapshot in the store.
func (r *chaosRun) checkBackups(ctx context.Context, kvc *kvv1.KVCluster, deletedAt time.Time) {
	r.mu.Lock()
	excused := []chaos.Interval{{From: r.createdAt, To: r.formedAt, Why: "the cluster was being created"}}
	if r.formedAt.IsZero() {
		excused[0].To = deletedAt
	}
	for _, span := range r.jobSpans {
		excused = append(excused, span)
	}
	excused = append(excused, chaos.Interval{From: deletedAt, To: deletedAt.Add(time.Hour), Why: "the cluster was being deleted"})
	for _, f := range r.faults {
		// Down until a new leader holds the lease (an API server away past the lease's renewal
		// deadline takes the leader down too); then it needs a moment to look.
		to := f.At.Add(f.Took)
		switch f.Kind {
		case operatorKilled:
			if i := slices.IndexFunc(r.leases, func(l leaseHolder) bool { return l.at.After(f.At) }); i >= 0 {
				to = r.leases[i].at
			} else {
				to = deletedAt
			}
		case apiServerRestarted:
			if i := slices.IndexFunc(r.leases, func(l leaseHolder) bool { return l.at.After(f.At) && l.at.Before(to.Add(time.Minute)) }); i >= 0 {
				to = r.leases[i].at
			}
		default:
			continue
		}
		excused = append(excused, chaos.Interval{From: f.At, To: to.Add(5 * time.Second), Why: string(f.Kind)})
	}
	jobSlots, succeeded := r.jobSlots, r.succeeded
	r.mu.Unlock()
	vs, err := chaos.SlotViolations(kvc.Spec.BackupSchedule, "", kvc.CreationTimestamp.Time, deletedAt.Add(-10*time.Second), jobSlots, excused)
	if err != nil {
		r.t.Fatal(err)
	}
	r.violate("scheduled backups", vs...)
	r.t.Logf("pass %d: %d slots with a Job, %d succeeded", r.pass, len(jobSlots), len(succeeded))

	s3, err := connectS3(r.cfg, kvc.Namespace)
	if err != nil {
		r.t.Fatal(err)
	}
	defer s3.stop()
	dir := fmt.Sprintf("chaos/%s/%s/%s/", kvc.Namespace, kvc.Name, kvc.UID)
	stored := s3.keys(ctx, r.t, dir, ".db")
	for job := range succeeded {
		if !slices.Contains(stored, dir+job+".db") {
			r.violate("scheduled backups", chaos.Violation{At: time.Now(), Invariant: "every successful slot's snapshot is in the store",
				Message: fmt.Sprintf("%s succeeded, but %s%s.db is not in the bucket", job, dir, job)})
		}
	}
}

// checkDeleted checks what a deletion did and left: the deregistration ran (a member frozen or
// killed then may fail it: it must end either way), exactly one final backup (the policy is Take),
// and no object of the cluster but its member volumes, which the README says are kept. It returns
// the final backup's key ("" when there is none).
func (r *chaosRun) checkDeleted(ctx context.Context, kvc *kvv1.KVCluster) string {
	var events corev1.EventList
	if err := r.cfg.Client().Resources(kvc.Namespace).List(ctx, &events); err != nil {
		r.t.Fatal(err)
	}
	outcomes := map[string]int{}
	for _, e := range events.Items {
		if e.InvolvedObject.UID == kvc.UID && strings.HasPrefix(e.Reason, "Deregistration") {
			outcomes[e.Reason] += max(int(e.Count), 1)
		}
	}
	if outcomes["DeregistrationStarted"] == 0 || outcomes["DeregistrationSucceeded"]+outcomes["DeregistrationFailed"] == 0 {
		r.violate("delete", chaos.Violation{At: time.Now(), Invariant: "the deregistration runs on deletion",
			Message: fmt.Sprintf("its events: %v", outcomes)})
	}
	r.t.Logf("pass %d: deregistration events %v", r.pass, outcomes)
	s3, err := connectS3(r.cfg, kvc.Namespace)
	if err != nil {
		r.t.Fatal(err)
	}
	defer s3.stop()
	finals := s3.keys(ctx, r.t, fmt.Sprintf("chaos/%s/%s/%s/%s-final-", kvc.Namespace, kvc.Name, kvc.UID, kvc.Name), ".db")
	if len(finals) != 1 {
		r.violate("delete", chaos.Violation{At: time.Now(), Invariant: "the final backup exists",
			Message: fmt.Sprintf("final backups of %s: %v, want one", kvc.UID, finals)})
	}
	var left string
	if err := poll(ctx, 2*time.Minute, func(context.Context) (bool, error) {
		out, err := kubectl(r.cfg, "-n", kvc.Namespace, "get", "statefulsets,services,configmaps,secrets,jobs,pods,poddisruptionbudgets,networkpolicies",
			"-l", specs.ClusterLabel+"="+kvc.Name, "-o", "name")
		left = strings.TrimSpace(out)
		return err == nil && left == "", nil
	}); err != nil {
		r.violate("delete", chaos.Violation{At: time.Now(), Invariant: "nothing of a deleted cluster is left but its volumes",
			Message: "left two minutes after the KVCluster went: " + strings.ReplaceAll(left, "\n", ", ")})
	}
	if len(finals) == 0 {
		return ""
	}
	return finals[0]
}

func conditionSummary(k *kvv1.KVCluster) string {
	var parts []string
	for _, c := range k.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	return strings.Join(parts, " ")
}

// poll calls cond every 2 seconds until it is true or timeout passes; its errors are not fatal
// (the API server may be restarting).
func poll(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if ok, err := cond(ctx); ok && err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("timed out")
		case <-time.After(2 * time.Second):
		}
	}
}
