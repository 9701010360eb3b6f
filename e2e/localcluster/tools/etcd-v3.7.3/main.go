// Command etcd is the unmodified etcd server: the upstream module has replace directives, so it
// cannot be built with `go install`; this wrapper module pins the release instead.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
