package backup

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// stallingReader serves zeroes, then stalls until resumed, then ends.
type stallingReader struct {
	left            int64
	stalled, resume chan struct{}
	once            sync.Once
}

func (r *stallingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		r.once.Do(func() { close(r.stalled) })
		<-r.resume
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.left))
	clear(p[:n])
	r.left -= int64(n)
	return n, nil
}

// stallPut starts a Put whose stream stalls after more than one S3 part. While it stalls the store
// holds what a backup killed mid-stream leaves behind: from the store's side the two look the same.
// finish ends the stream and returns Put's error.
func stallPut(t testing.TB, store Store, key string) (finish func() error) {
	t.Helper()
	r := &stallingReader{left: partSize + 1<<20, stalled: make(chan struct{}), resume: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, _, err := store.Put(context.Background(), key, r)
		done <- err
	}()
	select {
	case <-r.stalled:
	case err := <-done:
		t.Fatalf("the Put of %s ended before it stalled: %v", key, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the Put of %s did not stall", key)
	}
	var once sync.Once
	var err error
	finish = func() error {
		once.Do(func() { close(r.resume); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = finish() })
	return finish
}

func TestDirStoreWritesAKeyAgainAfterAKilledWrite(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	store := NewDirStore(root, "backups")
	const key = "prod/kv/kv-1.db"
	killed := stallPut(t, store, key)

	if _, _, err := store.Put(ctx, key, strings.NewReader("retry")); err != nil {
		t.Fatalf("writing %s again after a killed write: %v", key, err)
	}
	if got := listKeys(t, store); !slices.Equal(got, []string{key}) {
		t.Errorf("the store lists %v, want only %s: a partial write is no object", got, key)
	}
	if err := killed(); !errors.Is(err, ErrObjectExists) {
		t.Errorf("the stalled write, resumed after another wrote the key: %v, want ErrObjectExists", err)
	}
	if got := string(read(t, store, key)); got != "retry" {
		t.Errorf("%s holds %.20q, want what the retry wrote", key, got)
	}
	entries, err := os.ReadDir(filepath.Join(root, "prod", "kv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("files left: %v", entries)
	}
}
