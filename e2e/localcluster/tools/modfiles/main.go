// Command modfiles copies files of Go modules, as the Go module proxy serves them, into a folder:
//
//	modfiles -out DIR module@version path [path ...] [-- module@version path ...]
//
// It asks `go mod download` for each module's zip and reads the files from it, without extracting
// the module: a module whose go.mod names a newer Go than this machine's is still downloaded, but
// the go command then refuses to extract it.
package main

import (
	"archive/zip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
)

func main() {
	out := flag.String("out", "", "folder the files are copied into (flat, by base name)")
	flag.Parse()
	if *out == "" || flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: modfiles -out DIR module@version path [path ...] [-- module@version path ...]")
		os.Exit(2)
	}
	args := flag.Args()
	for len(args) > 0 {
		end := len(args)
		for i, a := range args {
			if a == "--" {
				end = i
				break
			}
		}
		if err := copyFiles(*out, args[0], args[1:end]); err != nil {
			fmt.Fprintln(os.Stderr, "modfiles:", err)
			os.Exit(1)
		}
		args = args[min(end+1, len(args)):]
	}
}

// copyFiles copies the given paths of module@version into dir.
func copyFiles(dir, moduleAtVersion string, paths []string) error {
	if len(paths) == 0 {
		return fmt.Errorf("%s: no file named", moduleAtVersion)
	}
	zipPath, err := download(moduleAtVersion)
	if err != nil {
		return err
	}
	r, err := zip.OpenReader(zipPath)
	if err != nil {
		return fmt.Errorf("%s: %w", moduleAtVersion, err)
	}
	defer r.Close()
	for _, p := range paths {
		f, err := r.Open(path.Join(moduleAtVersion, p)) // a module zip's entries are module@version/path
		if err != nil {
			return fmt.Errorf("%s: %s: %w", moduleAtVersion, p, err)
		}
		err = writeFile(filepath.Join(dir, path.Base(p)), f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// download returns the module's zip in the module cache, downloading (and verifying) it first.
func download(moduleAtVersion string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", moduleAtVersion)
	cmd.Stderr = os.Stderr
	stdout, _ := cmd.Output() // exits non-zero when the module needs a newer Go, with the zip there
	var info struct{ Zip, Error string }
	if err := json.Unmarshal(stdout, &info); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", moduleAtVersion, err)
	}
	if info.Zip == "" {
		return "", fmt.Errorf("go mod download %s: %s", moduleAtVersion, info.Error)
	}
	if _, err := os.Stat(info.Zip); err != nil {
		return "", errors.Join(fmt.Errorf("go mod download %s: %s", moduleAtVersion, info.Error), err)
	}
	return info.Zip, nil
}

func writeFile(name string, r io.Reader) error {
	w, err := os.Create(name)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
