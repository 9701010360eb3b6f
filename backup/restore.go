package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// A member is restored in two init containers, because the restore must be done by the etcdutl
// of the cluster's own version (a newer one may write a schema an older etcd refuses), and the
// etcd image has no shell: Fetch runs in the operator's image (it alone gets the credentials);
// Apply runs in the etcd image, from a copy of the operator's static binary. Both do nothing once
// the member has data, so a restarted pod never restores twice.

// HasData reports whether an etcd data dir already holds a member.
func HasData(dataDir string) bool {
	_, err := os.Stat(filepath.Join(dataDir, "member"))
	return err == nil
}

// Fetch downloads the snapshot key from store to out, verifying it against wantSHA256 or, when
// that is empty, the checksum in the metadata beside it. It does nothing when dataDir has data.
func Fetch(ctx context.Context, store Store, key, wantSHA256, dataDir, out string) (skipped bool, err error) {
	if HasData(dataDir) {
		return true, nil
	}
	if wantSHA256 == "" {
		if wantSHA256, err = metadataSHA256(ctx, store, key); err != nil {
			return false, err
		}
	}
	obj, err := store.Open(ctx, key)
	if err != nil {
		return false, err
	}
	defer func() { _ = obj.Close() }()
	part := out + ".part"
	f, err := os.Create(part)
	if err != nil {
		return false, err
	}
	defer func() { _ = os.Remove(part) }()
	hash := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, hash), obj); err != nil {
		_ = f.Close()
		return false, fmt.Errorf("download %s: %w", store.URI(key), err)
	}
	if err := f.Close(); err != nil {
		return false, err
	}
	if got := hex.EncodeToString(hash.Sum(nil)); got != wantSHA256 {
		return false, fmt.Errorf("%s has sha256 %s, but %s was expected: refusing to restore it", store.URI(key), got, wantSHA256)
	}
	return false, os.Rename(part, out)
}

func metadataSHA256(ctx context.Context, store Store, key string) (string, error) {
	obj, err := store.Open(ctx, key+MetadataSuffix)
	if err == nil {
		defer func() { _ = obj.Close() }()
		var meta Result
		if err = json.NewDecoder(obj).Decode(&meta); err == nil && meta.SHA256 != "" {
			return meta.SHA256, nil
		}
	}
	return "", fmt.Errorf("no sha256 to verify %s against: spec.restore.sha256 is empty and its metadata %s cannot be read (%v)",
		store.URI(key), store.URI(key+MetadataSuffix), err)
}

// Member is how a restored member joins its new cluster; the same values etcd itself starts with.
type Member struct {
	Name, InitialCluster, Token, PeerURL string
}

// Apply restores snapshot into dataDir with etcdutl, unless dataDir already has data. It restores
// into a temporary directory and renames it into place, so a member never starts on a half
// restored data dir.
func Apply(ctx context.Context, etcdutl, snapshot, dataDir string, m Member) (skipped bool, err error) {
	if HasData(dataDir) {
		return true, nil
	}
	if _, err := os.Stat(snapshot); err != nil {
		return false, fmt.Errorf("no snapshot to restore: %w", err)
	}
	tmp := dataDir + ".restoring"
	if err := os.RemoveAll(tmp); err != nil {
		return false, err
	}
	cmd := exec.CommandContext(ctx, etcdutl, "snapshot", "restore", snapshot,
		"--name", m.Name, "--initial-cluster", m.InitialCluster, "--initial-cluster-token", m.Token,
		"--initial-advertise-peer-urls", m.PeerURL, "--data-dir", tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return false, fmt.Errorf("etcdutl snapshot restore: %v: %s", err, out)
	}
	if err := os.RemoveAll(dataDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	if err := os.Rename(tmp, dataDir); err != nil {
		return false, err
	}
	return false, os.Remove(snapshot)
}

// CopyExecutable copies the running program to dst (into an emptyDir shared with the etcd image).
func CopyExecutable(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst+".tmp", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}
