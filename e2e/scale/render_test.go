package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// After a failed creation only the creation row is printed: the scenarios that did not run get
// no row of zeros or NaN passing for a measurement.
func TestOnlyTheScenariosThatRanArePrinted(t *testing.T) {
	failed := &result{n: 1000, create: scenario{window: 7 * time.Minute, took: 7 * time.Minute, notDone: 400}}
	ran := &result{n: 10,
		create:  scenario{window: time.Minute, took: 5 * time.Second},
		steady:  scenario{window: time.Minute, etcdConns: 30, etcdRequests: 40},
		restart: scenario{window: time.Minute, took: 3 * time.Second, leaseLetGo: true, leaseTaken: time.Second, settledRSS: 40 << 20},
		frozen:  scenario{window: time.Minute, frozen: 1, clusters: 1},
		upgrade: scenario{window: time.Minute, clusters: 11},
		delete:  scenario{window: time.Minute, clusters: 11},
	}
	out := render([]*result{ran, failed}, time.Minute, 0.1, operatorSetup{}, kvv1.TLSOperator)
	if strings.Contains(out, "NaN") {
		t.Errorf("the tables hold NaN:\n%s", out)
	}
	rows := map[string]int{}
	for line := range strings.SplitSeq(out, "\n") {
		for _, n := range []string{"10", "11", "1000"} {
			if strings.HasPrefix(line, "| "+n+" |") {
				rows[n]++
			}
		}
	}
	// N=10: creation, idle, restart, frozen; its 11 clusters: upgrade, deletion; N=1000: creation only.
	if rows["10"] != 4 || rows["11"] != 2 || rows["1000"] != 1 {
		t.Errorf("rows per fleet: %v, want 10: 4, 11: 2, 1000: 1\n%s", rows, out)
	}
	if !strings.Contains(out, "**N=1000: 400 clusters never became Ready**") {
		t.Errorf("the clusters that never became Ready are not said:\n%s", out)
	}
}

// The table says which operator ran: the defaults, or the workers and the container's memory
// limit the run gave it instead of the shipped Deployment's (its figures depend on both).
func TestTheOperatorsSetupIsPrinted(t *testing.T) {
	ran := &result{n: 10, create: scenario{window: time.Minute, took: 5 * time.Second}}
	for _, c := range []struct {
		name      string
		setup     operatorSetup
		want, not []string
	}{
		{"defaults", operatorSetup{}, []string{"Operator flags: the defaults.\n"}, []string{"MEMORY_LIMIT"}},
		{"workers", operatorSetup{workers: 8}, []string{"Operator flags: the defaults but --max-concurrent-reconciles=8.\n"}, []string{"MEMORY_LIMIT"}},
		{"memory limit", operatorSetup{memoryLimit: resource.MustParse("160Mi")},
			[]string{"Operator flags: the defaults.\n", "Its container's memory limit (MEMORY_LIMIT): 160Mi instead of the shipped Deployment's.\n"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := render([]*result{ran}, time.Minute, 0.1, c.setup, kvv1.TLSOperator)
			for _, want := range c.want {
				if !strings.Contains(out, want) {
					t.Errorf("%q is not printed:\n%s", want, out)
				}
			}
			for _, not := range c.not {
				if strings.Contains(out, not) {
					t.Errorf("%q is printed:\n%s", not, out)
				}
			}
		})
	}
}

// The smoke run fails on writes by the idle fleet and by the restarted operator, and on a
// stopped operator that kept its Lease; it passes without them.
func TestWritesToTheIdleFleetAndAKeptLeaseAreProblems(t *testing.T) {
	quiet := func() *result {
		return &result{n: 10,
			create: scenario{requests: requests{byVerb: map[string]int{"create": 40}}},
			steady: scenario{etcdRequests: 40, requests: requests{byVerb: map[string]int{"get": 1}, leases: 30}},
			restart: scenario{window: time.Minute, leaseLetGo: true,
				requests: requests{byVerb: map[string]int{"list": 9, "watch": 9}, leases: 3}},
		}
	}
	if p := quiet().problems(); len(p) > 0 {
		t.Errorf("reads and the leader election only: %v, want no problem", p)
	}
	idle := quiet()
	idle.steady.requests.byVerb["patch"] = 1
	restarted := quiet()
	restarted.restart.requests.byVerb["patch"] = 2
	leaseKept := quiet()
	leaseKept.restart.leaseLetGo = false
	for name, r := range map[string]*result{"idle fleet patched": idle, "restarted operator patched": restarted, "lease kept": leaseKept} {
		if p := r.problems(); len(p) != 1 {
			t.Errorf("%s: problems %v, want one", name, p)
		}
	}
}

// TestASecondRunDoesNotStartBesideTheFirst: while one run holds the folder's lock, another is
// refused with the holder's PID; once it is released, the next run takes it.
func TestASecondRunDoesNotStartBesideTheFirst(t *testing.T) {
	work := filepath.Join(t.TempDir(), "bench-scale")
	first, err := lockFolder(work)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockFolder(work); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Fatalf("a second run beside the first: %v, want refused naming process %d", err, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	next, err := lockFolder(work)
	if err != nil {
		t.Fatalf("after the first run: %v", err)
	}
	_ = next.Close()
}

// The work queue's depth is the sum of its priorities' (the priority queue reports each apart).
func TestTheQueueDepthCountsEveryPriority(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `# TYPE workqueue_depth gauge
workqueue_depth{controller="kvcluster",name="kvcluster",priority="-100"} 5
workqueue_depth{controller="kvcluster",name="kvcluster",priority="0"} 3
workqueue_depth{controller="kvcluster",name="kvcluster",priority="1"} 2
workqueue_depth{controller="other",name="other",priority="0"} 7
`)
	}))
	defer metrics.Close()
	self, err := os.FindProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	op := &operator{cmd: &exec.Cmd{Process: self}, metrics: metrics.URL}
	s, err := op.sample(true)
	if err != nil {
		t.Fatal(err)
	}
	if s.queueDepth != 10 {
		t.Errorf("queue depth %v, want 10 (5 + 3 + 2 of the kvcluster queue)", s.queueDepth)
	}
}

// A rotated audit log fails the count instead of counting only the requests of its last file
// (a N=1000 run's upgrade once reported a third of its requests so).
func TestARotatedAuditLogIsNotCounted(t *testing.T) {
	cp := &controlPlane{work: t.TempDir()}
	logs := filepath.Join(cp.work, "kwok", "clusters", clusterName, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(logs, "audit.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := cp.auditLog(); err != nil || got != filepath.Join(logs, "audit.log") {
		t.Fatalf("one audit log: %q, %v; want it, no error", got, err)
	}
	if err := os.WriteFile(filepath.Join(logs, "audit-2026-12-05T01-45-12.345.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := cp.auditLog(); err == nil {
		t.Errorf("rotated audit log: %q, no error; want an error", got)
	}
}

// The leader election's requests, its Lease's and the Event it records on taking it, are counted
// apart from the requests for the clusters: a restarted operator's "became leader" is not a write
// to the fleet.
func TestTheLeaderElectionIsCountedApart(t *testing.T) {
	at := time.Date(2026, 12, 7, 4, 11, 31, 0, time.UTC)
	line := func(verb, resource, namespace, name string) string {
		return fmt.Sprintf(`{"verb":%q,"userAgent":"kvcluster-operator/v0.0.0","stageTimestamp":%q,"responseStatus":{"code":201},"objectRef":{"resource":%q,"namespace":%q,"name":%q}}`+"\n",
			verb, at.Format(time.RFC3339Nano), resource, namespace, name)
	}
	audit := filepath.Join(t.TempDir(), "audit.log")
	log := line("update", "leases", leaseNamespace, specs.LeaderElectionID) +
		line("create", "events", leaseNamespace, specs.LeaderElectionID+".18eedd5caf1d928a") +
		line("create", "events", "scale-10", "kv0001.18eedd5caf1d928b") +
		line("patch", "kvclusters", "scale-10", "kv0001")
	if err := os.WriteFile(audit, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := operatorRequests(audit, at.Add(-time.Second), at.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r.leases != 2 || r.byVerb["create"] != 1 || r.byVerb["patch"] != 1 {
		t.Errorf("leader election %d, by verb %v; want 2, and create 1 (the cluster's event), patch 1", r.leases, r.byVerb)
	}
}
