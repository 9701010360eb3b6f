package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// S3 is where a backup goes: an object in a bucket of an S3-compatible store.
type S3 struct {
	Endpoint  string // host[:port], no scheme
	Bucket    string
	Key       string // the snapshot object; its metadata goes to Key + MetadataSuffix
	Region    string
	Insecure  bool // plain HTTP, for stores inside the cluster
	AccessKey string
	SecretKey string
}

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
	// Pruned are the older snapshots the retention deleted after this one was verified.
	Pruned []string `json:"pruned,omitempty"`
}

// ErrObjectExists means the destination already holds an object: a backup never overwrites one.
var ErrObjectExists = errors.New("the destination object already exists; a backup never overwrites an object")

// partSize bounds the memory of an upload whatever the database size: the snapshot is streamed
// in parts of this size, and only one part is held at a time.
const partSize = 8 << 20

// Take streams a snapshot of the healthiest member among endpoints to dst, hashing it on the way,
// then reads the object back to verify it, writes its metadata beside it, and only then prunes
// older snapshots as the retention says.
func Take(ctx context.Context, endpoints []string, dst S3, retention Retention, now func() time.Time) (Result, error) {
	res := Result{StartTime: now().UTC(), Location: fmt.Sprintf("s3://%s/%s", dst.Bucket, dst.Key)}
	member, err := pickMember(ctx, endpoints)
	if err != nil {
		return res, err
	}
	res.Member, res.Revision = member.endpoint, member.revision

	store, err := minio.New(dst.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(dst.AccessKey, dst.SecretKey, ""), Secure: !dst.Insecure,
		Region: dst.Region, BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return res, fmt.Errorf("S3 endpoint %q: %w", dst.Endpoint, err)
	}
	core := minio.Core{Client: store}
	if err := refuseExisting(ctx, store, dst.Bucket, dst.Key); err != nil {
		return res, err
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{member.endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
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

	size, sum, err := upload(ctx, core, dst.Bucket, dst.Key, snap.Snapshot)
	if err != nil {
		return res, err
	}
	res.Size, res.SHA256 = size, sum

	if err := verify(ctx, store, dst.Bucket, dst.Key, size, sum); err != nil {
		return res, err
	}
	res.CompletionTime = now().UTC()
	meta, _ := json.MarshalIndent(res, "", "  ")
	opts := minio.PutObjectOptions{ContentType: "application/json"}
	opts.SetMatchETagExcept("*")
	if _, err := store.PutObject(ctx, dst.Bucket, dst.Key+MetadataSuffix, bytes.NewReader(meta), int64(len(meta)), opts); err != nil {
		return res, fmt.Errorf("write metadata %s%s: %w", dst.Key, MetadataSuffix, describe(err))
	}
	res.Pruned, err = Prune(ctx, store, dst.Bucket, dst.Key, retention, now())
	if err != nil {
		return res, fmt.Errorf("the backup %s succeeded, but pruning old ones failed: %w", res.Location, err)
	}
	return res, nil
}

type memberChoice struct {
	endpoint string
	revision int64
}

// pickMember chooses the member to snapshot: a healthy one with the highest revision, a follower
// rather than the leader when they tie, so the leader is spared the extra load.
func pickMember(ctx context.Context, endpoints []string) (memberChoice, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return memberChoice{}, fmt.Errorf("connect to etcd (%s): %w", strings.Join(endpoints, ","), err)
	}
	defer func() { _ = cli.Close() }()
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
	if best.endpoint == "" {
		return best, fmt.Errorf("no etcd member answered, so there is nothing to back up from: %s", strings.Join(errs, "; "))
	}
	return best, nil
}

func refuseExisting(ctx context.Context, store *minio.Client, bucket, key string) error {
	_, err := store.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
	switch {
	case err == nil:
		return fmt.Errorf("s3://%s/%s: %w", bucket, key, ErrObjectExists)
	case minio.ToErrorResponse(err).Code == "NoSuchKey" || minio.ToErrorResponse(err).StatusCode == http.StatusNotFound:
		if minio.ToErrorResponse(err).Code == "NoSuchBucket" {
			return fmt.Errorf("bucket %q does not exist on %s; create it first", bucket, store.EndpointURL().Host)
		}
		return nil
	default:
		return fmt.Errorf("check s3://%s/%s: %w", bucket, key, describe(err))
	}
}

// upload streams r to a multipart upload, one part in memory at a time, and completes it only if
// the object still does not exist (a plain multipart PutObject would silently overwrite).
func upload(ctx context.Context, core minio.Core, bucket, key string, r io.Reader) (int64, string, error) {
	id, err := core.NewMultipartUpload(ctx, bucket, key, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return 0, "", fmt.Errorf("start upload of s3://%s/%s: %w", bucket, key, describe(err))
	}
	abort := func(cause error) (int64, string, error) {
		_ = core.AbortMultipartUpload(context.WithoutCancel(ctx), bucket, key, id)
		return 0, "", cause
	}
	hash := sha256.New()
	buf := make([]byte, partSize)
	var parts []minio.CompletePart
	var size int64
	for part := 1; ; part++ {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			hash.Write(buf[:n])
			p, err := core.PutObjectPart(ctx, bucket, key, id, part, bytes.NewReader(buf[:n]), int64(n), minio.PutObjectPartOptions{})
			if err != nil {
				return abort(fmt.Errorf("upload part %d of s3://%s/%s: %w", part, bucket, key, describe(err)))
			}
			parts = append(parts, minio.CompletePart{PartNumber: part, ETag: p.ETag})
			size += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return abort(fmt.Errorf("read the snapshot stream: %w", rerr))
		}
	}
	if size == 0 {
		return abort(errors.New("etcd sent an empty snapshot"))
	}
	opts := minio.PutObjectOptions{}
	opts.SetMatchETagExcept("*")
	if _, err := core.CompleteMultipartUpload(ctx, bucket, key, id, parts, opts); err != nil {
		if minio.ToErrorResponse(err).StatusCode == http.StatusPreconditionFailed {
			return abort(fmt.Errorf("s3://%s/%s: %w (it appeared during the upload)", bucket, key, ErrObjectExists))
		}
		return abort(fmt.Errorf("complete upload of s3://%s/%s: %w", bucket, key, describe(err)))
	}
	return size, hex.EncodeToString(hash.Sum(nil)), nil
}

// verify reads the object back and checks its size and sha256 against what was sent.
func verify(ctx context.Context, store *minio.Client, bucket, key string, size int64, sum string) error {
	obj, err := store.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return fmt.Errorf("read back s3://%s/%s: %w", bucket, key, describe(err))
	}
	defer func() { _ = obj.Close() }()
	hash := sha256.New()
	n, err := io.Copy(hash, obj)
	if err != nil {
		return fmt.Errorf("read back s3://%s/%s: %w", bucket, key, describe(err))
	}
	if got := hex.EncodeToString(hash.Sum(nil)); n != size || got != sum {
		return fmt.Errorf("s3://%s/%s does not match what was uploaded: %d bytes sha256 %s, sent %d bytes sha256 %s", bucket, key, n, got, size, sum)
	}
	return nil
}

// describe turns an S3 error into a sentence a person can act on.
func describe(err error) error {
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied":
		return fmt.Errorf("the store refused the credentials (%s): check the Secret's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: %w", resp.Code, err)
	case "NoSuchBucket":
		return fmt.Errorf("bucket %q does not exist; create it first: %w", resp.BucketName, err)
	}
	return err
}
