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

func TestPartialFilesAreRecognised(t *testing.T) {
	tests := []struct {
		name, wantObject string // "" = not a partial file
	}{
		{".kv-1.db.2999057113.part", "kv-1.db"},
		{".kv-1.db.meta.json.17.part", "kv-1.db.meta.json"},
		{"kv-1.db.part", "kv-1.db"}, // written by versions before unique names
		{"kv-1.db.meta.json.part", "kv-1.db.meta.json"},
		{"kv-1.db", ""},
		{"kv-1.db.meta.json", ""},
		{"notes.part", ""}, // not ours
		{".kv-1.db.x1.part", ""},
	}
	for _, tt := range tests {
		if object, ok := partialOf(tt.name); object != tt.wantObject || ok != (tt.wantObject != "") {
			t.Errorf("partialOf(%q) = %q, %v; want %q", tt.name, object, ok, tt.wantObject)
		}
	}
}

func TestDirStoreRemovesOnlyAbandonedPartialFiles(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	store := NewDirStore(root, "backups")
	running := stallPut(t, store, "prod/kv/kv-2.db")
	dir := filepath.Join(root, "prod", "kv")
	dayAgo := time.Now().Add(-25 * time.Hour)
	for _, name := range []string{"kv-1.db.part", "notes.part", "deeper/.kv-3.db.1.part"} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, dayAgo, dayAgo); err != nil {
			t.Fatal(err)
		}
	}
	files := func() []string {
		var names []string
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				rel, _ := filepath.Rel(dir, p)
				names = append(names, filepath.ToSlash(rel))
			}
			return nil
		})
		return names
	}

	removed, err := store.RemoveAbandoned(ctx, "prod/kv/", time.Now().Add(-24*time.Hour))
	if err != nil || !slices.Equal(removed, []string{"prod/kv/kv-1.db"}) {
		t.Errorf("removed %v (%v), want only the day-old partial kv-1.db", removed, err)
	}
	if got := files(); len(got) != 3 || !slices.Contains(got, "notes.part") || !slices.Contains(got, "deeper/.kv-3.db.1.part") {
		t.Errorf("files left: %v, want the running write's, notes.part and the one in deeper/", got)
	}

	removed, err = store.RemoveAbandoned(ctx, "prod/kv/", time.Now().Add(time.Minute))
	if err != nil || !slices.Equal(removed, []string{"prod/kv/kv-2.db"}) {
		t.Errorf("with a bound in the future, removed %v (%v), want the stalled write's kv-2.db", removed, err)
	}
	if err := running(); err == nil {
		t.Error("a write whose temporary file was removed succeeded")
	}
	if got := files(); !slices.Equal(got, []string{"deeper/.kv-3.db.1.part", "notes.part"}) {
		t.Errorf("files left: %v", got)
	}
}
