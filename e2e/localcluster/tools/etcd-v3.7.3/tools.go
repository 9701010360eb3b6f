//go:build tools

// Package main keeps etcdctl and etcdutl in this module's requirements so `go build` can build them.
package main

import (
	_ "go.etcd.io/etcd/etcdctl/v3/ctlv3"
	_ "go.etcd.io/etcd/etcdutl/v3/etcdutl"
)
