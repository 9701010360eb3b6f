package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kvv1ac "github.com/kvcluster/kvcluster-operator/apis/applyconfiguration/apis/v1alpha1"
	kvv1 "github.com/kvcluster/kvcluster-operator/apis/v1alpha1"
	"github.com/kvcluster/kvcluster-operator/controllers/plan"
	"github.com/kvcluster/kvcluster-operator/controllers/specs"
)

// fieldManager owns the backup-now annotation the plugin sets, apart from whoever manages the
// rest of the KVCluster (a GitOps tool, kubectl apply).
const fieldManager = "kubectl-kvc"

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// clusterView is what `status -o json` prints: the cluster's name, what its spec asks for and its status.
type clusterView struct {
	Name       string               `json:"name"`
	Namespace  string               `json:"namespace"`
	Version    string               `json:"version"`
	Partitions int32                `json:"partitions"`
	Status     kvv1.KVClusterStatus `json:"status"`
}

// status prints the cluster on one screen: phase, members, versions, endpoint, backups, conditions.
func status(ctx context.Context, c client.Client, key client.ObjectKey, o options, out io.Writer) error {
	kvc, err := getCluster(ctx, c, key)
	if err != nil {
		return err
	}
	st := kvc.Status
	if o.output == "json" {
		return writeJSON(out, clusterView{Name: kvc.Name, Namespace: kvc.Namespace, Version: kvc.Spec.Version, Partitions: kvc.Spec.Partitions, Status: st})
	}
	now := time.Now()
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "KVCluster:\t%s/%s\n", kvc.Namespace, kvc.Name)
	phase := string(st.Phase)
	if phase == "" {
		phase = "(not reconciled yet: is the operator running?)"
	}
	if r := reconciling(st); r != "" {
		phase += " — " + r
	}
	fmt.Fprintf(w, "Phase:\t%s\n", phase)
	fmt.Fprintf(w, "Members:\t%d/%d ready\n", st.ReadyPartitions, kvc.Spec.Partitions)
	version := orNone(st.CurrentVersion)
	if st.CurrentVersion != kvc.Spec.Version {
		version += " (spec.version " + kvc.Spec.Version + ")"
	}
	fmt.Fprintf(w, "Version:\t%s\n", version)
	fmt.Fprintf(w, "Endpoint:\t%s\n", orNone(st.ClientEndpoint))
	if kvc.Spec.Backup == nil {
		fmt.Fprintf(w, "Backups:\tnone (spec.backup is unset)\n")
	} else {
		fmt.Fprintf(w, "Last backup:\t%s\n", recordLine(st.LastBackup, now))
		if st.NextBackupTime != nil {
			fmt.Fprintf(w, "Next backup:\t%s (%s)\n", st.NextBackupTime.UTC().Format(time.RFC3339), until(st.NextBackupTime.Time, now))
		}
	}
	if r := st.BackupRequest; r != nil {
		fmt.Fprintf(w, "Backup asked:\t%s=%s: %s: %s\n", kvv1.AnnotationBackupNow, r.Token, r.State, requestLine(r))
	}
	if r := st.DefragmentRequest; r != nil {
		fmt.Fprintf(w, "Defragment:\t%s=%s: %s: %s\n", kvv1.AnnotationDefragmentNow, r.Token, r.State, defragmentLine(r))
	}
	if err := w.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out, "\nMEMBERS")
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tID\tVERSION\tROLE\tHEALTHY\tDB SIZE\tIN USE\tALARMS")
	for _, m := range st.Members {
		role := "follower"
		switch {
		case m.Leader:
			role = "leader"
		case m.Learner:
			role = "learner"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\n", m.Name, m.ID, orNone(m.Version), role, m.Healthy,
			quantity(m.DBSize), quantity(m.DBSizeInUse), orNone(strings.Join(m.Alarms, ",")))
	}
	if len(st.Members) == 0 {
		fmt.Fprintln(w, "(none reported yet)")
	}
	if err := w.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out, "\nCONDITIONS")
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TYPE\tSTATUS\tREASON\tSINCE\tMESSAGE")
	for _, cond := range st.Conditions {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", cond.Type, cond.Status, cond.Reason, ago(cond.LastTransitionTime.Time, now), cond.Message)
	}
	return w.Flush()
}

// reconciling is what the operator is doing, when it is doing something (the Reconciling condition).
func reconciling(st kvv1.KVClusterStatus) string {
	for _, c := range st.Conditions {
		if c.Type == kvv1.ConditionReconciling && c.Status == metav1.ConditionTrue {
			return c.Message
		}
	}
	return ""
}

// backupNow asks for a backup with kvcluster.io/backup-now and, unless told not to wait, follows
// status.backupRequest until the backup succeeded (nil) or failed (an error saying why).
func backupNow(ctx context.Context, c client.Client, key client.ObjectKey, o options, out io.Writer) error {
	kvc, err := getCluster(ctx, c, key)
	if err != nil {
		return err
	}
	if kvc.Spec.Backup == nil {
		return fmt.Errorf("KVCluster %s/%s has no spec.backup: set spec.backup.s3 or spec.backup.pvc to say where backups go", key.Namespace, key.Name)
	}
	token := o.token
	if token == "" {
		token = time.Now().UTC().Format("20060102T150405Z")
	}
	if len(token) > kvv1.MaxBackupNowToken {
		return fmt.Errorf("--token must be at most %d characters", kvv1.MaxBackupNowToken)
	}
	text := o.output == "text"
	if kvc.Annotations[kvv1.AnnotationBackupNow] == token {
		if text {
			fmt.Fprintf(out, "%s=%s was asked for already\n", kvv1.AnnotationBackupNow, token)
		}
	} else {
		ask := kvv1ac.KVCluster(key.Name, key.Namespace).WithAnnotations(map[string]string{kvv1.AnnotationBackupNow: token})
		if err := c.Apply(ctx, ask, client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("ask for a backup: %w", err)
		}
		if text {
			fmt.Fprintf(out, "asked for a backup of %s/%s: %s=%s\n", key.Namespace, key.Name, kvv1.AnnotationBackupNow, token)
		}
	}
	if !o.wait {
		if text {
			return nil
		}
		if r := kvc.Status.BackupRequest; r != nil && r.Token == token {
			return writeJSON(out, r)
		}
		return writeJSON(out, kvv1.BackupRequest{Token: token, State: kvv1.BackupRequestPending})
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	start, said := time.Now(), ""
	for {
		line := "waiting for the operator to take the request"
		var req *kvv1.BackupRequest
		switch kvc, err := getCluster(ctx, c, key); {
		case err != nil && ctx.Err() == nil:
			line = "cannot read the KVCluster (retrying): " + err.Error()
		case err != nil:
		case kvc.Annotations[kvv1.AnnotationBackupNow] != token && (kvc.Status.BackupRequest == nil || kvc.Status.BackupRequest.Token != token):
			return fmt.Errorf("%s is now %q: this request was superseded before the operator took it", kvv1.AnnotationBackupNow, kvc.Annotations[kvv1.AnnotationBackupNow])
		default:
			if req = kvc.Status.BackupRequest; req != nil && req.Token == token {
				line = string(req.State) + ": " + requestLine(req)
			} else {
				req = nil
			}
		}
		if text && line != said {
			fmt.Fprintf(out, "%6s  %s\n", time.Since(start).Round(time.Second), line)
			said = line
		}
		if req != nil && (req.State == kvv1.BackupRequestSucceeded || req.State == kvv1.BackupRequestFailed) {
			if !text {
				if err := writeJSON(out, req); err != nil {
					return err
				}
			}
			if req.State == kvv1.BackupRequestFailed {
				return fmt.Errorf("the backup failed: %s", req.Message)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped following the backup after %s (%s); it goes on: `kubectl kvc backup %s -n %s --token %s` follows it again",
				time.Since(start).Round(time.Second), line, key.Name, key.Namespace, token)
		case <-time.After(o.poll):
		}
	}
}

// requestLine says where an on-demand backup stands, in one line.
func requestLine(r *kvv1.BackupRequest) string {
	switch {
	case r.Backup != nil:
		return recordLine(r.Backup, time.Now())
	case r.Message != "":
		return r.Message
	case r.Job != "":
		return "Job " + r.Job
	}
	return strings.ToLower(string(r.State))
}

// defragmentLine says where an on-demand defragmentation stands, in one line.
func defragmentLine(r *kvv1.DefragmentRequest) string {
	done := "none defragmented yet"
	if len(r.Defragmented) > 0 {
		done = "defragmented " + strings.Join(r.Defragmented, ", ")
	}
	if r.Message != "" {
		return done + "; " + r.Message
	}
	return done
}

// backupEntry is one backup of `backups`: its kind, state and record.
type backupEntry struct {
	// Kind is scheduled, on-demand, pre-upgrade or final; empty for a backup whose Job is gone,
	// known from the status only.
	Kind  string `json:"kind,omitempty"`
	State string `json:"state"`
	kvv1.BackupRecord
}

// backups lists the cluster's backups: every backup Job still there, with what its pod reported,
// and those the status records whose Jobs were pruned since.
func backups(ctx context.Context, c client.Client, key client.ObjectKey, o options, out io.Writer) error {
	kvc, err := getCluster(ctx, c, key)
	if err != nil {
		return err
	}
	var jobs batchv1.JobList
	if err := c.List(ctx, &jobs, client.InNamespace(key.Namespace), client.MatchingLabels{specs.ClusterLabel: key.Name},
		client.HasLabels{specs.BackupKindLabel}); err != nil {
		return fmt.Errorf("list backup Jobs: %w", err)
	}
	var entries []backupEntry
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if uid := job.Labels[specs.ClusterUIDLabel]; uid != "" && uid != string(kvc.UID) {
			continue // an earlier cluster's of the same name
		}
		j := plan.NewJob(job, "")
		e := backupEntry{Kind: job.Labels[specs.BackupKindLabel], State: "Running", BackupRecord: kvv1.BackupRecord{Job: job.Name}}
		if job.Status.StartTime != nil {
			e.StartTime = &metav1.Time{Time: job.Status.StartTime.Time}
		}
		if j.Done {
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabels{batchv1.ControllerUidLabel: string(job.UID)}); err != nil {
				return fmt.Errorf("list the pods of Job %s: %w", job.Name, err)
			}
			j.Report = plan.TerminationMessage(pods.Items)
			e.BackupRecord, e.State = plan.BackupRecordOf(j), "Failed"
			if j.Succeeded {
				e.State = "Succeeded"
			}
		}
		entries = append(entries, e)
	}
	st := kvc.Status
	for _, known := range []struct {
		kind string
		rec  *kvv1.BackupRecord
	}{{"", st.LastBackup}, {specs.BackupOnDemand, requestBackup(st.BackupRequest)}} {
		if known.rec == nil || slices.ContainsFunc(entries, func(e backupEntry) bool { return e.Job == known.rec.Job }) {
			continue
		}
		e := backupEntry{Kind: known.kind, State: "Failed", BackupRecord: *known.rec}
		if known.rec.Succeeded {
			e.State = "Succeeded"
		}
		entries = append(entries, e)
	}
	// Oldest first; running ones last.
	finished := func(e backupEntry) time.Time {
		if e.CompletionTime == nil {
			return time.Unix(1<<40, 0)
		}
		return e.CompletionTime.Time
	}
	slices.SortStableFunc(entries, func(a, b backupEntry) int {
		if c := finished(a).Compare(finished(b)); c != 0 {
			return c
		}
		return strings.Compare(a.Job, b.Job)
	})
	if o.output == "json" {
		if entries == nil {
			entries = []backupEntry{}
		}
		return writeJSON(out, entries)
	}
	if len(entries) == 0 {
		fmt.Fprintf(out, "no backups of %s/%s: no backup Job is there and its status records none\n", key.Namespace, key.Name)
		return nil
	}
	now := time.Now()
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "JOB\tKIND\tSTATE\tFINISHED\tSIZE\tREVISION\tLOCATION OR ERROR")
	for _, e := range entries {
		when, detail := "-", e.Location
		if e.CompletionTime != nil {
			when = ago(e.CompletionTime.Time, now)
		}
		if e.State == "Failed" || detail == "" {
			detail = e.Message
		}
		size, revision := "-", "-"
		if e.Size > 0 {
			size, revision = fmt.Sprint(e.Size), fmt.Sprint(e.Revision)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Job, orNone(e.Kind), e.State, when, size, revision, orNone(detail))
	}
	return w.Flush()
}

func requestBackup(r *kvv1.BackupRequest) *kvv1.BackupRecord {
	if r == nil {
		return nil
	}
	return r.Backup
}

// connection is what `client-config` prints: where clients connect and with what.
type connection struct {
	// Endpoint is the client Service's URL inside the cluster.
	Endpoint string `json:"endpoint"`
	// TLS: clients need the certificate in ClientSecret (tls.crt, tls.key, ca.crt).
	TLS          bool   `json:"tls"`
	ClientSecret string `json:"clientSecret,omitempty"`
	// InCluster is an etcdctl command for a pod with ClientSecret mounted at /etc/etcd-tls.
	InCluster string `json:"inCluster"`
	// Local are the commands that connect from the machine running kubectl, through a port-forward.
	Local []string `json:"local"`
}

// clientConfig prints the endpoint, the Secret a client needs, and etcdctl commands that connect.
func clientConfig(ctx context.Context, c client.Client, key client.ObjectKey, o options, out io.Writer) error {
	kvc, err := getCluster(ctx, c, key)
	if err != nil {
		return err
	}
	endpoint := kvc.Status.ClientEndpoint
	if endpoint == "" { // not reconciled yet: what the spec will give
		endpoint = specs.ClientEndpoint(kvc, specs.DesiredTransport(kvc).ClientScheme())
	}
	conn := connection{Endpoint: endpoint, TLS: strings.HasPrefix(endpoint, "https://")}
	forward := fmt.Sprintf("kubectl -n %s port-forward svc/%s %d:%d", kvc.Namespace, specs.ClientServiceName(kvc), specs.ClientPort, specs.ClientPort)
	local := fmt.Sprintf("http://localhost:%d", specs.ClientPort)
	conn.InCluster = "etcdctl --endpoints=" + endpoint + " endpoint health"
	conn.Local = []string{forward + " &", "etcdctl --endpoints=" + local + " endpoint health"}
	if conn.TLS {
		conn.ClientSecret = specs.TLSSecretName(kvc, specs.TLSClient)
		conn.InCluster = "etcdctl --endpoints=" + endpoint + " --cacert=/etc/etcd-tls/ca.crt --cert=/etc/etcd-tls/tls.crt --key=/etc/etcd-tls/tls.key endpoint health"
		conn.Local = []string{forward + " &"}
		for _, file := range []string{"ca.crt", "tls.crt", "tls.key"} {
			conn.Local = append(conn.Local, fmt.Sprintf(`kubectl -n %s get secret %s -o jsonpath='{.data.%s}' | base64 -d > %s`,
				kvc.Namespace, conn.ClientSecret, strings.ReplaceAll(file, ".", `\.`), file))
		}
		// The server certificate names localhost, so the port-forward's address verifies.
		conn.Local = append(conn.Local, fmt.Sprintf("etcdctl --endpoints=https://localhost:%d --cacert=ca.crt --cert=tls.crt --key=tls.key endpoint health", specs.ClientPort))
	}
	if o.output == "json" {
		return writeJSON(out, conn)
	}
	fmt.Fprintf(out, "Endpoint (inside the cluster): %s\n", conn.Endpoint)
	if conn.TLS {
		fmt.Fprintf(out, "Mutual TLS: a client presents the certificate in Secret %s/%s (tls.crt, tls.key, ca.crt).\n", kvc.Namespace, conn.ClientSecret)
		fmt.Fprintf(out, "\nFrom a pod with that Secret mounted at /etc/etcd-tls:\n  %s\n", conn.InCluster)
	} else {
		fmt.Fprintf(out, "Plaintext: no certificate needed.\n\nFrom a pod:\n  %s\n", conn.InCluster)
	}
	fmt.Fprintf(out, "\nFrom this machine:\n  %s\n", strings.Join(conn.Local, "\n  "))
	return nil
}

// recordLine says what a finished backup wrote, or why it failed, in one line.
func recordLine(r *kvv1.BackupRecord, now time.Time) string {
	if r == nil {
		return "none yet"
	}
	when := ""
	if r.CompletionTime != nil {
		when = " (" + ago(r.CompletionTime.Time, now) + ")"
	}
	if !r.Succeeded {
		return fmt.Sprintf("%s failed%s: %s", r.Job, when, r.Message)
	}
	return fmt.Sprintf("%s wrote %s%s: %d bytes, revision %d, sha256 %s", r.Job, r.Location, when, r.Size, r.Revision, r.SHA256)
}

func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

func until(t, now time.Time) string { return "in " + t.Sub(now).Round(time.Second).String() }

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func quantity(q *resource.Quantity) string {
	if q == nil {
		return "-"
	}
	return q.String()
}
