package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvcluster/kvcluster-operator/deploy"
)

// operator is the real operator binary (built with the kvcsim tag: its etcd connections go to the
// simulated members), run as a process against the control plane, sampled every second (its
// metrics every scrapeEvery).
type operator struct {
	cmd     *exec.Cmd
	metrics string // its /metrics URL (plain HTTP on loopback)
	pprof   string // its /debug/pprof/ URL

	mu      sync.Mutex
	samples []sample
	// quiet: sample /proc only, not the metrics endpoint, whose serving is work the operator would
	// do once per Prometheus scrape (every 15–60 s), not every second.
	quiet    bool
	stop     chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}
}

// sample is the operator at one moment: from /proc and its own metrics.
type sample struct {
	at  time.Time
	rss int64   // bytes
	cpu float64 // seconds, user + system, since start
	// scraped: the metrics below were read (a quiet sample reads /proc only).
	scraped    bool
	queueDepth float64
	// queueWait is how long items waited before a worker took them; reconcile how long the
	// reconciles took, and steps how long their observe and act steps did (all since start).
	queueWait, reconcile timeSpent
	steps                map[string]timeSpent
}

// timeSpent is a histogram's running sum (seconds) and count.
type timeSpent struct {
	sum   float64
	count uint64
}

func spent(h *dto.Histogram) timeSpent {
	return timeSpent{sum: h.GetSampleSum(), count: h.GetSampleCount()}
}

// since is the time observed between two moments, and how many observations (none if the
// histogram started again between them).
func (t timeSpent) since(earlier timeSpent) (time.Duration, uint64) {
	if t.count < earlier.count {
		return 0, 0
	}
	return time.Duration((t.sum - earlier.sum) * float64(time.Second)), t.count - earlier.count
}

// freePorts returns n distinct loopback ports nothing listens on: the listeners stay open until
// all n are picked, so the kernel cannot hand out one port twice.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// deployed is what the shipped Deployment gives the manager: its container's memory limit, and
// how long its pod is given to stop (terminationGracePeriodSeconds; Kubernetes' default if unset).
func deployed() (memoryLimit int64, grace time.Duration, err error) {
	dep, manager, err := deploy.Manager(nil)
	if err != nil {
		return 0, 0, err
	}
	q, ok := manager.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return 0, 0, errors.New("the shipped manager container has no memory limit")
	}
	grace = 30 * time.Second
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	return q.Value(), grace, nil
}

// leaseNamespace holds the operator's leader election Lease.
const leaseNamespace = "default"

func startOperator(work, kubeconfig, simulated string, setup operatorSetup) (*operator, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	mport, pport, dport := ports[0], ports[1], ports[2]
	cmd := exec.Command(filepath.Join(work, "kvcluster-operator"), "--kubeconfig", kubeconfig,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mport), "--metrics-secure=false",
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", pport), "--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", dport),
		"--leader-election-namespace", leaseNamespace, "--backup-image", "kvcluster.io/operator:bench")
	if setup.workers > 0 {
		cmd.Args = append(cmd.Args, "--max-concurrent-reconciles", strconv.Itoa(setup.workers))
	}
	limit := setup.memoryLimit.Value()
	if limit == 0 {
		if limit, _, err = deployed(); err != nil {
			return nil, err
		}
	}
	// As deployed, the Deployment gives the operator its container's memory limit (Go's follows
	// from it); -memory-limit gives another.
	cmd.Env = append(os.Environ(), "KVC_SIMULATED_MEMBERS="+simulated, "MEMORY_LIMIT="+strconv.FormatInt(limit, 10))
	log, err := os.OpenFile(filepath.Join(work, "operator.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	op := &operator{cmd: cmd, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", mport), pprof: fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", dport),
		stop: make(chan struct{}), stopped: make(chan struct{}),
		// Its start: no CPU used yet, so a window from here counts what starting took.
		samples: []sample{{at: time.Now()}}}
	deadline := time.Now().Add(time.Minute)
	for {
		if s, err := op.sample(true); err == nil && s.scraped {
			break
		}
		if time.Now().After(deadline) {
			op.kill()
			return nil, fmt.Errorf("the operator did not serve its work queue's metrics within a minute (see %s)", log.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
	go op.sampleEverySecond()
	return op, nil
}

// profileCPU writes the operator's CPU profile over the next d to file (read it with go tool pprof).
func (op *operator) profileCPU(d time.Duration, file string) error {
	return op.profile(fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), file)
}

// profileHeap writes the operator's heap profile (after a garbage collection) to file.
func (op *operator) profileHeap(file string) error { return op.profile("heap?gc=1", file) }

func (op *operator) profile(query, file string) error {
	resp, err := http.Get(op.pprof + query)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", query, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func (op *operator) kill() {
	_ = op.cmd.Process.Kill()
	_ = op.cmd.Wait()
}

func (op *operator) shutdown() {
	op.stopSampling()
	op.kill()
}

func (op *operator) stopSampling() {
	op.stopOnce.Do(func() { close(op.stop) })
	<-op.stopped
}

// terminate stops the operator as a rolling update does: SIGTERM, then its exit awaited for the
// Deployment's grace period (its manager lets running reconciles finish), then SIGKILL.
func (op *operator) terminate(grace time.Duration) error {
	op.stopSampling()
	exited := make(chan struct{})
	go func() {
		_ = op.cmd.Wait()
		close(exited)
	}()
	_ = op.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return nil
	case <-time.After(grace):
		_ = op.cmd.Process.Kill()
		<-exited
		return fmt.Errorf("the operator did not exit within %s of SIGTERM", grace)
	}
}

// caughtUp waits, up to timeout, until the operator has reconciled as many times as there are
// clusters and holds nothing in its queue: having listed them at its start, it has taken each
// up once. It returns when it saw so (a sample it keeps), or false.
func (op *operator) caughtUp(clusters int, timeout time.Duration) (time.Time, bool) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		s, err := op.sample(true)
		if err != nil || !s.scraped {
			continue
		}
		op.mu.Lock()
		op.samples = append(op.samples, s)
		op.mu.Unlock()
		if s.reconcile.count >= uint64(clusters) && s.queueDepth == 0 {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// metricsRead are the metric families the harness reads, the only ones it asks for (name[]):
// the whole endpoint's text, every cluster's series, cost the operator a fifth of a second of CPU
// at 1,000 clusters (read every second, 44 % of its CPU), work Prometheus asks for every 15–60 s.
// The filter spares the encoding; each scrape still gathers every series.
var metricsRead = []string{"workqueue_depth", "workqueue_queue_duration_seconds", "controller_runtime_reconcile_time_seconds", "kvcluster_reconcile_step_duration_seconds"}

// scrapeEvery is how often, in seconds, the metrics are read between a scenario's marks:
// gathering 1,100 clusters' series took a fifth of the operator's CPU through their upgrade when
// read every second (a CPU profile of the N=1000 run), work the harness, not the operator, asked
// for. A Prometheus that scrapes every 15 s asks for a third as much as this.
const scrapeEvery = 5

func (op *operator) sampleEverySecond() {
	defer close(op.stopped)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-op.stop:
			return
		case <-tick.C:
			op.take(n%scrapeEvery == 0)
		}
	}
}

// mark samples the operator now (its metrics too unless quiet) and returns the moment: a
// scenario bounded by marks has samples at both its ends, not up to a second inside them.
func (op *operator) mark() time.Time { return op.take(true) }

// take samples the operator now: /proc, and its metrics if scrape and not quiet.
func (op *operator) take(scrape bool) time.Time {
	op.mu.Lock()
	quiet := op.quiet
	op.mu.Unlock()
	s, err := op.sample(scrape && !quiet)
	if err == nil {
		op.mu.Lock()
		op.samples = append(op.samples, s)
		op.mu.Unlock()
	}
	return s.at
}

// clockTicks is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// setQuiet stops (true) or resumes scraping the operator's metrics.
func (op *operator) setQuiet(quiet bool) {
	op.mu.Lock()
	defer op.mu.Unlock()
	op.quiet = quiet
}

func (op *operator) sample(scrape bool) (sample, error) {
	s := sample{at: time.Now()}
	pid := op.cmd.Process.Pid
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command (which may hold spaces) start at state: utime and stime are the
	// 14th and 15th fields of the whole line.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	s.cpu = (utime + stime) / clockTicks
	status, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		if kb, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			v, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			s.rss = v << 10
		}
	}
	_ = status.Close()
	if !scrape {
		return s, nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, op.metrics+"?name[]="+strings.Join(metricsRead, "&name[]="), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, err
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, err
	}
	// The priority queue reports its depth per priority (the initial list's and polls' low one,
	// events' 0, member changes' 1): the depth is their sum.
	for _, m := range allSeries(families["workqueue_depth"], "name", "kvcluster") {
		s.queueDepth += m.GetGauge().GetValue()
	}
	if m := series(families["workqueue_queue_duration_seconds"], "name", "kvcluster"); m != nil {
		s.scraped, s.queueWait = true, spent(m.GetHistogram())
	}
	if m := series(families["controller_runtime_reconcile_time_seconds"], "controller", "kvcluster"); m != nil {
		s.reconcile = spent(m.GetHistogram())
	}
	s.steps = map[string]timeSpent{}
	for _, step := range []string{"observe", "act"} {
		if m := series(families["kvcluster_reconcile_step_duration_seconds"], "step", step); m != nil {
			s.steps[step] = spent(m.GetHistogram())
		}
	}
	return s, nil
}

// series picks the series of a metric whose label has this value (the KVCluster controller's
// work queue: name="kvcluster"; one step: step="observe").
func series(f *dto.MetricFamily, label, value string) *dto.Metric {
	if all := allSeries(f, label, value); len(all) > 0 {
		return all[0]
	}
	return nil
}

// allSeries are the series of a metric whose label has this value.
func allSeries(f *dto.MetricFamily, label, value string) []*dto.Metric {
	var all []*dto.Metric
	for _, m := range f.GetMetric() {
		if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
			all = append(all, m)
		}
	}
	return all
}

// usage is what the operator used between two moments.
type usage struct {
	cpu              float64 // seconds
	peakRSS, lastRSS int64
	maxDepth         float64
	// meanWait is how long an item queued in the window waited for a worker, on average (the
	// histogram's buckets are powers of ten: too coarse for a percentile).
	meanWait time.Duration
	// reconciles ran in the window, taking reconciling in all, of which observing (the API
	// server's answers, from the cache or not, and etcd's) and acting (writes, events, etcd
	// membership changes). Totals, not means: a reconcile that ends before it observes (the
	// cluster is gone) has no steps.
	reconciles                     uint64
	reconciling, observing, acting time.Duration
}

// window is the samples that bound [from, to] (the last one before from, else the first after
// it, through the last one before to) and those within it.
func window(samples []*sample, from, to time.Time) (first, last *sample, within []*sample) {
	for _, s := range samples {
		switch {
		case s.at.Before(from):
			first = s
		case s.at.After(to):
			return first, last, within
		default:
			if first == nil {
				first = s
			}
			last = s
			within = append(within, s)
		}
	}
	return first, last, within
}

func (op *operator) usage(from, to time.Time) usage {
	op.mu.Lock()
	defer op.mu.Unlock()
	var all, scraped []*sample
	for i := range op.samples {
		all = append(all, &op.samples[i])
	}
	// A mark and the ticker's sample may be appended in the other order than taken.
	slices.SortStableFunc(all, func(a, b *sample) int { return a.at.Compare(b.at) })
	for _, s := range all {
		if s.scraped {
			scraped = append(scraped, s)
		}
	}
	var u usage
	first, last, within := window(all, from, to)
	if first == nil || last == nil {
		return u
	}
	u.cpu, u.lastRSS = last.cpu-first.cpu, last.rss
	for _, s := range within {
		u.peakRSS = max(u.peakRSS, s.rss)
	}
	first, last, within = window(scraped, from, to)
	if first == nil || last == nil {
		return u
	}
	for _, s := range within {
		u.maxDepth = max(u.maxDepth, s.queueDepth)
	}
	if waited, n := last.queueWait.since(first.queueWait); n > 0 {
		u.meanWait = waited / time.Duration(n)
	}
	u.reconciling, u.reconciles = last.reconcile.since(first.reconcile)
	u.observing, _ = last.steps["observe"].since(first.steps["observe"])
	u.acting, _ = last.steps["act"].since(first.steps["act"])
	return u
}
