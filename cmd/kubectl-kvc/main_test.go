package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/backup/backuptest"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

var (
	// kubeconfig is a kubeconfig file for envtest's API server, as a user would have one.
	kubeconfig string
	// admin is a client of the test itself, playing the operator and the Job controller.
	admin     client.Client
	namespace atomic.Int32
)

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv(backuptest.RequiredEnv) != "" {
			fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run the tests with 'make test' (it builds kube-apiserver and etcd)")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping the plugin's tests: KUBEBUILDER_ASSETS is not set ('make test' builds kube-apiserver and etcd and runs them)")
		os.Exit(0)
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "deploy", "crd")}, ErrorIfCRDPathMissing: true}
	code, err := func() (int, error) {
		if _, err := env.Start(); err != nil {
			_ = env.Stop() // Start leaves what it started running when installing the CRDs fails
			return 1, err
		}
		defer func() { _ = env.Stop() }()
		user, err := env.AddUser(envtest.User{Name: "someone", Groups: []string{"system:masters"}}, nil)
		if err != nil {
			return 1, err
		}
		raw, err := user.KubeConfig()
		if err != nil {
			return 1, err
		}
		dir, err := os.MkdirTemp("", "kubectl-kvc")
		if err != nil {
			return 1, err
		}
		defer os.RemoveAll(dir)
		kubeconfig = filepath.Join(dir, "config")
		if err := os.WriteFile(kubeconfig, raw, 0o600); err != nil {
			return 1, err
		}
		if admin, _, err = newClient(options{kubeconfig: kubeconfig}); err != nil {
			return 1, err
		}
		return m.Run(), nil
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// newNamespace makes a namespace of its own for a test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("kvc-plugin-%d", namespace.Add(1))
	if err := admin.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// kubectlKVC runs the plugin as kubectl would, with the test's kubeconfig in $KUBECONFIG.
func kubectlKVC(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Setenv("KUBECONFIG", kubeconfig)
	var out, errs bytes.Buffer
	code = run(context.Background(), args, &out, &errs)
	return code, out.String(), errs.String()
}

// newCluster creates a KVCluster, with spec.backup unless without is true, and writes status as
// the operator would.
func newCluster(t *testing.T, ns, name string, withBackup bool, status kvv1.KVClusterStatus) *kvv1.KVCluster {
	t.Helper()
	ctx := context.Background()
	kvc := &kvv1.KVCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kvv1.KVClusterSpec{Version: "3.7.3", Partitions: 3, Storage: kvv1.StorageSpec{Size: resource.MustParse("1Gi")}}}
	if withBackup {
		kvc.Spec.Backup = &kvv1.BackupSpec{S3: &kvv1.S3Destination{Endpoint: "s3:7070", Bucket: "backups", CredentialsSecret: "s3"}}
	}
	if err := admin.Create(ctx, kvc); err != nil {
		t.Fatal(err)
	}
	kvc.Status = status
	if err := admin.Status().Update(ctx, kvc); err != nil {
		t.Fatal(err)
	}
	return kvc
}

func at(minutesAgo int) *metav1.Time {
	t := metav1.NewTime(time.Now().Add(-time.Duration(minutesAgo) * time.Minute).Truncate(time.Second))
	return &t
}

func readyStatus(ns string) kvv1.KVClusterStatus {
	size := resource.MustParse("20Mi")
	return kvv1.KVClusterStatus{
		Phase: kvv1.PhaseReady, ReadyPartitions: 3, CurrentVersion: "3.7.3", ClientEndpoint: "https://orders-client." + ns + ".svc:2379",
		LastBackupTime: at(5),
		LastBackup: &kvv1.BackupRecord{Job: "orders-29411", Succeeded: true, Location: "s3://backups/orders-29411.db", Size: 20480,
			SHA256: "ab12", Revision: 42, CompletionTime: at(5)},
		Members: []kvv1.MemberStatus{
			{Name: "orders-0", ID: "8e9e05c52164694d", Version: "3.7.3", Leader: true, Healthy: true, DBSize: &size, DBSizeInUse: &size},
			{Name: "orders-1", ID: "91bc3c398fb3c146", Version: "3.7.3", Healthy: true, Alarms: []string{"NOSPACE"}},
			{Name: "orders-2", ID: "fd422379fda50e48", Version: "3.7.3", Learner: true},
		},
		Conditions: []metav1.Condition{{Type: kvv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "3/3 members healthy",
			LastTransitionTime: *at(60)}},
		DefragmentRequest: &kvv1.DefragmentRequest{Token: "monday", State: kvv1.BackupRequestRunning, StartTime: at(1),
			Defragmented: []string{"orders-1"}, Message: "waiting for backup orders-29412 to finish"},
	}
}

// TestStatusShowsTheClusterOnOneScreen: the members and their roles, versions, the last backup and
// the conditions, in text and as JSON; the namespace from -n or from the kubeconfig's context.
func TestStatusShowsTheClusterOnOneScreen(t *testing.T) {
	ns := newNamespace(t)
	newCluster(t, ns, "orders", true, readyStatus(ns))

	code, out, errs := kubectlKVC(t, "status", "orders", "-n", ns)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"Phase:        Ready", "3/3 ready", "https://orders-client." + ns + ".svc:2379",
		"orders-29411 wrote s3://backups/orders-29411.db (5m", "ago): 20480 bytes, revision 42",
		"orders-0  8e9e05c52164694d  3.7.3    leader", "orders-1  91bc3c398fb3c146  3.7.3    follower  true     -        -       NOSPACE",
		"learner", "Ready  True    Ready   1h0m", "ago  3/3 members healthy",
		"kvcluster.io/defragment-now=monday: Running: defragmented orders-1; waiting for backup orders-29412 to finish"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	// -o json, and the namespace of the kubeconfig's context when -n is not given.
	config, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	config.Contexts[config.CurrentContext].Namespace = ns
	withNamespace := filepath.Join(t.TempDir(), "config")
	if err := clientcmd.WriteToFile(*config, withNamespace); err != nil {
		t.Fatal(err)
	}
	code, out, errs = kubectlKVC(t, "status", "--kubeconfig", withNamespace, "orders", "-o", "json")
	var view clusterView
	if code != 0 || json.Unmarshal([]byte(out), &view) != nil {
		t.Fatalf("exit %d, output not JSON: %s%s", code, out, errs)
	}
	if view.Namespace != ns || view.Status.Phase != kvv1.PhaseReady || len(view.Status.Members) != 3 || view.Status.LastBackup.Revision != 42 {
		t.Errorf("status -o json = %+v", view)
	}

	for _, tt := range []struct {
		args     []string
		code     int
		wantErrs string
	}{
		{[]string{"status", "nosuch", "-n", ns}, 1, "no KVCluster nosuch in namespace " + ns},
		{[]string{"status", "-n", ns}, 2, "want exactly one KVCluster NAME, got 0"},
		{[]string{"status", "orders", "-n", ns, "-o", "yaml"}, 2, "--output must be text or json"},
		{[]string{"defrag", "orders"}, 2, `unknown command "defrag"`},
	} {
		if code, _, errs := kubectlKVC(t, tt.args...); code != tt.code || !strings.Contains(errs, tt.wantErrs) {
			t.Errorf("kubectl kvc %s: exit %d, %q; want exit %d saying %q", strings.Join(tt.args, " "), code, errs, tt.code, tt.wantErrs)
		}
	}
}

// operate plays the operator for one backup request: once the annotation asks for token, it
// moves status.backupRequest through states, holding each long enough for the plugin (which looks
// every second) to see it.
func operate(t *testing.T, kvc *kvv1.KVCluster, token string, states ...kvv1.BackupRequest) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- func() error {
			var got kvv1.KVCluster
			for got.Annotations[kvv1.AnnotationBackupNow] != token {
				if err := admin.Get(ctx, client.ObjectKeyFromObject(kvc), &got); err != nil {
					return err
				}
				time.Sleep(100 * time.Millisecond)
			}
			for _, st := range states {
				if err := admin.Get(ctx, client.ObjectKeyFromObject(kvc), &got); err != nil {
					return err
				}
				got.Status.BackupRequest = &st
				if err := admin.Status().Update(ctx, &got); err != nil {
					return err
				}
				time.Sleep(2500 * time.Millisecond)
			}
			return nil
		}()
	}()
	return done
}

// TestBackupAsksAndFollowsTheBackup: `backup` sets kvcluster.io/backup-now under its own field
// manager, prints each step of status.backupRequest and ends with the backup's outcome: exit 0 on
// success, 1 saying why on failure. A token already answered shows its outcome without asking again.
func TestBackupAsksAndFollowsTheBackup(t *testing.T) {
	ns := newNamespace(t)
	kvc := newCluster(t, ns, "orders", true, readyStatus(ns))
	job := specs.OnDemandBackupJobName(kvc, "first")
	written := &kvv1.BackupRecord{Job: job, Succeeded: true, Location: "s3://backups/" + job + ".db", Size: 4096, Revision: 7, SHA256: "cd34", CompletionTime: at(0)}
	operator := operate(t, kvc, "first",
		kvv1.BackupRequest{Token: "first", State: kvv1.BackupRequestPending, Message: "waiting for backup orders-29412 to finish"},
		kvv1.BackupRequest{Token: "first", State: kvv1.BackupRequestRunning, Job: job},
		kvv1.BackupRequest{Token: "first", State: kvv1.BackupRequestSucceeded, Job: job, Backup: written})
	code, out, errs := kubectlKVC(t, "backup", "orders", "-n", ns, "--token", "first")
	if err := <-operator; err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errs, out)
	}
	for _, want := range []string{"asked for a backup of " + ns + "/orders: kvcluster.io/backup-now=first",
		"Pending: waiting for backup orders-29412 to finish", "Running: Job " + job,
		"Succeeded: " + job + " wrote s3://backups/" + job + ".db"} {
		if !strings.Contains(out, want) {
			t.Errorf("backup printed no %q:\n%s", want, out)
		}
	}
	var got kvv1.KVCluster
	if err := admin.Get(context.Background(), client.ObjectKeyFromObject(kvc), &got); err != nil {
		t.Fatal(err)
	}
	owner := ""
	for _, f := range got.ManagedFields {
		if f.FieldsV1 != nil && strings.Contains(string(f.FieldsV1.Raw), kvv1.AnnotationBackupNow) {
			owner = f.Manager
		}
	}
	if owner != fieldManager {
		t.Errorf("the annotation is managed by %q, want %q", owner, fieldManager)
	}

	// Asked again with the same token: its outcome at once, as JSON; nothing asked anew.
	code, out, errs = kubectlKVC(t, "backup", "orders", "-n", ns, "--token", "first", "-o", "json")
	var req kvv1.BackupRequest
	if code != 0 || json.Unmarshal([]byte(out), &req) != nil || req.State != kvv1.BackupRequestSucceeded || req.Backup.Revision != 7 {
		t.Errorf("the same token again: exit %d, %s%s; want its outcome as JSON", code, out, errs)
	}

	// A failure is exit 1, saying why.
	operator = operate(t, kvc, "second", kvv1.BackupRequest{Token: "second", State: kvv1.BackupRequestFailed,
		Message: "the Job orders-now-1 was deleted before it finished"})
	code, _, errs = kubectlKVC(t, "backup", "orders", "-n", ns, "--token", "second")
	if err := <-operator; err != nil {
		t.Fatal(err)
	}
	if code != 1 || !strings.Contains(errs, "the backup failed: the Job orders-now-1 was deleted before it finished") {
		t.Errorf("a failed backup: exit %d, %q; want exit 1 saying why", code, errs)
	}

	// --wait=false asks and returns.
	if code, _, errs := kubectlKVC(t, "backup", "orders", "-n", ns, "--token", "third", "--wait=false"); code != 0 {
		t.Errorf("--wait=false: exit %d, %s", code, errs)
	}
	if err := admin.Get(context.Background(), client.ObjectKeyFromObject(kvc), &got); err != nil || got.Annotations[kvv1.AnnotationBackupNow] != "third" {
		t.Errorf("--wait=false did not ask: %v %v", got.Annotations, err)
	}

	// Another value set before the operator took this one: the request is superseded, not followed for ever.
	go func() {
		var k kvv1.KVCluster
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if admin.Get(context.Background(), client.ObjectKeyFromObject(kvc), &k) == nil && k.Annotations[kvv1.AnnotationBackupNow] == "fourth" {
				k.Annotations[kvv1.AnnotationBackupNow] = "fifth"
				if admin.Update(context.Background(), &k) == nil {
					return
				}
			}
		}
	}()
	if code, _, errs := kubectlKVC(t, "backup", "orders", "-n", ns, "--token", "fourth", "--timeout", "30s"); code != 1 || !strings.Contains(errs, "superseded") {
		t.Errorf("a request superseded before the operator took it: exit %d, %q; want exit 1 saying it was superseded", code, errs)
	}

	// Without spec.backup there is nothing to ask for.
	newCluster(t, ns, "nowhere", false, readyStatus(ns))
	if code, _, errs := kubectlKVC(t, "backup", "nowhere", "-n", ns); code != 1 || !strings.Contains(errs, "has no spec.backup") {
		t.Errorf("a cluster without spec.backup: exit %d, %q; want exit 1 saying it has no spec.backup", code, errs)
	}
}

// finishedJob creates a backup Job of kvc, finished as the Job controller would finish it, its
// pod's termination message carrying report.
func finishedJob(t *testing.T, kvc *kvv1.KVCluster, name, kind string, succeeded bool, report string) {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{specs.ClusterLabel: kvc.Name, specs.BackupKindLabel: kind, specs.ClusterUIDLabel: string(kvc.UID)}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kvc.Namespace, Labels: labels},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "backup", Image: "operator"}}}}}}
	if err := admin.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	job.Status.StartTime = &now
	if report == "" { // still running
		if err := admin.Status().Update(ctx, job); err != nil {
			t.Fatal(err)
		}
		return
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-pod", Namespace: kvc.Namespace,
		Labels: map[string]string{batchv1.ControllerUidLabel: string(job.UID)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "backup", Image: "operator"}}, RestartPolicy: corev1.RestartPolicyNever}}
	if err := admin.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "backup", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{Message: report}}}}
	if err := admin.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if succeeded {
		job.Status.Succeeded, job.Status.CompletionTime = 1, &now
		job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	} else {
		job.Status.Failed = 1
		job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now}}
	}
	if err := admin.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
}

// TestBackupsListsJobsAndRecords: every backup Job still there with what its pod reported (where
// the backup went, or why it failed), and a backup whose Job was pruned, known from status.
func TestBackupsListsJobsAndRecords(t *testing.T) {
	ns := newNamespace(t)
	kvc := newCluster(t, ns, "orders", true, readyStatus(ns)) // lastBackup: orders-29411, its Job pruned
	finishedJob(t, kvc, "orders-29412", specs.BackupScheduled, true,
		`{"location":"s3://backups/orders-29412.db","size":8192,"sha256":"ef56","revision":50,"etcdVersion":"3.7.3"}`)
	finishedJob(t, kvc, specs.OnDemandBackupJobName(kvc, "t"), specs.BackupOnDemand, false, "backup failed: the store refused the credentials")
	finishedJob(t, kvc, "orders-29413", specs.BackupScheduled, true, "") // running

	code, out, errs := kubectlKVC(t, "backups", "orders", "-n", ns)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// Oldest first, running last: JOB KIND STATE FINISHED SIZE REVISION LOCATION OR ERROR.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := [][]string{
		{"orders-29411", "-", "Succeeded", "5m", "20480", "42", "s3://backups/orders-29411.db"},
		{"orders-29412", "scheduled", "Succeeded", "", "8192", "50", "s3://backups/orders-29412.db"},
		{specs.OnDemandBackupJobName(kvc, "t"), "on-demand", "Failed", "", "-", "-", "backup failed: the store refused the credentials"},
		{"orders-29413", "scheduled", "Running", "-", "-", "-", "-"},
	}
	if len(lines) != len(want)+1 {
		t.Fatalf("backups printed %d lines, want a header and %d:\n%s", len(lines), len(want), out)
	}
	for i, w := range want {
		line := lines[i+1]
		fields := strings.Fields(line)
		if len(fields) < 7 || fields[0] != w[0] || fields[1] != w[1] || fields[2] != w[2] || !strings.HasPrefix(fields[3], w[3]) ||
			fields[5] != w[4] || fields[6] != w[5] || !strings.HasSuffix(line, w[6]) {
			t.Errorf("line %d = %q, want %v", i+1, line, w)
		}
	}

	code, out, _ = kubectlKVC(t, "backups", "orders", "-n", ns, "-o", "json")
	var entries []backupEntry
	if code != 0 || json.Unmarshal([]byte(out), &entries) != nil || len(entries) != 4 || entries[1].SHA256 != "ef56" || entries[1].Kind != specs.BackupScheduled {
		t.Errorf("backups -o json: exit %d, %s", code, out)
	}
}

// TestClientConfigSaysHowToConnect: the endpoint, the client certificate's Secret with TLS, and
// etcdctl commands that connect from a pod and, through a port-forward, from this machine.
func TestClientConfigSaysHowToConnect(t *testing.T) {
	ns := newNamespace(t)
	newCluster(t, ns, "orders", true, readyStatus(ns))
	plain := readyStatus(ns)
	plain.ClientEndpoint = "http://plain-client." + ns + ".svc:2379"
	newCluster(t, ns, "plain", false, plain)

	code, out, errs := kubectlKVC(t, "client-config", "orders", "-n", ns)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"https://orders-client." + ns + ".svc:2379", "Secret " + ns + "/orders-tls-client",
		"--cacert=/etc/etcd-tls/ca.crt --cert=/etc/etcd-tls/tls.crt --key=/etc/etcd-tls/tls.key",
		"kubectl -n " + ns + " port-forward svc/orders-client 2379:2379", `-o jsonpath='{.data.tls\.key}' | base64 -d > tls.key`,
		"etcdctl --endpoints=https://localhost:2379 --cacert=ca.crt"} {
		if !strings.Contains(out, want) {
			t.Errorf("client-config lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = kubectlKVC(t, "client-config", "plain", "-n", ns, "-o", "json")
	var conn connection
	if code != 0 || json.Unmarshal([]byte(out), &conn) != nil || conn.TLS || conn.ClientSecret != "" || !strings.Contains(conn.InCluster, "http://plain-client.") {
		t.Errorf("client-config of a plaintext cluster: exit %d, %s", code, out)
	}
}
