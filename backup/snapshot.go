package backup

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// MetadataSuffix names the metadata object written beside each snapshot.
const MetadataSuffix = ".meta.json"

// Result describes a finished backup. The backup Job prints it as its termination message, which
// is how the operator learns it without ever holding the store's credentials.
type Result struct {
	Location       string    `json:"location"`
	Size           int64     `json:"size"`
	SHA256         string    `json:"sha256"`
	Revision       int64     `json:"revision"`
	EtcdVersion    string    `json:"etcdVersion"`
	Member         string    `json:"member"`
	StartTime      time.Time `json:"startTime"`
	CompletionTime time.Time `json:"completionTime"`
	// Pruned are the older snapshots the retention deleted after this one was verified; in a
	// Report, maybe only the first PrunedCount of them.
	Pruned      []string `json:"pruned,omitempty"`
	PrunedCount int      `json:"prunedCount,omitempty"`
	// RemovedPartial are the objects whose partial writes, left by killed backups, were removed;
	// in a Report, maybe only the first RemovedPartialCount of them.
	RemovedPartial      []string `json:"removedPartial,omitempty"`
	RemovedPartialCount int      `json:"removedPartialCount,omitempty"`
	// Warnings are problems that did not stop the backup.
	Warnings []string `json:"warnings,omitempty"`
}

// ErrObjectExists means the destination already holds an object: a backup never overwrites one.
var ErrObjectExists = errors.New("the destination object already exists; a backup never overwrites an object")

// StoppedError is the error of a backup whose context ended (it ran out of time, or was told to
// stop): Doing says what it was doing then, e.g. "verifying s3://bucket/key".
type StoppedError struct {
	Doing string
	Err   error
}

func (e *StoppedError) Error() string { return "stopped while " + e.Doing + ": " + e.Err.Error() }
func (e *StoppedError) Unwrap() error { return e.Err }

// StopTimeout bounds what a backup still does once its context has ended: aborting its upload, so
// that it can report why it stopped. A Job should leave at least this much between the program's
// --timeout and its activeDeadlineSeconds, and as terminationGracePeriodSeconds.
const StopTimeout = 10 * time.Second

// Etcd is how a backup reaches the members: their client URLs and, for a cluster with TLS, the
// client certificate and CA (nil: plaintext).
type Etcd struct {
	Endpoints []string
	TLS       *tls.Config
}

func (e Etcd) client(endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: e.TLS, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
}

// Take streams a snapshot of the healthiest member among etcd's endpoints to key in store, hashing it on
// the way, then reads the object back to verify it (deleting it if it differs), writes its
// metadata beside it, and only then prunes older snapshots as the retention says. When ctx ends
// first, the error is a *StoppedError.
func Take(ctx context.Context, etcd Etcd, store Store, key string, retention Retention, now func() time.Time) (res Result, err error) {
	res = Result{StartTime: now().UTC(), Location: store.URI(key)}
	doing := "connecting to etcd at " + strings.Join(etcd.Endpoints, ",")
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = &StoppedError{Doing: doing, Err: err}
		}
	}()
	member, err := pickMember(ctx, etcd)
	if err != nil {
		return res, err
	}
	res.Member, res.Revision = member.endpoint, member.revision

	doing = "checking " + store.URI(key)
	if exists, err := store.Exists(ctx, key); err != nil {
		return res, err
	} else if exists {
		return res, fmt.Errorf("%s: %w", store.URI(key), ErrObjectExists)
	}
	// Before the snapshot, so that a volume filled by killed backups gets room again. A store that
	// does not allow it (e.g. no permission to list uploads) still takes backups.
	dir := dirOf(key)
	doing = "removing what killed backups left in " + store.URI(dir)
	if res.RemovedPartial, err = store.RemoveAbandoned(ctx, dir, now().Add(-MaxRunTime)); err != nil {
		if ctx.Err() != nil {
			return res, err
		}
		res.Warnings = append(res.Warnings, fmt.Sprintf("could not remove what killed backups left in %s: %v", store.URI(dir), err))
	}

	doing = "starting a snapshot on member " + member.endpoint
	cli, err := etcd.client(member.endpoint)
	if err != nil {
		return res, fmt.Errorf("connect to etcd member %s: %w", member.endpoint, err)
	}
	defer func() { _ = cli.Close() }()
	snap, err := cli.SnapshotWithVersion(ctx)
	if err != nil {
		return res, fmt.Errorf("start a snapshot on %s: %w", member.endpoint, err)
	}
	defer func() { _ = snap.Snapshot.Close() }()
	res.EtcdVersion = snap.Version

	doing = "streaming the snapshot of member " + member.endpoint + " to " + store.URI(key)
	if res.Size, res.SHA256, err = store.Put(ctx, key, snap.Snapshot); err != nil {
		return res, err
	}
	doing = "verifying " + store.URI(key)
	if err := verify(ctx, store, key, res.Size, res.SHA256); errors.Is(err, errDiffers) {
		// Deleting is safe: Put never replaces an object, so what is at key is what this backup
		// has just written, nobody else's. Kept, it could only mislead whoever restores.
		if rerr := store.Remove(ctx, key); rerr != nil {
			return res, fmt.Errorf("verification failed: %w; deleting it failed too (%v): having no metadata, it is never restored from nor counted as a backup", err, rerr)
		}
		return res, fmt.Errorf("verification failed: %w; it was deleted", err)
	} else if err != nil {
		return res, err
	}
	res.CompletionTime = now().UTC()
	doing = "writing the metadata " + store.URI(key+MetadataSuffix)
	meta := res
	meta.RemovedPartial, meta.Warnings = nil, nil // they are about this run, not the snapshot
	metaJSON, _ := json.MarshalIndent(meta, "", "  ")
	if err := store.PutSmall(ctx, key+MetadataSuffix, metaJSON); err != nil {
		return res, fmt.Errorf("write metadata: %w", err)
	}
	doing = "pruning old snapshots in " + store.URI(dir)
	if res.Pruned, err = Prune(ctx, store, key, retention, now()); err != nil {
		return res, fmt.Errorf("the backup %s succeeded, but pruning old ones failed: %w", res.Location, err)
	}
	return res, nil
}

// dirOf is the directory of a key, as Store.List takes it: "" or ending in "/".
func dirOf(key string) string {
	if dir := path.Dir(key); dir != "." {
		return dir + "/"
	}
	return ""
}

type memberChoice struct {
	endpoint string
	revision int64
}

// pickMember chooses the member to snapshot: a healthy one with the highest revision, a follower
// rather than the leader when they tie, so the leader is spared the extra load. While no member
// answers it keeps asking, every memberRetryInterval, until ctx ends: a new pod may be refused
// for a moment, until a NetworkPolicy engine has seen its address.
func pickMember(ctx context.Context, etcd Etcd) (memberChoice, error) {
	endpoints := etcd.Endpoints
	cli, err := etcd.client(endpoints...)
	if err != nil {
		return memberChoice{}, fmt.Errorf("connect to etcd (%s): %w", strings.Join(endpoints, ","), err)
	}
	defer func() { _ = cli.Close() }()
	for {
		best, errs := askMembers(ctx, cli, endpoints)
		if best.endpoint != "" {
			return best, nil
		}
		select {
		case <-ctx.Done():
			return best, fmt.Errorf("no etcd member answered, so there is nothing to back up from: %s", strings.Join(errs, "; "))
		case <-time.After(memberRetryInterval):
		}
	}
}

// memberRetryInterval is how long a backup waits before asking the members again when none answered.
const memberRetryInterval = time.Second

// askMembers asks every member for its status once, and returns the best one to snapshot (none
// when no member answered) and why the others did not answer.
func askMembers(ctx context.Context, cli *clientv3.Client, endpoints []string) (memberChoice, []string) {
	var best memberChoice
	bestIsLeader := true
	var errs []string
	for _, ep := range endpoints {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", ep, err))
			continue
		}
		isLeader := st.Leader == st.Header.MemberId
		rev := st.Header.Revision
		if best.endpoint == "" || rev > best.revision || (rev == best.revision && bestIsLeader && !isLeader) {
			best, bestIsLeader = memberChoice{endpoint: ep, revision: rev}, isLeader
		}
	}
	return best, errs
}

// errDiffers is a read-back that differs from what was written (not one that failed).
var errDiffers = errors.New("does not match what was written")

// verify reads the object back and checks its size and sha256 against what was sent.
func verify(ctx context.Context, store Store, key string, size int64, sum string) error {
	obj, err := store.Open(ctx, key)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	defer func() { _ = obj.Close() }()
	hash := sha256.New()
	n, err := io.Copy(hash, obj)
	if err != nil {
		return fmt.Errorf("read back %s: %w", store.URI(key), err)
	}
	if got := hex.EncodeToString(hash.Sum(nil)); n != size || got != sum {
		return fmt.Errorf("%s %w: %d bytes sha256 %s read back, %d bytes sha256 %s sent", store.URI(key), errDiffers, n, got, size, sum)
	}
	return nil
}

// MaxReportBytes is how much of a container's termination message the kubelet keeps.
const MaxReportBytes = 4096

// Report is the result as the backup Job's termination message, which the operator reads: its
// JSON, made to fit MaxReportBytes (cut there, it would no longer parse, and the operator could
// not record where the backup went). Long lists of pruned and removed objects keep their counts
// and as many names as fit; long warnings are shortened. The Job's log has the whole result.
func (r Result) Report() []byte {
	out, _ := json.Marshal(r)
	if len(out) <= MaxReportBytes {
		return out
	}
	r.PrunedCount, r.RemovedPartialCount = len(r.Pruned), len(r.RemovedPartial)
	warnings := make([]string, len(r.Warnings))
	for i, w := range r.Warnings {
		if len(w) > 300 {
			w = strings.ToValidUTF8(w[:300], "") + "…" // not half a character
		}
		warnings[i] = w
	}
	r.Warnings = warnings
	fits := func(r Result) bool { b, _ := json.Marshal(r); return len(b) <= MaxReportBytes }
	// The most names of each list that fit (a search: a list may have thousands), then warnings.
	for _, list := range []*[]string{&r.Pruned, &r.RemovedPartial, &r.Warnings} {
		all := *list
		n := sort.Search(len(all)+1, func(n int) bool { *list = all[:n]; return !fits(r) }) - 1
		*list = all[:max(n, 0)]
		if n >= 0 {
			break // what is left fits
		}
	}
	if len(r.Warnings) < len(warnings) {
		r.Warnings = append(slices.Clip(r.Warnings), fmt.Sprintf("and %d more warnings: see the Job's log", len(warnings)-len(r.Warnings)))
		if !fits(r) {
			r.Warnings = r.Warnings[:len(r.Warnings)-1]
		}
	}
	out, _ = json.Marshal(r)
	return out
}
