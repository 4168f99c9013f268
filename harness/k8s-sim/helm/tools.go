//go:build tools

// Package tools pins Helm's command line, which `make validate-chart` and the chart
// test (harness/tests/chart.rs) build from its Go module (`go build
// helm.sh/helm/v3/cmd/helm`) to lint and render manifests/chart/gpushare-bench.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
