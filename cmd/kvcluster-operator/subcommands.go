package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvcluster/kvcluster-operator/backup"
	"github.com/kvcluster/kvcluster-operator/controllers/certs"
)

// The programs the operator's pods run besides the manager. Each reports a failure as its
// container's termination message, which the operator and `kubectl describe` show.
var subcommands = map[string]func(args []string) int{
	"backup":        runBackup,
	"restore-fetch": runRestoreFetch,
	"restore-apply": runRestoreApply,
	"http-call":     runHTTPCall,
}

// storeFlags are the flags that say where backups are: a bucket (credentials come only from the
// environment, which the pod maps from the Secret) or a directory where a PersistentVolumeClaim
// is mounted.
type storeFlags struct {
	s3         backup.S3
	dir, claim string
}

func bindStore(fs *flag.FlagSet) *storeFlags {
	f := &storeFlags{}
	fs.StringVar(&f.s3.Endpoint, "s3-endpoint", "", "S3 endpoint host[:port]")
	fs.StringVar(&f.s3.Bucket, "bucket", "", "bucket")
	fs.StringVar(&f.s3.Region, "region", "us-east-1", "region")
	fs.BoolVar(&f.s3.Insecure, "insecure", false, "plain HTTP (for a store inside the cluster)")
	fs.BoolVar(&f.s3.WorkloadIdentity, "workload-identity", false, "take short-lived credentials from the pod's cloud identity (web identity token, EKS Pod Identity, instance role) instead of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	fs.StringVar(&f.dir, "dir", "", "keep backups under this directory (a mounted PersistentVolumeClaim) instead of a bucket")
	fs.StringVar(&f.claim, "claim", "", "name of the PersistentVolumeClaim mounted at --dir, for locations")
	return f
}

func (f *storeFlags) open() (backup.Store, error) {
	if f.dir != "" {
		return backup.NewDirStore(f.dir, f.claim), nil
	}
	required := map[string]string{"--s3-endpoint (or --dir)": f.s3.Endpoint, "--bucket": f.s3.Bucket}
	if !f.s3.WorkloadIdentity {
		f.s3.AccessKey, f.s3.SecretKey = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
		required["AWS_ACCESS_KEY_ID (or --workload-identity)"], required["AWS_SECRET_ACCESS_KEY"] = f.s3.AccessKey, f.s3.SecretKey
	}
	if err := requireFlags(required); err != nil {
		return nil, err
	}
	return backup.NewS3Store(f.s3)
}

// requireFlags names the required values that are empty.
func requireFlags(values map[string]string) error {
	var missing []string
	for name, v := range values {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing) // the same mistake always reads the same
		return fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	return nil
}

func signalContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, func() { cancel(); stop() }
}

// runBackup streams a snapshot of the cluster to the object store; backup Jobs run it. Its JSON
// result, as termination message, is how the operator learns size, checksum and revision.
func runBackup(args []string) int {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "comma-separated client URLs of the etcd members")
	caFile := fs.String("cacert", "", "CA certificate of a cluster with TLS (with --cert and --key)")
	certFile := fs.String("cert", "", "client certificate")
	keyFile := fs.String("key-file", "", "client certificate's key")
	where := bindStore(fs)
	key := fs.String("key", "", "object key of the snapshot")
	var retention backup.Retention
	fs.StringVar(&retention.Cluster, "prune-cluster", "", "after the backup, prune this cluster's older scheduled snapshots (empty: no pruning)")
	fs.IntVar(&retention.KeepLast, "keep-last", 7, "snapshots kept when pruning")
	fs.DurationVar(&retention.MaxAge, "max-age", 0, "also prune snapshots older than this (0: no age limit)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	terminationLog := fs.String("termination-log", "/dev/termination-log", "where the result is written for the operator")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := requireFlags(map[string]string{"--endpoints": *endpoints, "--key": *key}); err != nil {
		return fail(*terminationLog, "backup", err)
	}
	store, err := where.open()
	if err != nil {
		return fail(*terminationLog, "backup", err)
	}
	etcd := backup.Etcd{Endpoints: strings.Split(*endpoints, ",")}
	if *caFile != "" || *certFile != "" || *keyFile != "" {
		if etcd.TLS, err = loadClientTLS(*caFile, *certFile, *keyFile); err != nil {
			return fail(*terminationLog, "backup", err)
		}
	}
	ctx, cancel := signalContext(*timeout)
	defer cancel()
	res, err := backup.Take(ctx, etcd, store, *key, retention, time.Now)
	for _, w := range res.Warnings {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
	if stopped := (*backup.StoppedError)(nil); errors.As(err, &stopped) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("gave up after %s (its --timeout) while %s: %w", *timeout, stopped.Doing, stopped.Err)
		} else {
			err = fmt.Errorf("stopped (%v) while %s: %w", context.Cause(ctx), stopped.Doing, stopped.Err)
		}
	}
	if err != nil {
		return fail(*terminationLog, "backup", err)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if err := os.WriteFile(*terminationLog, res.Report(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "write the termination log:", err)
	}
	return 0
}

// joiningMessage: a member added to a running cluster (scaled up, or replaced after losing its data)
// must not restore the backup: it would come up with old data under the cluster's identity.
const joiningMessage = "the member joins a running cluster, which sends it the current data: nothing to restore"

// hasDataMessage: a member restarted after it restored (or formed) keeps its data.
const hasDataMessage = "the member already has data: nothing to restore"

// runRestoreFetch is a restoring member's first init container (operator image): it copies this
// binary for the second one and downloads and verifies the snapshot, unless the member has data.
func runRestoreFetch(args []string) int {
	fs := flag.NewFlagSet("restore-fetch", flag.ContinueOnError)
	where := bindStore(fs)
	key := fs.String("key", "", "object key of the snapshot")
	sha := fs.String("sha256", "", "expected sha256 of the snapshot (default: from its metadata)")
	dataDir := fs.String("data-dir", "", "the member's etcd data dir")
	out := fs.String("out", "", "where to put the snapshot")
	copyTo := fs.String("copy-self-to", "", "copy this program here, for the init container in the etcd image")
	clusterState := fs.String("initial-cluster-state", "new", "new: restore; existing: the member joins a running cluster, which gives it its data")
	terminationLog := fs.String("termination-log", "/dev/termination-log", "where a failure is written")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := requireFlags(map[string]string{"--key": *key, "--data-dir": *dataDir, "--out": *out, "--copy-self-to": *copyTo}); err != nil {
		return fail(*terminationLog, "restore", err)
	}
	if err := backup.CopyExecutable(*copyTo); err != nil {
		return fail(*terminationLog, "restore", fmt.Errorf("copy the restore program: %w", err))
	}
	if *clusterState == "existing" {
		fmt.Println(joiningMessage)
		return 0
	}
	if backup.HasData(*dataDir) {
		fmt.Println(hasDataMessage)
		return 0
	}
	// Only a member that restores reaches the store: the others need no identity provider that
	// answers, nor keys that work (the Secret the container's environment names must exist).
	store, err := where.open()
	if err != nil {
		return fail(*terminationLog, "restore", err)
	}
	ctx, cancel := signalContext(30 * time.Minute)
	defer cancel()
	skipped, err := backup.Fetch(ctx, store, *key, *sha, *dataDir, *out)
	if err != nil {
		return fail(*terminationLog, "restore", err)
	}
	if skipped {
		fmt.Println(hasDataMessage)
	} else {
		fmt.Printf("fetched and verified %s\n", store.URI(*key))
	}
	return 0
}

// runRestoreApply is a restoring member's second init container: it runs in the etcd image of the
// cluster's version and restores the fetched snapshot with that image's etcdutl.
func runRestoreApply(args []string) int {
	fs := flag.NewFlagSet("restore-apply", flag.ContinueOnError)
	etcdutl := fs.String("etcdutl", "/usr/local/bin/etcdutl", "etcdutl of the cluster's version")
	snapshot := fs.String("snapshot", "", "the fetched snapshot")
	dataDir := fs.String("data-dir", "", "the member's etcd data dir")
	var m backup.Member
	fs.StringVar(&m.Name, "name", "", "member name")
	fs.StringVar(&m.InitialCluster, "initial-cluster", "", "the new cluster's members")
	fs.StringVar(&m.Token, "initial-cluster-token", "", "the new cluster's token")
	fs.StringVar(&m.PeerURL, "initial-advertise-peer-urls", "", "this member's peer URL")
	clusterState := fs.String("initial-cluster-state", "new", "new: restore; existing: the member joins a running cluster, which gives it its data")
	terminationLog := fs.String("termination-log", "/dev/termination-log", "where a failure is written")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *clusterState == "existing" {
		fmt.Println(joiningMessage)
		return 0
	}
	if err := requireFlags(map[string]string{"--snapshot": *snapshot, "--data-dir": *dataDir, "--name": m.Name,
		"--initial-cluster": m.InitialCluster, "--initial-cluster-token": m.Token, "--initial-advertise-peer-urls": m.PeerURL}); err != nil {
		return fail(*terminationLog, "restore", err)
	}
	ctx, cancel := signalContext(30 * time.Minute)
	defer cancel()
	skipped, err := backup.Apply(ctx, *etcdutl, *snapshot, *dataDir, m)
	if err != nil {
		return fail(*terminationLog, "restore", err)
	}
	if skipped {
		fmt.Println(hasDataMessage)
	} else {
		fmt.Printf("restored %s into %s as member %s\n", *snapshot, *dataDir, m.Name)
	}
	return 0
}

func fail(terminationLog, what string, err error) int {
	return failTo(os.Stderr, terminationLog, what, err)
}

func failTo(stderr io.Writer, terminationLog, what string, err error) int {
	msg := what + " failed: " + err.Error()
	fmt.Fprintln(stderr, msg)
	_ = os.WriteFile(terminationLog, []byte(msg), 0o644)
	return 1
}

// runHTTPCall is the deregistration Job's HTTP variant: one request, retried with a growing pause
// until it gets a 2xx answer or runs out of tries or time.
func runHTTPCall(args []string) int { return httpCall(args, os.Stdout, os.Stderr) }

// httpCall never writes the URL beyond its scheme://host: it may come from a Secret and carry a
// token in its user info, path, query or fragment, while its output reaches the pod's logs and,
// through the termination message, an Event anyone reading the namespace sees.
func httpCall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("http-call", flag.ContinueOnError)
	urlEnv := fs.String("url-env", "DEREGISTRATION_URL", "environment variable holding the URL")
	method := fs.String("method", http.MethodPost, "request method")
	retries := fs.Int("retries", 3, "retries after a failed attempt")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound of all attempts")
	terminationLog := fs.String("termination-log", "/dev/termination-log", "where the outcome is written")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	raw := os.Getenv(*urlEnv)
	if raw == "" {
		return failTo(stderr, *terminationLog, "deregistration", fmt.Errorf("$%s is empty", *urlEnv))
	}
	target, err := parseCallURL(raw)
	if err != nil {
		return failTo(stderr, *terminationLog, "deregistration", fmt.Errorf("$%s %w", *urlEnv, err))
	}
	request := *method + " " + target.Scheme + "://" + target.Host + "/…" // the rest is left out, not absent
	ctx, cancel := signalContext(*timeout)
	defer cancel()
	var last error
	for attempt := 0; attempt <= *retries; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return failTo(stderr, *terminationLog, "deregistration", fmt.Errorf("%s: out of time after %d attempts: %v", request, attempt, last))
			case <-time.After(time.Duration(attempt) * 2 * time.Second):
			}
		}
		if last = call(ctx, *method, target); last == nil {
			msg := request + " succeeded"
			fmt.Fprintln(stdout, msg)
			_ = os.WriteFile(*terminationLog, []byte(msg), 0o644)
			return 0
		}
		fmt.Fprintf(stderr, "attempt %d: %s: %v\n", attempt+1, request, last)
	}
	return failTo(stderr, *terminationLog, "deregistration", fmt.Errorf("%s failed %d times, last: %v", request, *retries+1, last))
}

// parseCallURL accepts an absolute http(s) URL. Its errors never quote the URL.
func parseCallURL(raw string) (*neturl.URL, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		var escape neturl.EscapeError
		if errors.As(err, &escape) { // its text quotes a piece of the path or query
			return nil, errors.New("is not a valid URL: it has an invalid %-escape")
		}
		var parse *neturl.Error
		if errors.As(err, &parse) { // its text quotes the whole URL
			err = parse.Err
		}
		return nil, fmt.Errorf("is not a valid URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		if u.Scheme == "" || u.Host == "" {
			return nil, errors.New("is not an absolute http or https URL")
		}
		return nil, fmt.Errorf("must be an http or https URL, not %s://%s", u.Scheme, u.Host)
	}
	return u, nil
}

// call makes one request. Its error says what went wrong without the URL.
func call(ctx context.Context, method string, target *neturl.URL) error {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, method, target.String(), nil)
	if err != nil {
		return withoutURL(err, target)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return withoutURL(err, target)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// withoutURL keeps what went wrong and drops the URL net/http puts in its errors (only the
// password is masked there; a redirect's target is quoted whole). As a second guard, any piece of
// the URL that still shows is cut out.
func withoutURL(err error, target *neturl.URL) error {
	var withURL *neturl.Error
	for errors.As(err, &withURL) {
		err = withURL.Err
	}
	msg := err.Error()
	if errors.Is(err, context.DeadlineExceeded) {
		msg = "no answer in time (" + msg + ")"
	}
	pieces := []string{target.String(), target.User.String(), target.User.Username(), target.EscapedPath(), target.Path, target.RawQuery, target.EscapedFragment(), target.Fragment}
	if password, ok := target.User.Password(); ok {
		pieces = append(pieces, password)
	}
	for _, p := range pieces {
		if len(p) > 1 {
			msg = strings.ReplaceAll(msg, p, "…")
		}
	}
	return errors.New(msg)
}

// loadClientTLS reads a cluster's client certificate, key and CA from the files of its mounted
// Secret.
func loadClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" || certFile == "" || keyFile == "" {
		return nil, errors.New("--cacert, --cert and --key-file go together")
	}
	return certs.LoadClientConfig(caFile, certFile, keyFile)
}
