//go:build tools

// Package tools pins Prometheus's server, which the Kubernetes tests build from its Go
// module (`go build github.com/prometheus/prometheus/cmd/prometheus`): Debian's package
// is built without the Kubernetes service discovery the tests need.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
