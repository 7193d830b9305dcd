// Command pause holds a pod's namespaces open until the container runtime stops it.
//
// It is the pod's first process: it waits for SIGTERM or SIGINT and exits 0. The pod's containers
// are not its children (shareProcessNamespace is off for sandbox pods), so it reaps nothing.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
