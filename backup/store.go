package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Store is where backups are kept: a bucket, or a directory on a mounted PersistentVolumeClaim.
// Every write refuses to replace an existing object.
type Store interface {
	// URI names an object for people and status, e.g. s3://bucket/key or pvc://claim/key.
	URI(key string) string
	// Exists reports whether key exists (and fails clearly when the store itself is unusable).
	Exists(ctx context.Context, key string) (bool, error)
	// Put streams r to a new object, returning its size and sha256.
	Put(ctx context.Context, key string, r io.Reader) (int64, string, error)
	// PutSmall writes a small new object in one piece.
	PutSmall(ctx context.Context, key string, data []byte) error
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// List returns the objects directly in dir (a key prefix ending in "/", or "").
	List(ctx context.Context, dir string) ([]StoredObject, error)
	Remove(ctx context.Context, key string) error
	// RemoveAbandoned removes what interrupted writes left directly in dir (a temporary file, an
	// incomplete multipart upload) if they began before startedBefore, and returns the keys they
	// were writing. A write begun later may still be running.
	RemoveAbandoned(ctx context.Context, dir string, startedBefore time.Time) ([]string, error)
}

// StoredObject is one object of a Store.
type StoredObject struct {
	Key      string
	Modified time.Time
}

// S3 is an S3-compatible bucket.
type S3 struct {
	Endpoint  string // host[:port], no scheme
	Bucket    string
	Region    string
	Insecure  bool // plain HTTP, for stores inside the cluster
	AccessKey string
	SecretKey string
	// WorkloadIdentity: no static keys; short-lived credentials from the pod's cloud identity
	// (workloadCredentials).
	WorkloadIdentity bool
}

type s3Store struct {
	cfg    S3
	client *minio.Client
}

// NewS3Store connects to a bucket (lazily: errors show on first use), except that credentials
// from a workload identity are fetched at once (within identityTimeout), so that a pod without
// one fails saying so.
func NewS3Store(cfg S3) (Store, error) {
	creds := credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	if cfg.WorkloadIdentity {
		creds = workloadCredentials(cfg.Region)
		ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
		defer cancel()
		if _, err := creds.GetWithContext(&credentials.CredContext{Client: http.DefaultClient, Context: ctx}); err != nil {
			return nil, fmt.Errorf("workloadIdentity: no credentials from the pod's cloud identity (is spec.pods.serviceAccountName bound to a role that may use the bucket?): %w", err)
		}
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds: creds, Secure: !cfg.Insecure,
		Region: cfg.Region, BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("S3 endpoint %q: %w", cfg.Endpoint, err)
	}
	return &s3Store{cfg: cfg, client: c}, nil
}

// identityTimeout bounds fetching a workload identity's first credentials.
const identityTimeout = time.Minute

// workloadCredentials are those the AWS SDKs' default chain takes from a pod's cloud identity,
// static keys left out: a web identity token (EKS IRSA: AWS_WEB_IDENTITY_TOKEN_FILE and
// AWS_ROLE_ARN), exchanged at AWS_ENDPOINT_URL_STS (the SDKs' override; an S3-compatible store's
// own STS) or else the STS of AWS_REGION, else of the bucket's region; EKS Pod Identity
// (AWS_CONTAINER_CREDENTIALS_FULL_URI and its token file); an ECS task role; else the node's
// instance role. They are fetched again before they expire.
func workloadCredentials(region string) *credentials.Credentials {
	iam := &credentials.IAM{Region: region}
	if os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "" {
		// The endpoint would also replace the instance metadata's: only for the token's exchange.
		iam.Endpoint = os.Getenv("AWS_ENDPOINT_URL_STS")
	}
	return credentials.New(iam)
}

func (s *s3Store) URI(key string) string { return fmt.Sprintf("s3://%s/%s", s.cfg.Bucket, key) }

func (s *s3Store) Exists(ctx context.Context, key string) (bool, error) {
	_, err := s.client.StatObject(ctx, s.cfg.Bucket, key, minio.StatObjectOptions{})
	resp := minio.ToErrorResponse(err)
	switch {
	case err == nil:
		return true, nil
	case resp.Code == "NoSuchBucket":
		return false, fmt.Errorf("bucket %q does not exist on %s; create it first", s.cfg.Bucket, s.cfg.Endpoint)
	case resp.Code == "NoSuchKey" || resp.StatusCode == http.StatusNotFound:
		return false, nil
	}
	return false, fmt.Errorf("check %s: %w", s.URI(key), s.describe(err))
}

// partSize bounds the memory of an upload whatever the database size: the snapshot is streamed
// in parts of this size, and only one part is held at a time.
const partSize = 8 << 20

// Put streams r into a multipart upload, one part in memory at a time, and completes it only if
// the object still does not exist (minio's plain multipart PutObject would silently overwrite).
func (s *s3Store) Put(ctx context.Context, key string, r io.Reader) (int64, string, error) {
	core := minio.Core{Client: s.client}
	bucket := s.cfg.Bucket
	id, err := core.NewMultipartUpload(ctx, bucket, key, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return 0, "", fmt.Errorf("start upload of %s: %w", s.URI(key), s.describe(err))
	}
	abort := func(cause error) (int64, string, error) {
		// Also when ctx has ended, but bounded: the store may be what stalled, and the backup must
		// still report. An upload left behind is removed by a later backup.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopTimeout)
		defer cancel()
		_ = core.AbortMultipartUpload(actx, bucket, key, id)
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
				return abort(fmt.Errorf("upload part %d of %s: %w", part, s.URI(key), s.describe(err)))
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
			return abort(fmt.Errorf("%s: %w (it appeared during the upload)", s.URI(key), ErrObjectExists))
		}
		return abort(fmt.Errorf("complete upload of %s: %w", s.URI(key), s.describe(err)))
	}
	return size, hex.EncodeToString(hash.Sum(nil)), nil
}

func (s *s3Store) PutSmall(ctx context.Context, key string, data []byte) error {
	opts := minio.PutObjectOptions{ContentType: "application/json"}
	opts.SetMatchETagExcept("*")
	if _, err := s.client.PutObject(ctx, s.cfg.Bucket, key, bytes.NewReader(data), int64(len(data)), opts); err != nil {
		return fmt.Errorf("write %s: %w", s.URI(key), s.describe(err))
	}
	return nil
}

func (s *s3Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	obj, err := s.client.GetObject(ctx, s.cfg.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", s.URI(key), s.describe(err))
	}
	if _, err := obj.Stat(); err != nil {
		_ = obj.Close()
		return nil, fmt.Errorf("get %s: %w", s.URI(key), s.describe(err))
	}
	return obj, nil
}

func (s *s3Store) List(ctx context.Context, dir string) ([]StoredObject, error) {
	var out []StoredObject
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: dir}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list %s: %w", s.URI(dir), s.describe(obj.Err))
		}
		out = append(out, StoredObject{Key: obj.Key, Modified: obj.LastModified})
	}
	return out, nil
}

func (s *s3Store) Remove(ctx context.Context, key string) error {
	err := s.client.RemoveObject(ctx, s.cfg.Bucket, key, minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code != "NoSuchKey" {
		return fmt.Errorf("delete %s: %w", s.URI(key), s.describe(err))
	}
	return nil
}

func (s *s3Store) RemoveAbandoned(ctx context.Context, dir string, startedBefore time.Time) ([]string, error) {
	core := minio.Core{Client: s.client}
	var removed []string
	keyMarker, uploadIDMarker := "", ""
	for {
		// The delimiter keeps to dir itself: a deeper prefix may be another cluster's directory.
		page, err := core.ListMultipartUploads(ctx, s.cfg.Bucket, dir, keyMarker, uploadIDMarker, "/", 1000)
		if err != nil {
			return removed, fmt.Errorf("list incomplete uploads in %s: %w", s.URI(dir), s.describe(err))
		}
		for _, u := range page.Uploads {
			if !u.Initiated.Before(startedBefore) {
				continue
			}
			err := core.AbortMultipartUpload(ctx, s.cfg.Bucket, u.Key, u.UploadID)
			if err != nil && minio.ToErrorResponse(err).Code != "NoSuchUpload" {
				return removed, fmt.Errorf("abort the incomplete upload of %s: %w", s.URI(u.Key), s.describe(err))
			}
			removed = append(removed, u.Key)
		}
		if !page.IsTruncated || page.NextKeyMarker == "" && page.NextUploadIDMarker == "" {
			return removed, nil
		}
		keyMarker, uploadIDMarker = page.NextKeyMarker, page.NextUploadIDMarker
	}
}

// describe turns an S3 error into a sentence a person can act on.
func (s *s3Store) describe(err error) error {
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken":
		if s.cfg.WorkloadIdentity {
			return fmt.Errorf("the store refused the workload identity's credentials (%s): check that the role of spec.pods.serviceAccountName may use the bucket: %w", resp.Code, err)
		}
		return fmt.Errorf("the store refused the credentials (%s): check the Secret's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: %w", resp.Code, err)
	case "NoSuchBucket":
		return fmt.Errorf("bucket %q does not exist; create it first: %w", resp.BucketName, err)
	}
	return err
}

// dirStore keeps backups as files under a directory: a PersistentVolumeClaim mounted into the pod.
type dirStore struct {
	root, claim string
}

// NewDirStore keeps backups under root, the mount of the PersistentVolumeClaim named claim.
func NewDirStore(root, claim string) Store { return &dirStore{root: root, claim: claim} }

func (d *dirStore) URI(key string) string { return fmt.Sprintf("pvc://%s/%s", d.claim, key) }

func (d *dirStore) path(key string) string { return filepath.Join(d.root, filepath.FromSlash(key)) }

func (d *dirStore) Exists(_ context.Context, key string) (bool, error) {
	if st, err := os.Stat(d.root); err != nil || !st.IsDir() {
		return false, fmt.Errorf("the backup volume is not mounted at %s: %v", d.root, err)
	}
	_, err := os.Stat(d.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// partialName matches the temporary file of a write in progress: ".kv-1.db.123456.part" is a
// partial kv-1.db. Older versions wrote "kv-1.db.part", which is recognised too, so that what they
// left behind is cleaned up as well.
var partialName = regexp.MustCompile(`^\.(.+)\.[0-9]+\.part$|^(.+\.db(?:` + regexp.QuoteMeta(MetadataSuffix) + `)?)\.part$`)

// partialOf returns the name of the object a temporary file was to become.
func partialOf(name string) (object string, ok bool) {
	m := partialName.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	return m[1] + m[2], true
}

// write creates the file for key, never replacing an existing one. It writes through a temporary
// name unique to this attempt, so a crash never leaves a partial file under the final name, and a
// write killed midway never blocks a later one of the same key.
func (d *dirStore) write(key string, fill func(io.Writer) (int64, error)) (int64, error) {
	p := d.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return 0, err
	}
	if _, err := os.Stat(p); err == nil {
		return 0, fmt.Errorf("%s: %w", d.URI(key), ErrObjectExists)
	}
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*.part")
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", d.URI(key), err)
	}
	tmp := f.Name()
	err = f.Chmod(0o640)
	var n int64
	if err == nil {
		n, err = fill(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("write %s: %w", d.URI(key), err)
	}
	// Link, not rename: link fails if the name exists, so nothing is ever replaced.
	if err := os.Link(tmp, p); err != nil {
		_ = os.Remove(tmp)
		if errors.Is(err, fs.ErrExist) {
			return 0, fmt.Errorf("%s: %w", d.URI(key), ErrObjectExists)
		}
		return 0, fmt.Errorf("write %s: %w", d.URI(key), err)
	}
	return n, os.Remove(tmp)
}

func (d *dirStore) Put(_ context.Context, key string, r io.Reader) (int64, string, error) {
	hash := sha256.New()
	n, err := d.write(key, func(w io.Writer) (int64, error) { return io.Copy(io.MultiWriter(w, hash), r) })
	if err != nil {
		return 0, "", err
	}
	if n == 0 {
		return 0, "", errors.New("etcd sent an empty snapshot")
	}
	return n, hex.EncodeToString(hash.Sum(nil)), nil
}

func (d *dirStore) PutSmall(_ context.Context, key string, data []byte) error {
	_, err := d.write(key, func(w io.Writer) (int64, error) { n, err := w.Write(data); return int64(n), err })
	return err
}

func (d *dirStore) Open(_ context.Context, key string) (io.ReadCloser, error) {
	f, err := os.Open(d.path(key))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", d.URI(key), err)
	}
	return f, nil
}

func (d *dirStore) List(_ context.Context, dir string) ([]StoredObject, error) {
	entries, err := os.ReadDir(d.path(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []StoredObject
	for _, e := range entries {
		if _, partial := partialOf(e.Name()); partial || e.IsDir() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, StoredObject{Key: path.Join(strings.TrimSuffix(dir, "/"), e.Name()), Modified: info.ModTime()})
	}
	return out, nil
}

func (d *dirStore) Remove(_ context.Context, key string) error {
	if err := os.Remove(d.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (d *dirStore) RemoveAbandoned(_ context.Context, dir string, startedBefore time.Time) ([]string, error) {
	entries, err := os.ReadDir(d.path(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		object, partial := partialOf(e.Name())
		if !partial || e.IsDir() {
			continue
		}
		// A write in progress keeps changing its file: its modification time is never old.
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(startedBefore) {
			continue
		}
		if err := os.Remove(filepath.Join(d.path(dir), e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove the partial %s: %w", d.URI(path.Join(dir, object)), err)
		}
		removed = append(removed, path.Join(dir, object))
	}
	return removed, nil
}
