// Command pause is the pod sandbox's placeholder process for the local test cluster, which cannot
// pull registry.k8s.io/pause: it waits until it is told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
