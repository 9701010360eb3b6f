// Command scale is the fleet benchmark (`make bench-scale`): the real operator binary against a
// Kubernetes control plane whose node is simulated by kwok, with N KVClusters created at once,
// left alone, taken up by a restarted operator, partly frozen, upgraded and deleted. Simulated
// pods run no etcd, so the operator is built with the kvcsim tag, which sends its etcd
// connections to simulated members (controllers/members/membersim) answering from the pods'
// state; everything else it does goes through the API server as in production. It prints one
// table per scenario and, with -out, writes them with how they were made to a markdown file.
package main

import (
	"bytes"
	"context"

	"errors"
	"flag"
	"fmt"
	"github.com/go-logr/logr"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/members/membersim"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

var scheme = k8sruntime.NewScheme()

// The versions clusters are created on and upgraded to (the e2e's; the images are never pulled).
const (
	fromVersion = "3.6.16"
	toVersion   = "3.7.3"
)

// tools are the cached binaries' folders (e2e/localcluster/build.sh --print-dir).
type tools struct{ kwok, kubernetes, etcd string }

func main() {
	sizes := flag.String("n", "10,100", "fleet sizes, comma-separated: each runs every scenario with a fresh operator")
	steady := flag.Duration("steady", time.Minute, "how long the idle fleet is watched (the operator looks at a healthy cluster once a minute)")
	frozenShare := flag.Float64("frozen", 0.1, "share of the clusters whose members are frozen while as many new clusters are created")
	workers := flag.Int("workers", 0, "the operator's --max-concurrent-reconciles (0: its default)")
	memoryLimit := flag.String("memory-limit", "", "the operator's container memory limit, from which it sets Go's (a quantity such as 160Mi; empty: the shipped Deployment's)")
	perCluster := flag.Duration("wait-per-cluster", 300*time.Millisecond, "how long creation may take per cluster, on top of 2 minutes, before the clusters not Ready fail the run (also for those created beside frozen ones; 1,000 clusters on 2 cores need more than the default)")
	upgradePerCluster := flag.Duration("upgrade-wait-per-cluster", 600*time.Millisecond, "how long the version change may take per cluster, on top of 3 minutes, before the clusters not upgraded fail the run (1,000 clusters on 2 cores take about 0.7 s each: their 3,000 pods restart one member at a time)")
	out := flag.String("out", "", "markdown file to write the tables to, with the machine and how to reproduce them")
	tlsMode := flag.String("tls", string(kvv1.TLSOperator), "the clusters' tls.mode: Operator, what deploy/admission/tls-by-default.yaml gives every new cluster (certificates issued, every etcd request over mutual TLS), or Disabled (plaintext)")
	check := flag.Bool("check", false, "exit 1 unless every cluster became Ready, upgraded and went, and neither the idle fleet nor the restarted operator taking it up made a write (the smoke run of make test)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard()) // the harness's watches log nothing worth reading
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fail(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		fail(err)
	}
	if err := kvv1.AddToScheme(scheme); err != nil {
		fail(err)
	}
	if dir := os.Getenv("KVC_BENCH_LOGS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fail(err)
		}
	}
	t := tools{kwok: os.Getenv("KVC_KWOK"), kubernetes: os.Getenv("KVC_KUBERNETES"), etcd: os.Getenv("KVC_ETCD_DIR")}
	if t.kwok == "" || t.kubernetes == "" || t.etcd == "" {
		fail(errors.New("KVC_KWOK, KVC_KUBERNETES and KVC_ETCD_DIR must name the cached binaries' folders (make bench-scale sets them)"))
	}
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fail(fmt.Errorf("-n: %q is not a fleet size", s))
		}
		ns = append(ns, n)
	}
	if mode := kvv1.TLSMode(*tlsMode); mode != kvv1.TLSOperator && mode != kvv1.TLSDisabled {
		fail(fmt.Errorf("-tls: %q is neither %s nor %s", mode, kvv1.TLSOperator, kvv1.TLSDisabled))
	}
	setup := operatorSetup{workers: *workers}
	if *memoryLimit != "" {
		q, err := resource.ParseQuantity(*memoryLimit)
		if err != nil || q.Value() <= 0 {
			fail(fmt.Errorf("-memory-limit: %q is not a memory size", *memoryLimit))
		}
		setup.memoryLimit = q
	}
	results, err := run(t, ns, *steady, *frozenShare, setup, waits{create: *perCluster, upgrade: *upgradePerCluster}, kvv1.TLSMode(*tlsMode))
	report := render(results, *steady, *frozenShare, setup, kvv1.TLSMode(*tlsMode))
	fmt.Print(report)
	if err != nil {
		fail(err)
	}
	if *out != "" {
		if err := os.WriteFile(*out, []byte(document(report, *sizes, setup.workers)), 0o644); err != nil {
			fail(err)
		}
	}
	if *check {
		for _, r := range results {
			if problems := r.problems(); len(problems) > 0 {
				fail(fmt.Errorf("N=%d: %s", r.n, strings.Join(problems, "; ")))
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-scale:", err)
	os.Exit(1)
}

// run brings up the control plane, the simulated members and the harness's watches once, then
// runs the scenarios for each fleet size with a fresh operator.
// waits are how long a scenario may take per cluster, on top of a few minutes.
type waits struct{ create, upgrade time.Duration }

// operatorSetup is how the benchmark runs the operator where it differs from its defaults.
type operatorSetup struct {
	workers     int               // --max-concurrent-reconciles; 0: the operator's default
	memoryLimit resource.Quantity // its container's memory limit; zero: the shipped Deployment's
}

func run(t tools, ns []int, steady time.Duration, frozenShare float64, setup operatorSetup, perCluster waits, tlsMode kvv1.TLSMode) ([]*result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cacheDir, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	work := filepath.Join(cacheDir, "kvcluster-operator", "bench-scale")
	if c := os.Getenv("KVC_CACHE"); c != "" {
		work = filepath.Join(c, "bench-scale")
	}
	if err := os.MkdirAll(filepath.Dir(work), 0o755); err != nil {
		return nil, err
	}
	lock, err := lockFolder(work)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lock.Close() }()
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(work) }()
	fmt.Fprintf(os.Stderr, "bench-scale: building the operator (kvcsim) and the volume provisioner in %s\n", work)
	for _, b := range [][]string{
		// As make build builds the shipped binary (static, without symbols), whose memory the run measures.
		{"build", "-tags", "kvcsim", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(work, "kvcluster-operator"), "./cmd/kvcluster-operator"},
		{"build", "-o", filepath.Join(work, "provisioner"), "./e2e/localcluster/provisioner"},
	} {
		cmd := exec.Command("go", b...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(b, " "), err, out)
		}
	}
	// kwokctl runs the control plane as processes of its own: an interrupted run must still stop
	// them (and remove the work folder) rather than leave a cluster on the machine.
	stopped := make(chan struct{})
	defer close(stopped)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	var cp *controlPlane
	var cpMu sync.Mutex
	go func() {
		select {
		case <-signals:
			cpMu.Lock()
			if cp != nil {
				cp.stop(t)
			}
			_ = os.RemoveAll(work)
			fmt.Fprintln(os.Stderr, "bench-scale: interrupted")
			os.Exit(130)
		case <-stopped:
		}
	}()
	cpMu.Lock()
	cp, err = startControlPlane(ctx, t, work)
	cpMu.Unlock()
	if err != nil {
		return nil, err
	}
	defer func() {
		cpMu.Lock()
		defer cpMu.Unlock()
		cp.stop(t)
	}()
	defer keepLogs(work)

	owned := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{specs.ManagedByLabel: specs.ManagedByValue})}
	watched, err := cache.New(cp.cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: owned, &corev1.ConfigMap{}: owned, &corev1.Secret{}: owned}})
	if err != nil {
		return nil, err
	}
	tl, err := watchTimeline(ctx, watched)
	if err != nil {
		return nil, err
	}
	for _, obj := range []client.Object{&corev1.ConfigMap{}, &corev1.Secret{}} { // the membership, the members' certificates
		if _, err := watched.GetInformer(ctx, obj); err != nil {
			return nil, err
		}
	}
	go func() { _ = watched.Start(ctx) }()
	if !watched.WaitForCacheSync(ctx) {
		return nil, errors.New("the harness's cache did not sync")
	}
	sim := &membersim.Sim{Pods: watched, Live: cp.c}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Close() }()
	go func() { _ = sim.Serve(l) }()

	var results []*result
	for i, n := range ns {
		b := &bench{cp: cp, tl: tl, sim: sim, watched: watched, n: n, namespace: fmt.Sprintf("scale-%d", n), r: &result{n: n}, perCluster: perCluster, tls: tlsMode}
		results = append(results, b.r)
		b.start = func() (*operator, error) { return startOperator(work, cp.kubeconfig, l.Addr().String(), setup) }
		if b.op, err = b.start(); err != nil {
			return results, err
		}
		err = b.scenarios(ctx, steady, frozenShare)
		b.op.shutdown()
		if err == nil && i < len(ns)-1 {
			err = b.clear(ctx)
		}
		if err != nil {
			return results, fmt.Errorf("N=%d: %w", n, err)
		}
	}
	return results, nil
}

// clear deletes the fleet's namespace and waits until it is gone, so that the next fleet size
// starts once this one's objects are, not while the garbage collector and the provisioner still
// work through them on the same cores. After the last size nothing waits for it. The namespace
// controller deletes thousands of pods and events by collection: one such request can outlast
// the API server's minute at N=1,000, and is retried after a backoff, so the wait grows with N.
func (b *bench) clear(ctx context.Context) error {
	if err := b.cp.c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.namespace}}); err != nil {
		return err
	}
	timeout := 5*time.Minute + time.Duration(b.n)*300*time.Millisecond
	if left := waitAll([]types.NamespacedName{{Name: b.namespace}}, timeout, func(c types.NamespacedName) bool {
		return apierrors.IsNotFound(b.cp.c.Get(ctx, c, &corev1.Namespace{}))
	}); left > 0 {
		return fmt.Errorf("namespace %s not gone %s after its deletion", b.namespace, timeout)
	}
	return nil
}

// keepLogs copies the logs of the operator, the provisioner, kwok and the controller manager, and
// the API server's audit log (every request, by whom: where the writes go), into KVC_BENCH_LOGS,
// when it is set (the idle operator's CPU profile goes there too).
func keepLogs(work string) {
	dir := os.Getenv("KVC_BENCH_LOGS")
	if dir == "" {
		return
	}
	logs := filepath.Join("kwok", "clusters", clusterName, "logs")
	for _, f := range []string{"operator.log", "provisioner.log", filepath.Join(logs, "kwok-controller.log"), filepath.Join(logs, "kube-controller-manager.log"), filepath.Join(logs, "audit.log")} {
		if in, err := os.Open(filepath.Join(work, f)); err == nil {
			if o, err := os.Create(filepath.Join(dir, filepath.Base(f))); err == nil {
				_, _ = io.Copy(o, in)
				_ = o.Close()
			}
			_ = in.Close()
		}
	}
}

// bench is one fleet size's run.
type bench struct {
	cp      *controlPlane
	tl      *timeline
	sim     *membersim.Sim
	watched cache.Cache
	op      *operator
	// start starts an operator (the restart scenario's second one).
	start     func() (*operator, error)
	n         int
	namespace string
	r         *result
	// perCluster is how long creation (on top of 2 minutes) and the version change (on top of 3)
	// may take per cluster.
	perCluster waits
	// tls is the clusters' tls.mode.
	tls kvv1.TLSMode
}

func (b *bench) names(prefix string, n int) []types.NamespacedName {
	out := make([]types.NamespacedName, n)
	for i := range out {
		out[i] = types.NamespacedName{Namespace: b.namespace, Name: fmt.Sprintf("%s%04d", prefix, i)}
	}
	return out
}

// applyEach sends one request per cluster, 32 at a time (as a GitOps sync applies many objects at
// once), and returns when each was answered.
func applyEach(clusters []types.NamespacedName, request func(kvc *kvv1.KVCluster) error) (map[types.NamespacedName]time.Time, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs error
	sent := map[types.NamespacedName]time.Time{}
	sem := make(chan struct{}, 32)
	for _, c := range clusters {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := request(&kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = errors.Join(errs, err)
				return
			}
			sent[c] = time.Now()
		})
	}
	wg.Wait()
	return sent, errs
}

func (b *bench) create(ctx context.Context, clusters []types.NamespacedName) error {
	_, err := applyEach(clusters, func(kvc *kvv1.KVCluster) error {
		kvc.Spec = kvv1.KVClusterSpec{Version: fromVersion, Partitions: 3, TLS: &kvv1.TLSSpec{Mode: b.tls}}
		return b.cp.c.Create(ctx, kvc)
	})
	return err
}

// since is, for each cluster that finished, the time from its start to the end finished reports.
func since(started map[types.NamespacedName]time.Time, finished func(types.NamespacedName) (time.Time, bool)) []time.Duration {
	var out []time.Duration
	for c, at := range started {
		if end, ok := finished(c); ok {
			out = append(out, end.Sub(at))
		}
	}
	return out
}

// overheads are, per cluster, the time from its pods all being Ready to its being Ready.
func (b *bench) overheads(clusters []types.NamespacedName) []time.Duration {
	var out []time.Duration
	for _, c := range clusters {
		if at, ok := b.tl.readyAt(c, fromVersion); ok {
			out = append(out, max(0, at.Sub(b.tl.podsReadyAt(c))))
		}
	}
	return out
}

func (b *bench) scenarios(ctx context.Context, steady time.Duration, frozenShare float64) error {
	if err := b.cp.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.namespace}}); err != nil {
		return err
	}
	fleet := b.names("kv", b.n)
	r := b.r
	log := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "bench-scale: N=%d: %s\n", b.n, fmt.Sprintf(format, args...))
	}

	// Creation: all N at once.
	log("creating %d clusters", b.n)
	start := b.op.mark()
	if err := b.create(ctx, fleet); err != nil {
		return err
	}
	r.create.notDone = waitAll(fleet, 2*time.Minute+time.Duration(b.n)*b.perCluster.create, func(c types.NamespacedName) bool {
		_, ok := b.tl.readyAt(c, fromVersion)
		return ok
	})
	end := b.op.mark()
	r.create.took = end.Sub(start)
	r.create.each = summarize(b.overheads(fleet))
	if err := b.measure(&r.create, start, end); err != nil {
		return err
	}
	if r.create.notDone > 0 {
		return fmt.Errorf("%d of %d clusters did not become Ready", r.create.notDone, b.n)
	}

	// Idle: nothing changes for a while.
	log("watching the idle fleet for %s", steady)
	time.Sleep(10 * time.Second) // creation's last status writes and events settle
	b.op.setQuiet(true)
	conns0, requests0 := b.sim.Stats()
	start = b.op.mark()
	logs := os.Getenv("KVC_BENCH_LOGS")
	if logs != "" {
		// Where the idle operator's CPU goes, for whoever reads the logs.
		if err := b.op.profileCPU(steady, filepath.Join(logs, fmt.Sprintf("idle-cpu-%d.pprof", b.n))); err != nil {
			return err
		}
	} else {
		time.Sleep(steady)
	}
	end = b.op.mark()
	b.op.setQuiet(false)
	conns1, requests1 := b.sim.Stats()
	r.steady.etcdConns, r.steady.etcdRequests = conns1-conns0, requests1-requests0
	if err := b.measure(&r.steady, start, end); err != nil {
		return err
	}
	if logs != "" {
		// What the idle operator's memory holds (its RSS is in the table).
		if err := b.op.profileHeap(filepath.Join(logs, fmt.Sprintf("idle-heap-%d.pprof", b.n))); err != nil {
			return err
		}
	}

	// Restart: the operator stopped as a rolling update stops it, and a new one started against the
	// idle fleet, which it takes up again from what it lists, rewriting none of it; then left
	// alone as long as the idle fleet was, for its settled RSS.
	log("restarting the operator")
	_, grace, err := deployed()
	if err != nil {
		return err
	}
	if err := b.op.terminate(grace); err != nil {
		return err
	}
	lease := &coordinationv1.Lease{}
	leaseKey := types.NamespacedName{Namespace: leaseNamespace, Name: specs.LeaderElectionID}
	if err := b.cp.c.Get(ctx, leaseKey, lease); err != nil {
		return err
	}
	// Let go, the Lease has no holder: else the next operator waits until it expires.
	r.restart.leaseLetGo = lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == ""
	start = time.Now()
	if b.op, err = b.start(); err != nil {
		return err
	}
	caughtUp, ok := b.op.caughtUp(b.n, 2*time.Minute+time.Duration(b.n)*b.perCluster.create)
	if !ok {
		return fmt.Errorf("the restarted operator had not taken up the %d clusters after %s", b.n, time.Since(start).Round(time.Second))
	}
	if err := b.cp.c.Get(ctx, leaseKey, lease); err != nil {
		return err
	}
	if lease.Spec.AcquireTime != nil {
		r.restart.leaseTaken = lease.Spec.AcquireTime.Sub(start)
	}
	b.op.setQuiet(true)
	time.Sleep(steady)
	b.op.setQuiet(false)
	end = b.op.mark()
	if err := b.measure(&r.restart, start, end); err != nil {
		return err
	}
	r.restart.took = caughtUp.Sub(start)
	r.restart.use, r.restart.settledRSS = b.op.usage(start, caughtUp), b.op.usage(caughtUp, end).lastRSS

	// Frozen members: a share of the clusters stop answering (SIGSTOP); as many new clusters are
	// created once the operator has run into every frozen one.
	if frozen := int(frozenShare * float64(b.n)); frozen > 0 {
		log("freezing %d clusters", frozen)
		r.frozen.frozen = frozen
		for _, c := range fleet[:frozen] {
			b.sim.Freeze(c, true)
		}
		if left := waitAll(fleet[:frozen], 3*time.Minute, func(c types.NamespacedName) bool { return b.sim.Held(c) > 0 }); left > 0 {
			return fmt.Errorf("the operator did not look at %d of the frozen clusters within 3 minutes", left)
		}
		probes := b.names("new", frozen)
		start = b.op.mark()
		if err := b.create(ctx, probes); err != nil {
			return err
		}
		r.frozen.notDone = waitAll(probes, 2*time.Minute+time.Duration(frozen)*b.perCluster.create, func(c types.NamespacedName) bool {
			_, ok := b.tl.readyAt(c, fromVersion)
			return ok
		})
		end = b.op.mark()
		r.frozen.took = end.Sub(start)
		r.frozen.each = summarize(b.overheads(probes))
		if err := b.measure(&r.frozen, start, end); err != nil {
			return err
		}
		for _, c := range fleet[:frozen] {
			b.sim.Freeze(c, false)
		}
		fleet = append(fleet, probes...)
		if r.frozen.notDone > 0 {
			return fmt.Errorf("%d of %d clusters created beside frozen ones did not become Ready", r.frozen.notDone, frozen)
		}
		log("waiting for the thawed clusters")
		if left := waitAll(fleet, 3*time.Minute, b.currentlyReady); left > 0 {
			return fmt.Errorf("%d clusters not Ready 3 minutes after their members thawed", left)
		}
	}

	// A version change on every cluster at once.
	log("upgrading %d clusters to %s", len(fleet), toVersion)
	start = b.op.mark()
	patched, err := applyEach(fleet, func(kvc *kvv1.KVCluster) error {
		return b.cp.c.Patch(ctx, kvc, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"version":"`+toVersion+`"}}`)))
	})
	if err != nil {
		return err
	}
	r.upgrade.notDone = waitAll(fleet, 3*time.Minute+time.Duration(len(fleet))*b.perCluster.upgrade, func(c types.NamespacedName) bool {
		_, ok := b.tl.readyAt(c, toVersion)
		return ok
	})
	end = b.op.mark()
	r.upgrade.took = end.Sub(start)
	r.upgrade.each = summarize(since(patched, func(c types.NamespacedName) (time.Time, bool) { return b.tl.readyAt(c, toVersion) }))
	if err := b.measure(&r.upgrade, start, end); err != nil {
		return err
	}
	r.upgrade.clusters = len(fleet)

	// Deletion of every cluster at once.
	log("deleting %d clusters", len(fleet))
	start = b.op.mark()
	deleted, err := applyEach(fleet, func(kvc *kvv1.KVCluster) error { return b.cp.c.Delete(ctx, kvc) })
	if err != nil {
		return err
	}
	r.delete.notDone = waitAll(fleet, 2*time.Minute+time.Duration(len(fleet))*200*time.Millisecond, func(c types.NamespacedName) bool {
		_, ok := b.tl.goneAt(c)
		return ok
	})
	end = b.op.mark()
	r.delete.took = end.Sub(start)
	r.delete.each = summarize(since(deleted, b.tl.goneAt))
	r.delete.clusters = len(fleet)
	if err := b.measure(&r.delete, start, end); err != nil {
		return err
	}
	if r.upgrade.notDone > 0 || r.delete.notDone > 0 {
		return fmt.Errorf("%d clusters did not finish the upgrade, %d were not deleted", r.upgrade.notDone, r.delete.notDone)
	}
	return nil
}

// currentlyReady reads the cluster's phase now (the timeline records only first times).
func (b *bench) currentlyReady(c types.NamespacedName) bool {
	var kvc kvv1.KVCluster
	if err := b.watched.Get(context.Background(), c, &kvc); err != nil {
		return false
	}
	return kvc.Status.Phase == kvv1.PhaseReady && kvc.Status.ReadyPartitions == kvc.Spec.Partitions
}

func (b *bench) measure(s *scenario, from, to time.Time) error {
	s.window = to.Sub(from)
	s.use = b.op.usage(from, to)
	audit, err := b.cp.auditLog()
	if err != nil {
		return err
	}
	s.requests, err = operatorRequests(audit, from, to)
	return err
}

// result is one fleet size's figures.
type result struct {
	n                               int
	create, steady, restart, frozen scenario
	upgrade, delete                 scenario
}

type scenario struct {
	window, took time.Duration
	each         distribution
	notDone      int
	clusters     int
	frozen       int
	requests     requests
	use          usage
	// etcdConns and etcdRequests are what the simulated members served (idle fleet).
	etcdConns, etcdRequests int64
	// Of the restart: whether the stopped operator let its leader election Lease go, when the
	// new one took it, and its RSS once it has been idle as long as the fleet was.
	leaseLetGo bool
	leaseTaken time.Duration
	settledRSS int64
}

// ran reports whether the scenario was measured: after a failure the later ones are not, and
// get no row.
func (s scenario) ran() bool { return s.window > 0 }

// problems are what -check fails on: a functional failure, or writes by an idle fleet or by the
// operator restarted against it.
func (r *result) problems() []string {
	var p []string
	// A count that is zero because nothing was counted must not pass for an idle operator.
	if r.create.requests.writes() == 0 {
		p = append(p, "no request of the operator's user agent in the audit log while it created the clusters")
	}
	if r.steady.etcdRequests == 0 {
		p = append(p, "the simulated members answered no request while the fleet was idle")
	}
	if w := r.steady.requests.writes(); w > 0 {
		p = append(p, fmt.Sprintf("the idle fleet made %d writes: %s", w, r.steady.requests.perCluster(1)))
	}
	if w := r.restart.requests.writes(); w > 0 {
		p = append(p, fmt.Sprintf("the restarted operator made %d writes to the unchanged fleet: %s", w, r.restart.requests.perCluster(1)))
	}
	if r.restart.ran() && !r.restart.leaseLetGo {
		p = append(p, fmt.Sprintf("the stopped operator kept its leader election Lease: the next one became leader %s after it started", seconds(r.restart.leaseTaken)))
	}
	return p
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// render prints the tables.
func render(results []*result, steady time.Duration, frozenShare float64, setup operatorSetup, tlsMode kvv1.TLSMode) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	w("### Creating N clusters at once (3 members each, tls.mode %s)\n\n", tlsMode)
	w("| N | all Ready after | operator overhead per cluster p50 / p99 / max | API requests per cluster | operator CPU | peak RSS | queue depth max | mean queue wait |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		c := r.create
		w("| %d | %s | %s | %s | %.1f s | %s | %.0f | %s |\n", r.n, seconds(c.took), c.each, c.requests.perCluster(float64(r.n)), c.use.cpu, mib(c.use.peakRSS), c.use.maxDepth, seconds(c.use.meanWait))
	}
	w("\nOverhead: from the moment the last of a cluster's pods was Ready to the moment the cluster was (both as the harness's watches saw them).\n\n")
	w("### Idle fleet (%s, after creation settled)\n\n", steady)
	w("| N | API reads per cluster per minute | API writes per cluster per minute | leader election requests per minute | etcd connections per cluster per minute | etcd requests per cluster per minute | operator CPU per minute | RSS |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		c := r.steady
		if !c.ran() {
			continue
		}
		minutes := c.window.Minutes()
		per := float64(r.n) * minutes
		w("| %d | %s | %s | %s | %s | %s | %.2f s | %s |\n", r.n, trim(float64(c.requests.reads())/per), trim(float64(c.requests.writes())/per), trim(float64(c.requests.leases)/minutes),
			trim(float64(c.etcdConns)/per), trim(float64(c.etcdRequests)/per), c.use.cpu/minutes, mib(c.use.lastRSS))
	}
	w("\n### The operator restarted against the idle fleet\n\n")
	w("Stopped as a rolling update stops it (SIGTERM, its exit awaited) and a new process started: leader when it took the leader election Lease; taken up when it has reconciled as many times as there are clusters and holds nothing in its queue; then left alone for %s. The leader election's requests are counted apart.\n\n", steady)
	w("| N | leader after | taken up after | API requests per cluster | operator CPU until taken up | peak RSS | RSS %s later |\n|---|---|---|---|---|---|---|\n", steady)
	for _, r := range results {
		c := r.restart
		if !c.ran() {
			continue
		}
		leader := seconds(c.leaseTaken)
		if !c.leaseLetGo {
			leader += " (the stopped operator's Lease expired first)"
		}
		w("| %d | %s | %s | %s | %.1f s | %s | %s |\n", r.n, leader, seconds(c.took), c.requests.perCluster(float64(r.n)), c.use.cpu, mib(c.use.peakRSS), mib(c.settledRSS))
	}
	w("\n### New clusters while %.0f %% of the fleet's members are frozen (SIGSTOP: connections accepted, never answered)\n\n", frozenShare*100)
	w("| N | frozen clusters | new clusters: all Ready after | operator overhead per new cluster p50 / p99 / max | queue depth max | mean queue wait |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		c := r.frozen
		if !c.ran() || c.frozen == 0 {
			continue
		}
		w("| %d | %d | %s | %s | %.0f | %s |\n", r.n, c.frozen, seconds(c.took), c.each, c.use.maxDepth, seconds(c.use.meanWait))
	}
	w("\n### Version change (%s → %s) on every cluster at once: three members restarted one at a time each\n\n", fromVersion, toVersion)
	w("| clusters | all upgraded after | per cluster p50 / p99 / max | API requests per cluster | operator CPU | peak RSS | queue depth max |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		c := r.upgrade
		if !c.ran() {
			continue
		}
		w("| %d | %s | %s | %s | %.1f s | %s | %.0f |\n", c.clusters, seconds(c.took), c.each, c.requests.perCluster(float64(max(c.clusters, 1))), c.use.cpu, mib(c.use.peakRSS), c.use.maxDepth)
	}
	for _, r := range results {
		if c := r.upgrade.requests; c.simulatorPodDeletes > c.podDeletes {
			w("\nN=%d: kwok deleted %d pods, the operator %d: kwok ends each deletion the operator starts, so the others were its own (a late deletion by name hits the pod that replaced a restarted one); this row may overstate the operator's time.\n",
				r.n, c.simulatorPodDeletes, c.podDeletes)
		}
	}
	w("\n### Where a reconcile's time goes\n\n")
	w("The KVCluster controller's reconciles while the clusters were created and upgraded (from its metrics): how many per cluster and how long each took on average; the time they took per cluster, and of it the time observing (reading objects, asking the members) and acting (applying the plan: writes, events, etcd membership changes); how long a reconcile waited in the queue before it started, on average.\n\n")
	w("| scenario | clusters | reconciles per cluster | mean reconcile | per cluster: reconciling / observing / acting | mean queue wait |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, row := range []struct {
			name     string
			c        scenario
			clusters int
		}{{"creation", r.create, r.n}, {"upgrade", r.upgrade, r.upgrade.clusters}} {
			if row.clusters == 0 {
				continue
			}
			u, per := row.c.use, time.Duration(row.clusters)
			w("| %s | %d | %.1f | %s | %s / %s / %s | %s |\n", row.name, row.clusters, float64(u.reconciles)/float64(row.clusters), seconds(u.reconciling/time.Duration(max(u.reconciles, 1))),
				seconds(u.reconciling/per), seconds(u.observing/per), seconds(u.acting/per), seconds(u.meanWait))
		}
	}
	w("\n### Deleting every cluster at once\n\n")
	w("Without a backup or a deregistration a cluster has no finalizer: the API server removes it at once and the garbage collector its objects, with nothing for the operator to do. This shows that it stays so; the final backup's cost is not measured here.\n\n")
	w("| clusters | all gone after | per cluster p50 / p99 / max | API requests per cluster | operator CPU |\n|---|---|---|---|---|\n")
	for _, r := range results {
		c := r.delete
		if !c.ran() {
			continue
		}
		w("| %d | %s | %s | %s | %.1f s |\n", c.clusters, seconds(c.took), c.each, c.requests.perCluster(float64(max(c.clusters, 1))), c.use.cpu)
	}
	for _, r := range results {
		for _, c := range []struct {
			what string
			s    scenario
		}{{"became Ready", r.create}, {"created beside frozen ones became Ready", r.frozen}, {"upgraded", r.upgrade}, {"went", r.delete}} {
			if c.s.notDone > 0 {
				w("\n**N=%d: %d clusters never %s**: the figures above are those of the others.\n", r.n, c.s.notDone, c.what)
			}
		}
	}
	if setup.workers > 0 {
		w("\nOperator flags: the defaults but --max-concurrent-reconciles=%d.\n", setup.workers)
	} else {
		w("\nOperator flags: the defaults.\n")
	}
	if !setup.memoryLimit.IsZero() {
		w("Its container's memory limit (MEMORY_LIMIT): %s instead of the shipped Deployment's.\n", setup.memoryLimit.String())
	}
	return s.String()
}

func document(report, sizes string, workers int) string {
	withWorkers := "32 workers"
	if workers > 0 {
		withWorkers = fmt.Sprintf("%d workers (--max-concurrent-reconciles)", workers)
	}
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if dirty, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); len(dirty) > 0 {
		commit = append(bytes.TrimSpace(commit), " with uncommitted changes"...)
	}
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
		if len(f) >= 2 {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
		}
	}
	return fmt.Sprintf(`# Fleet benchmark

Generated by `+"`make bench-scale`"+` on %s (commit %s): %d CPUs (%s), %s RAM, %s/%s, %s.
Fleet sizes: %s.

## What runs

- A Kubernetes v1.37 control plane (etcd, kube-apiserver, controller manager, scheduler) from the
  project's cached binaries, started by kwokctl on 127.0.0.1, with one node simulated by kwok: pods
  scheduled there become Ready without running anything. The local cluster's volume provisioner
  binds the member claims.
- The real operator binary, as a process, with its defaults (leader election, %s, 5 s etcd
  timeout) and, as the Deployment gives it, its container's memory limit in MEMORY_LIMIT (Go's
  limit is 90 %% of what its executable's pages leave of it; no cgroup enforces it here). It is built as `+"`make build`"+` builds it, with the `+"`kvcsim`"+` tag, whose only difference is that its etcd
  connections go to simulated members (`+"`controllers/members/membersim`"+`): a gRPC server speaking
  etcd's API that answers from the member pods' state — a member answers while its pod is Ready,
  reports its pod's image version, and the membership changes only through the operator's
  requests. It takes a connection as the member pod's etcd flags say: with `+"`-tls Operator`"+`
  (the default: what the shipped admission policy gives every new cluster) each one is a TLS
  handshake with the member's server certificate, from its Secret, the operator's client
  certificate checked against the cluster's CA; `+"`-tls Disabled`"+` runs plaintext clusters
  (the first table's heading says which ran). Everything else the operator does goes through the API
  server as in production.
  The simulated members elect a leader at once, are always caught up and never refuse a
  membership change for being too recent: creation and upgrade times leave out etcd's own
  delays and are lower bounds for real members.
- API requests are the operator's own (its user agent), counted from the API server's audit log;
  CPU and RSS from /proc every second; the work queue's depth and wait from the operator's
  metrics, scraped every %d s and at each scenario's start and end (only the series these tables
  use are sent; each scrape still gathers every series, which every second took a fifth of the
  operator's CPU through the upgrade of 1,100 clusters).

## Reproduce

    make tools          # once: builds kwok and the Kubernetes binaries into the cache
    make bench-scale    # BENCH_SCALE_N=10,100 by default; rewrites this file

This file's run: `+"`go run ./e2e/scale %s`"+`.

`+"`make test`"+` runs the same harness with N=10 as a smoke test.

## Results

%s`, time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(string(commit)), runtime.NumCPU(), cpu, mem, runtime.GOOS, runtime.GOARCH, runtime.Version(), sizes, withWorkers, scrapeEvery, strings.Join(os.Args[1:], " "), report)
}

// lockFolder takes the lock of the benchmark's folder work (<work>.lock, beside it) and writes the
// process's PID into it; closing the file, or the process ending, releases it. Two runs would
// share the control plane's name and the clusters' names: one's deletion scenario deletes the
// other's clusters (a run whose 'go run' was killed lives on).
func lockFolder(work string) (*os.File, error) {
	lock, err := os.OpenFile(work+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	switch err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		holder, _ := os.ReadFile(lock.Name())
		_ = lock.Close()
		return nil, fmt.Errorf("another bench-scale is running, process %s (it holds %s): stop it first", bytes.TrimSpace(holder), lock.Name())
	case err != nil:
		_ = lock.Close()
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	if err := lock.Truncate(0); err == nil {
		_, _ = fmt.Fprintf(lock, "%d\n", os.Getpid())
	}
	return lock, nil
}
