// Command imgpack packs local files into a single-layer container image tarball (docker save
// format) without a Docker engine, so the local test cluster can import images built from source.
//
//	imgpack -tag gcr.io/etcd-development/etcd:v3.7.3 -out etcd.tar \
//	    -file /path/to/etcd=/usr/local/bin/etcd [-entrypoint /usr/local/bin/etcd] [-user 65532]
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	var files fileList
	tag := flag.String("tag", "", "image reference to tag the image with")
	out := flag.String("out", "", "tarball to write")
	entrypoint := flag.String("entrypoint", "", "entrypoint (space separated)")
	user := flag.String("user", "", "user the image runs as, e.g. 65532:65532")
	flag.Var(&files, "file", "SRC=DST: a file to put into the image (repeatable)")
	flag.Parse()
	if *tag == "" || *out == "" || len(files) == 0 {
		fmt.Fprintln(os.Stderr, "usage: imgpack -tag REF -out FILE -file SRC=DST [-file ...] [-entrypoint CMD] [-user UID:GID]")
		os.Exit(2)
	}
	if err := pack(*tag, *out, files, *entrypoint, *user); err != nil {
		fmt.Fprintln(os.Stderr, "imgpack:", err)
		os.Exit(1)
	}
}

func pack(tag, out string, files []string, entrypoint, user string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("parse tag %q: %w", tag, err)
	}
	layerTar, err := layerOf(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	if entrypoint != "" {
		cfg.Config.Entrypoint = strings.Fields(entrypoint)
	}
	cfg.Config.User = user
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// layerOf builds an uncompressed layer holding the files with their parent directories.
func layerOf(files []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var dirList []string
	type entry struct{ src, dst string }
	var entries []entry
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) {
			return nil, fmt.Errorf("-file %q: want SRC=/absolute/DST", f)
		}
		entries = append(entries, entry{src, strings.TrimPrefix(dst, "/")})
		for d := path.Dir(strings.TrimPrefix(dst, "/")); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			dirList = append(dirList, d)
		}
	}
	// /tmp exists in most images and some programs expect it.
	if !dirs["tmp"] {
		dirList = append(dirList, "tmp")
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode}); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		data, err := os.ReadFile(e.src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.dst, Mode: 0o755, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
