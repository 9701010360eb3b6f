//go:build kvcsim

package main

import (
	"fmt"
	"os"

	"google.golang.org/grpc"

	"github.com/kvcluster/kvcluster-operator/controllers/members/membersim"
)

// simulatedMembers routes every etcd connection to the simulated members at
// $KVC_SIMULATED_MEMBERS (host:port). Only the fleet benchmark's operator is built with the kvcsim
// tag: its pods run on simulated nodes, where no etcd runs.
func simulatedMembers() []grpc.DialOption {
	addr := os.Getenv("KVC_SIMULATED_MEMBERS")
	if addr == "" {
		fmt.Fprintln(os.Stderr, "built with the kvcsim tag: KVC_SIMULATED_MEMBERS must name the simulated members' address")
		os.Exit(2)
	}
	return []grpc.DialOption{membersim.DialOption(addr)}
}
