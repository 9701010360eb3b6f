//go:build !kvcsim

package main

import "google.golang.org/grpc"

// simulatedMembers is empty: the operator talks to the real members (see simulated_members.go).
func simulatedMembers() []grpc.DialOption { return nil }
