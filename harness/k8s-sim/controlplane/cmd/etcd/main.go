// Command etcd is the etcd server Kubernetes v1.34 is built against (v3.6).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
