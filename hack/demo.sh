#!/usr/bin/env bash
# `make demo`: the whole fleetgate story on this machine, told as it happens.
#
#   three local control planes (cluster-a = canary, cluster-b = wave-1, cluster-c = wave-2) with a
#   simulated node each, deploy/ applied to each (`kubectl apply -k deploy/` less the agent's
#   Deployment) · a fleet repo served by `git daemon` · a throw-away signing key · one
#   `fleetgate agent` per cluster (processes of the real binary), each authenticated as the
#   `fleetgate-agent` ServiceAccount with a TokenRequest token: exactly deploy/'s RBAC, as in a spoke
#
#   rel-1 (good)  promoted fleet-wide → applied wave by wave, all success; wave-2 requires an
#                 approval (fleet.yaml `approval: required`): cluster-c waits, status pending, until
#                 `fleetgate approve rel-1 --wave wave-2` signs the approval with the approver's key
#   rel-2 (bad)   its pods crash-loop → the canary's gate fails, the canary rolls itself back to
#                 rel-1, reports failure, and writes the rollback back to Git: `main` pins the
#                 canary to rel-1 in a commit signed with its status key, whose trailers name the
#                 failed gate and its figure; wave-1 and wave-2 never apply rel-2
#   rel-3 (good)  rolls through all waves; it adds an optional field to the RedisCluster CRD
#   rollback      `fleetgate rollback --fleet --to rel-1 --push` undoes rel-3: every cluster goes
#                 back to rel-1 as a rollback (the CRD rel-3 widened is kept), reports rel-1 success
#                 again, and the demo prints how long that took from the push
#
#   forge: when Gitea is built (`make testenv` builds it, hack/gitea-binary.sh), the fleet repo is
#   served by a real Gitea: promotions are pull requests opened with `fleetgate promote --open-pr`
#   and merged through Gitea's API, Gitea's push webhook (signed) wakes the agents, and the agents
#   mirror their statuses to Gitea (release commit, PR head, write-back commit), which the demo
#   reads back from Gitea's API. Before each merge, `fleetgate plan --post` puts the CI's plan on
#   the PR (`fleetgate/plan`), and the agents, started with --plan-pull-requests, each post their
#   own plan made in their cluster (`fleetgate/plan/<cluster>`: a dry run's counts, or why they
#   would refuse); the demo prints them from Gitea's API. Without Gitea (or with DEMO_FORGE=git) `git daemon` serves it and
#   promotions are merged locally.
#
# Environment: DEMO_DIR (keep everything there; default a temp dir, removed at the end unless
# DEMO_KEEP=1), FLEETGATE_BIN / TESTENV_BIN (binaries; default target/debug), DEMO_TIMEOUT (seconds
# each step may take, default 240), DEMO_INTERVAL / DEMO_LEASE_DURATION (the agents' --interval and
# --lease-duration, default 5s each: short, so the story moves quickly), DEMO_AFTER (a command run
# with the demo's directory as its argument once the story is told, while clusters and agents still
# run; hack/agent-footprint.sh measures the agents there), DEMO_CHAOS=1 (kill -9 the canary's agent in the middle of
# applying rel-1 and again in the middle of rolling back rel-2, and start it again: the story must
# end the same), DEMO_AGENT_ENV (NAME=VALUE … for the agents only; hack/agent-order.sh collects
# their profiling counters with it). tests/e2e.rs runs this script with DEMO_CHAOS=1 and checks what it leaves behind.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FG=${FLEETGATE_BIN:-$ROOT/target/debug/fleetgate}
TESTENV=${TESTENV_BIN:-$ROOT/target/debug/fleetgate-testenv}
STEP_TIMEOUT=${DEMO_TIMEOUT:-240}
if [[ -n "${DEMO_DIR:-}" ]]; then
  DIR=$DEMO_DIR; mkdir -p "$DIR"
else
  DIR=$(mktemp -d /tmp/fg-demo.XXXXXX)
fi
CLUSTERS=(cluster-a cluster-b cluster-c)

if [[ -t 1 && -z "${NO_COLOR:-}" ]]; then B=$'\e[1m'; G=$'\e[32m'; R=$'\e[31m'; D=$'\e[2m'; N=$'\e[0m'; else B= G= R= D= N=; fi
say()  { printf '\n%s==> %s%s\n' "$B" "$*" "$N"; }
info() { printf '    %s\n' "$*"; }
ok()   { printf '    %s✔ %s%s\n' "$G" "$*" "$N"; }
bad()  { printf '    %s✘ %s%s\n' "$R" "$*" "$N"; }
die()  { bad "$*"; echo "    logs are in $DIR (agent-*.log, clusters/)"; DEMO_KEEP=1; exit 1; }

pids=()
cleanup() {
  local rc=$?
  # Gitea's files go with it: keep a copy of the fleet repo where git daemon's would be.
  if [[ -L "$DIR/git/fleet.git" ]] && [[ -n "${DEMO_KEEP:-}${DEMO_DIR:-}" ]]; then
    git clone -q --mirror "$DIR/git/fleet.git" "$DIR/git/fleet.git.copy" 2>/dev/null &&
      rm "$DIR/git/fleet.git" && mv "$DIR/git/fleet.git.copy" "$DIR/git/fleet.git" || true
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -d "$DIR/gnupg" ]] && GNUPGHOME=$DIR/gnupg gpgconf --kill all 2>/dev/null || true
  if [[ -z "${DEMO_KEEP:-}" && -z "${DEMO_DIR:-}" ]]; then rm -rf "$DIR"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    (( SECONDS - start > limit )) && die "timed out after ${limit}s waiting for $what"
    sleep 1
  done
}

[[ -x "$FG" && -x "$TESTENV" ]] || { echo "build first: cargo build --workspace --bins (make demo does)"; exit 2; }

say "Starting three local Kubernetes control planes (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
mkdir -p "$DIR/clusters"
"$TESTENV" up --clusters "$(IFS=,; echo "${CLUSTERS[*]}")" --workloads --deploy "$ROOT/deploy" --dir "$DIR/clusters" >"$DIR/clusters/up.log" 2>&1 &
pids+=($!)
wait_for "$STEP_TIMEOUT" "the clusters to start" test -f "$DIR/clusters/ready"
for c in "${CLUSTERS[@]}"; do
  ok "$c is up: kubectl --kubeconfig $DIR/clusters/$c.kubeconfig get nodes"
  info "deploy/ applied; the agent's credential: $(kubectl --kubeconfig "$DIR/clusters/$c.agent.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}' 2>/dev/null || echo '?')"
done

say "Serving a fleet repo over git:// and making a release-signing key"
mkdir -p "$DIR/git"
git init -q --bare -b main "$DIR/git/fleet.git"
GIT_PORT=$(free_port)
git daemon --reuseaddr --base-path="$DIR/git" --export-all --enable=receive-pack \
  --listen=127.0.0.1 --port="$GIT_PORT" "$DIR/git" >"$DIR/git-daemon.log" 2>&1 &
pids+=($!)
REPO_URL="git://127.0.0.1:$GIT_PORT/fleet.git"
export GNUPGHOME=$DIR/gnupg
mkdir -p -m 700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key "fleetgate demo releaser <releaser@demo.invalid>" ed25519 sign never 2>/dev/null
FPR=$(gpg --batch --with-colons --list-secret-keys 2>/dev/null | awk -F: '/^fpr/ {print $10; exit}')
gpg --batch --armor --export "$FPR" >"$DIR/trusted.asc"
# The approver's key: the agents trust it for approvals only (--approver-keys), not for releases.
gpg --batch --quiet --passphrase '' --quick-gen-key "fleetgate demo approver <approver@demo.invalid>" ed25519 sign never 2>/dev/null
APPROVER=$(gpg --batch --with-colons --list-secret-keys approver@demo.invalid 2>/dev/null | awk -F: '/^fpr/ {print $10; exit}')
gpg --batch --armor --export "$APPROVER" >"$DIR/approvers.asc"
ok "repo $REPO_URL, signing key $FPR, approver's key $APPROVER"

# A real forge when one is built: the fleet repo moves to Gitea, and $DIR/git/fleet.git points at
# Gitea's bare repo (a copy of it once the demo ends) so whoever inspects the repo afterwards
# finds it where git daemon's would be.
FORGE_FLAGS=() AGENT_FORGE_FLAGS=()
if [[ "${DEMO_FORGE:-auto}" != git ]] && "$TESTENV" gitea --check >/dev/null 2>&1; then
  "$TESTENV" gitea --dir "$DIR/gitea" >"$DIR/gitea.log" 2>&1 &
  pids+=($!)
  wait_for "$STEP_TIMEOUT" "Gitea to start" test -f "$DIR/gitea/gitea.env"
  # shellcheck disable=SC1091
  source "$DIR/gitea/gitea.env"
  printf '%s' "$GITEA_TOKEN" >"$DIR/gitea/token"
  head -c 24 /dev/urandom | base64 | tr -d "\n" >"$DIR/gitea/webhook-secret"
  rm -rf "$DIR/git/fleet.git"
  ln -s "$GITEA_REPO_PATH" "$DIR/git/fleet.git"
  REPO_URL=$GITEA_CLONE_URL ORIGIN_URL=$GITEA_PUSH_URL
  FORGE_FLAGS=(--forge-kind gitea --forge-url "$GITEA_URL" --forge-repository "$GITEA_REPOSITORY" --forge-token-file "$DIR/gitea/token")
  AGENT_FORGE_FLAGS=("${FORGE_FLAGS[@]}" --git-token-file "$DIR/gitea/token" --webhook-secret-file "$DIR/gitea/webhook-secret" --plan-pull-requests)
  ok "forge: Gitea at $GITEA_URL — the fleet repo is $REPO_URL"
else
  [[ "${DEMO_FORGE:-auto}" == gitea ]] && die "DEMO_FORGE=gitea, but Gitea is not built: run hack/gitea-binary.sh"
  info "forge: none (git daemon); build Gitea with hack/gitea-binary.sh for promotions through pull requests"
fi
gitea_api() { # gitea_api METHOD PATH [JSON]: one call to Gitea's API with the demo's token
  curl -fsS -X "$1" -H "authorization: token $GITEA_TOKEN" -H 'content-type: application/json' \
    ${3:+-d "$3"} "$GITEA_URL/api/v1$2"
}

say "fleetgate init: a fleet repo from the template"
WORK=$DIR/fleet
"$FG" init "$WORK" | sed 's/^/    /'
# The demo's gate policy: the seed's pod-restart gate and Operator availability, baked for 20s
# (no Prometheus runs here; the tests cover the metric gates against a real one).
cat >"$WORK/policies/gates.yaml" <<'YAML'
apiVersion: fleetgate.io/v1alpha1
kind: GatePolicy
metadata:
  name: redis-operator
spec:
  bakeTime: 20s
  interval: 2s
  callTimeout: 5s
  onUnknown: failAfterBake
  gates:
    - name: operator-available
      deploymentAvailable:
        names: [redis-operator]
    - name: pod-restarts
      podRestarts:
        max: 3
YAML
# wave-2 takes a release only once someone approved it for wave-2 (the signed releases carry this).
sed -i 's/^  waves: \[canary, wave-1, wave-2\]$/  waves: [canary, wave-1, {name: wave-2, approval: required}]/' "$WORK/fleet.yaml"
grep -q 'approval: required' "$WORK/fleet.yaml" || die "fleet.yaml: the template's waves line changed"
git -C "$WORK" add -A
git -C "$WORK" -c user.name=demo -c user.email=demo@demo.invalid commit -qm "Demo gate policy: 20s bake; wave-2 needs an approval"
git -C "$WORK" remote add origin "${ORIGIN_URL:-$REPO_URL}"

# Each agent's status key is generated on first start into a Secret in its cluster; registering
# its public half is what makes the other waves believe that cluster's statuses.
say "Registering each cluster's status key (fleetgate agent --print-status-key → fleetgate cluster register)"
for c in "${CLUSTERS[@]}"; do
  key=$("$FG" agent --print-status-key --repo "$REPO_URL" --cluster "$c" \
    --kubeconfig "$DIR/clusters/$c.kubeconfig" --trusted-keys "$DIR/trusted.asc")
  "$FG" cluster register "$c" --status-key "$key" --repo "$WORK" >/dev/null
  # The same keys sign the agents' write-back commits: Git checks them against this file.
  echo "$c $key" >>"$DIR/allowed_signers"
  ok "$c: $key"
done
git -C "$WORK" push -q origin main
ok "pushed main"

# render ID TAG [bad]: the Operator's manifests at image TAG; "bad" makes its pods crash-loop
# (the kwok failure stage the test clusters run reacts to the label fleetgate.io/test-fail).
render() {
  local out=$DIR/render/$1; rm -rf "$out"; mkdir -p "$out"
  cp -r "$ROOT/fleet-repo-template/operator/." "$out/"
  sed -i "s#image: registry.example.com/redis-operator:.*#image: registry.example.com/redis-operator:$2#" "$out/deployment.yaml"
  if [[ "${3:-}" == wide ]]; then
    python3 - "$out/crds/redisclusters.cache.example.com.yaml" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
# an optional spec.paused in v1alpha2 (the last version): what nearly every upgrade adds
spec = s.rindex("            spec:\n")
i = s.index("              properties:\n", spec) + len("              properties:\n")
s = s[:i] + "                paused: {type: boolean, description: Stop reconciling.}\n" + s[i:]
open(p, "w").write(s)
PY
  fi
  if [[ "${3:-}" == bad ]]; then
    python3 - "$out/deployment.yaml" <<'PY'
import sys, re
p = sys.argv[1]; s = open(p).read()
# add the failure label to the pod template's labels (the second `labels:` block in the file)
i = s.index("template:"); j = s.index("labels:", i) + len("labels:")
indent = re.match(r"\n(\s*)", s[j:]).group(1)
s = s[:j] + "\n" + indent + 'fleetgate.io/test-fail: "true"' + s[j:]
open(p, "w").write(s)
PY
  fi
  echo "$out"
}

# The release each Operator image belongs to (objects carry no per-release label: the agent's
# inventory says which release applied them), for `running`.
declare -A RELEASE_OF_IMAGE=()

release() { # release ID TAG [bad|wide] [release-create flags...]
  RELEASE_OF_IMAGE["registry.example.com/redis-operator:$2"]=$1
  local dir; dir=$(render "$1" "$2" "${3:-}")
  local -a extra=("${@:3}"); [[ "${extra[0]:-}" == bad || "${extra[0]:-}" == wide ]] && extra=("${extra[@]:1}")
  "$FG" release create "${extra[@]}" --repo "$WORK" --id "$1" --manifests "$dir" \
    --image "registry.example.com/redis-operator:$2" --chart-version "${2#v}" --crd-version v1alpha2 \
    --git-commit "$(printf '%s' "$1" | sha1sum | cut -c1-12)" --all --sign-key "$FPR" --push | sed 's/^/    /'
}

promote() { # promote ID: a PR branch, "merged" into main the way a forge would
  [[ -n "${GITEA_URL:-}" ]] && { promote_through_gitea "$1"; return; }
  "$FG" promote "$1" --fleet --repo "$WORK" --trusted-keys "$DIR/trusted.asc" | sed 's/^/    /'
  git -C "$WORK" checkout -q main
  git -C "$WORK" -c user.name=demo -c user.email=demo@demo.invalid merge -q --no-ff --no-edit "promote/$1-fleet"
  git -C "$WORK" push -q origin main
  poke
  ok "merged the promotion of $1 into main and pushed"
}

promote_through_gitea() { # promote_through_gitea ID: a real PR in Gitea, merged through its API
  "$FG" promote "$1" --fleet --repo "$WORK" --trusted-keys "$DIR/trusted.asc" --open-pr "${FORGE_FLAGS[@]}" | sed 's/^/    /'
  local pr number url
  pr=$(gitea_api GET "/repos/$GITEA_REPOSITORY/pulls?state=open" | python3 -c '
import json, sys
p = [p for p in json.load(sys.stdin) if p["head"]["ref"] == sys.argv[1]][0]
print(p["number"], p["html_url"], p["head"]["sha"])' "promote/$1-fleet")
  read -r number url PR_HEAD <<<"$pr"
  plans_on_pr "promote/$1-fleet" "$number"
  # Gitea checks a new PR's mergeability in the background; it refuses a merge until it has.
  wait_for 30 "Gitea to merge PR #$number" gitea_api POST "/repos/$GITEA_REPOSITORY/pulls/$number/merge" '{"Do":"merge"}'
  git -C "$WORK" checkout -q main
  git -C "$WORK" pull -q --ff-only origin main
  ok "forge: Gitea — PR #$number $url merged through Gitea's API; its push webhook wakes the agents"
}

declare -A AGENT_PORT=()
plans_on_pr() { # plans_on_pr BRANCH NUMBER: the CI's plan posted on the PR, then each running agent's own
  info "fleetgate plan --post (what CI runs on the PR; the verdict is commit status fleetgate/plan):"
  { "$FG" plan --repo "$WORK" --base main --head "$1" --trusted-keys "$DIR/trusted.asc" --post "${FORGE_FLAGS[@]}" 2>&1 || true; } |
    sed 's/^/      /'
  (( ${#AGENT_PORT[@]} )) || return 0
  local head; head=$(git -C "$WORK" rev-parse "$1")
  plans() { # the plan statuses on the PR's head, as Gitea's API lists them; fails until every cluster's is there
    gitea_api GET "/repos/$GITEA_REPOSITORY/commits/$head/status" | python3 -c '
import json, sys
found = {s["context"]: s for s in json.load(sys.stdin)["statuses"]}
want = ["fleetgate/plan"] + ["fleetgate/plan/" + c for c in sys.argv[1:]]
for w in want:
    if w in found:
        print("%-26s %-8s %s" % (w, found[w]["status"], found[w]["description"]))
sys.exit(0 if all(w in found for w in want) else 1)' "${CLUSTERS[@]}"
  }
  # Each agent plans open PRs after a pass, listing them at most every 30 s.
  local start=$SECONDS
  until plans >/dev/null 2>&1 || (( SECONDS - start > 120 )); do sleep 2; done
  info "forge: Gitea shows the plans on PR #$2 (head ${head:0:10}) before anyone merges it:"
  plans | sed 's/^/      /' || info "  (not every agent had posted its plan within 120 s)"
}
poke() { # what a forge's push webhook does: wake every agent now instead of at its next poll
  for c in "${CLUSTERS[@]}"; do
    [[ -n "${AGENT_PORT[$c]:-}" ]] && curl -fsS -X POST "http://127.0.0.1:${AGENT_PORT[$c]}/hooks/git" >/dev/null 2>&1 || true
  done
}

cell() { # cell CLUSTER RELEASE FIELD → that cluster's latest state (or description) for the release
  # (`fleetgate status REL` exits 1 once a cluster reports failure; the JSON is what matters here)
  { "$FG" status "$2" --repo "$REPO_URL" -o json 2>/dev/null || true; } | python3 -c '
import json, sys
cluster, release, field = sys.argv[1:4]
for wave in json.load(sys.stdin).get("waves", []):
    for row in wave["clusters"]:
        if row["name"] == cluster:
            for c in row["cells"]:
                if c["release"] == release:
                    v = c.get("state") if field == "state" else (c.get("status") or {}).get(field)
                    print(v or "none"); sys.exit()
print("none")' "$1" "$2" "$3" || echo none
}
state_of() { cell "$1" "$2" state; }
reports() { [[ "$(state_of "$1" "$2")" == "$3" ]]; } # reports CLUSTER RELEASE STATE

running() { # running CLUSTER → the release whose image the Operator Deployment in that cluster runs
  local image
  image=$(kubectl --kubeconfig "$DIR/clusters/$1.kubeconfig" -n redis-system get deployment redis-operator \
    -o jsonpath='{.spec.template.spec.containers[0].image}' 2>/dev/null || true)
  [[ -z "$image" ]] || echo "${RELEASE_OF_IMAGE[$image]:-$image}"
}

runs() { # runs CLUSTER RELEASE: whether the cluster's Operator runs that release
  [[ "$(running "$1")" == "$2" ]]
}

follow() { # follow RELEASE EXPECT...: print each cluster's state changes until all reach EXPECT
  local rel=$1; shift
  local -a expect=("$@")
  declare -A last=()
  local start=$SECONDS
  while :; do
    local done=1 i=0
    for c in "${CLUSTERS[@]}"; do
      local s; s=$(state_of "$c" "$rel")
      if [[ "${last[$c]:-}" != "$s" ]]; then
        last[$c]=$s
        [[ "$s" != none ]] && info "$(printf '%3ss  %-10s %-8s %s' $((SECONDS - start)) "$c" "$s" "$rel")"
      fi
      [[ "$s" == "${expect[$i]}" ]] || done=0
      i=$((i + 1))
    done
    (( done )) && return 0
    (( SECONDS - start > STEP_TIMEOUT )) && die "timed out: $rel did not reach ${expect[*]}"
    sleep 1
  done
}

say "Cutting rel-1 (good) and promoting it fleet-wide"
release rel-1 v1.0.0
promote rel-1

start_agent() { # start_agent CLUSTER: one agent process; its pid in $DIR/agent-CLUSTER.pid
  local c=$1
  # shellcheck disable=SC2086 # DEMO_AGENT_ENV is a list of NAME=VALUE
  env ${DEMO_AGENT_ENV:-} "$FG" agent --repo "$REPO_URL" --cluster "$c" --fleet redis-fleet --kubeconfig "$DIR/clusters/$c.agent.kubeconfig" \
    --trusted-keys "$DIR/trusted.asc" --approver-keys "$DIR/approvers.asc" --state-dir "$DIR/agents/$c" --interval "${DEMO_INTERVAL:-5s}" --lease-duration "${DEMO_LEASE_DURATION:-5s}" \
    --listen "127.0.0.1:${AGENT_PORT[$c]}" --log-format json "${AGENT_FORGE_FLAGS[@]}" >>"$DIR/agent-$c.log" 2>&1 &
  echo $! >"$DIR/agent-$c.pid"
  pids+=($!)
}

chaos() { # chaos CLUSTER PHASE: in the background, kill -9 the agent when its state enters PHASE, then restart it
  [[ -n "${DEMO_CHAOS:-}" ]] || return 0
  local c=$1 phase=$2
  (
    kubectl --kubeconfig "$DIR/clusters/$c.kubeconfig" -n fleetgate-system get configmaps \
      --field-selector "metadata.name=fleetgate-state-$c" --watch -o 'jsonpath={.data.phase}{"\n"}' 2>/dev/null |
      while read -r p; do
        if [[ "$p" == "$phase" ]]; then
          kill -9 "$(cat "$DIR/agent-$c.pid")"
          echo "$phase" >"$DIR/chaos-$c-$phase"
          break
        fi
      done
  ) &
  CHAOS_PID=$!
  pids+=($CHAOS_PID)
}
recover() { # recover CLUSTER PHASE: once chaos struck, say so and start the agent again
  [[ -n "${DEMO_CHAOS:-}" ]] || return 0
  local c=$1 phase=$2
  wait_for "$STEP_TIMEOUT" "the agent of $c to reach $phase" test -f "$DIR/chaos-$c-$phase"
  bad "kill -9 of the $c agent while $phase (pid $(cat "$DIR/agent-$c.pid")); starting it again"
  start_agent "$c"
  kill "$CHAOS_PID" 2>/dev/null || true
}

say "Starting one fleetgate agent per cluster"
chaos cluster-a Applying
for c in "${CLUSTERS[@]}"; do
  AGENT_PORT[$c]=$(free_port)
  start_agent "$c"
  ok "agent for $c (http://127.0.0.1:${AGENT_PORT[$c]}/metrics, log $DIR/agent-$c.log)"
  if [[ -n "${GITEA_URL:-}" ]]; then
    gitea_api POST "/repos/$GITEA_REPOSITORY/hooks" "$(python3 -c '
import json, sys
print(json.dumps({"type": "gitea", "active": True, "events": ["push"], "branch_filter": "*",
                  "config": {"url": sys.argv[1], "content_type": "json", "secret": open(sys.argv[2]).read()}}))' \
      "http://127.0.0.1:${AGENT_PORT[$c]}/hooks/git" "$DIR/gitea/webhook-secret")" >/dev/null
    ok "Gitea push webhook (signed) → $c's agent"
  fi
done
say "rel-1 rolls out wave by wave (canary → wave-1 → wave-2, which waits for an approval)"
recover cluster-a Applying
follow rel-1 success success pending
awaiting_approval() { [[ "$(cell cluster-c "$1" description)" == "waiting for approval of wave wave-2"* ]]; }
wait_for "$STEP_TIMEOUT" "cluster-c to wait for an approval of rel-1" awaiting_approval rel-1
[[ -z "$(running cluster-c)" ]] || die "cluster-c runs $(running cluster-c) before rel-1 was approved"
ok "cluster-c waits, nothing applied: $(cell cluster-c rel-1 description)"

approve() { # approve ID WHY: the approver signs approve/ID/wave-2 and pushes it
  "$FG" approve "$1" --wave wave-2 -m "$2" --repo "$WORK" --sign-key "$APPROVER" --push | sed 's/^/    /'
  poke
}
say "Approving rel-1 for wave-2: fleetgate approve rel-1 --wave wave-2"
approve rel-1 "CAB-1001: wave-2 may take rel-1"
follow rel-1 success success success
ok "rel-1 runs everywhere; cluster-c's status records who approved it:"
"$FG" audit --repo "$REPO_URL" --cluster cluster-c | grep -A1 'applying rel-1' | sed 's/^/      /' || true

say "Cutting rel-2 — its pods crash-loop — and promoting it fleet-wide"
release rel-2 v1.1.0 bad
chaos cluster-a RollingBack
promote rel-2
recover cluster-a RollingBack
follow rel-2 failure none none
ok "the canary caught it: $(cell cluster-a rel-2 description)"
if [[ -n "${GITEA_URL:-}" ]]; then
  pr_status() { # the canary's newest status on the promotion PR's head, as Gitea's API lists it
    gitea_api GET "/repos/$GITEA_REPOSITORY/commits/$PR_HEAD/statuses" | python3 -c '
import json, sys
s = [s for s in json.load(sys.stdin) if s["context"] == "fleetgate/cluster-a" and s["status"] == "failure"]
print(s[0]["status"], s[0]["description"]) if s else sys.exit(1)'
  }
  wait_for 60 "Gitea to show cluster-a's failure on the promotion PR" pr_status
  ok "forge: Gitea shows on rel-2's promotion PR (head ${PR_HEAD:0:10}): fleetgate/cluster-a $(pr_status)"
fi
wait_for 60 "cluster-a to run rel-1 again" runs cluster-a rel-1
for c in cluster-b cluster-c; do
  [[ "$(running "$c")" == rel-1 ]] || die "$c runs $(running "$c"), not rel-1"
done
ok "cluster-a runs rel-1 again; cluster-b and cluster-c never applied rel-2 (they run rel-1)"

say "Git tells the truth: the canary's agent wrote its rollback back to main"
wait_for 60 "the canary's write-back commit on main" bash -c \
  "git -C '$WORK' fetch -q origin main && git -C '$WORK' log -1 --format=%B origin/main | grep -q '^Fleetgate-Rolled-Back-To: rel-1'"
git -C "$WORK" merge -q --ff-only origin/main
info "git log --oneline -3"
git -C "$WORK" log --oneline -3 | sed 's/^/      /'
info "its trailers:"
git -C "$WORK" log -1 --format=%B | grep '^Fleetgate-' | sed 's/^/      /'
info "$(git -C "$WORK" -c gpg.ssh.allowedSignersFile="$DIR/allowed_signers" verify-commit HEAD 2>&1 | head -1)"
ok "main pins cluster-a to rel-1 (clusters/cluster-a.yaml), so Git again says what runs"
info "fleetgate rollback --cluster cluster-a reads that commit as the rollback it is:"
{ "$FG" rollback --cluster cluster-a --repo "$WORK" 2>&1 || true; } | sed 's/^/      /'

say "Cutting rel-3 (good; its CRD gains an optional field) and promoting it fleet-wide"
# rel-2's tag is the newest, but it failed: name the release to fall back to explicitly.
release rel-3 v1.2.0 wide --rollback-to rel-1
promote rel-3

# cluster-c waits for the canary and wave-1 to pass rel-3 (a bake each): time to pull the brake.
say "Emergency brake: pausing cluster-c (wave-2) while rel-3 goes through the earlier waves"
"$FG" pause --cluster cluster-c --repo "$WORK" --reason "change freeze in wave-2" --push | sed 's/^/    /'
poke
info "rel-3 is approved for wave-2 ahead of time; the brake still holds cluster-c:"
approve rel-3 "CAB-1003: wave-2 may take rel-3 after the freeze"
wait_for "$STEP_TIMEOUT" "cluster-b to report rel-3 success" reports cluster-b rel-3 success
[[ "$(running cluster-c)" == rel-1 ]] || die "cluster-c runs $(running cluster-c) while paused, not rel-1"
ok "cluster-a and cluster-b run rel-3; paused cluster-c stays on rel-1:"
"$FG" status --repo "$REPO_URL" | grep -E 'cluster-c|paused' | sed 's/^/      /' || true

say "Lifting the brake: fleetgate resume --cluster cluster-c"
"$FG" resume --cluster cluster-c --repo "$WORK" --reason "freeze over" --push | sed 's/^/    /'
poke
follow rel-3 success success success
ok "rel-3 runs everywhere"

if [[ -n "${GITEA_URL:-}" ]]; then
  for c in "${CLUSTERS[@]}"; do
    wakes=$(curl -fsS "http://127.0.0.1:${AGENT_PORT[$c]}/metrics" 2>/dev/null |
      awk '/^fleetgate_triggers_total\{.*source="webhook"/ {n += $NF} END {print n + 0}')
    ok "forge: Gitea's signed push webhook woke $c's agent $wakes times"
  done
fi

# rel-3's promotion replaced rel-2 fleet-wide (which only the canary tried): name the release to go back to.
say "Rolling back through Git: fleetgate rollback --fleet --to rel-1 --push"
"$FG" rollback --fleet --to rel-1 --repo "$WORK" --reason "INC-42: rel-3 slows the reconcile loop" --push | sed 's/^/    /'
pushed=$SECONDS
poke
returned() { # returned CLUSTER: it runs rel-1 again and its newest rel-1 status is that rollback's success
  runs "$1" rel-1 && [[ "$(state_of "$1" rel-1)" == success && "$(cell "$1" rel-1 description)" == "rolled back from rel-3"* ]]
}
for c in "${CLUSTERS[@]}"; do
  wait_for "$STEP_TIMEOUT" "$c to be back on rel-1 with status success" returned "$c"
done
ok "every cluster runs rel-1 again, status success, $((SECONDS - pushed)) s after the push:"
info "$(cell cluster-a rel-1 description)"

say "fleetgate status --repo $REPO_URL"
"$FG" status --repo "$REPO_URL" | sed 's/^/    /'
"$FG" status --repo "$REPO_URL" -o json >"$DIR/status.json" || true
if [[ -n "${DEMO_AFTER:-}" ]]; then
  # shellcheck disable=SC2086 # DEMO_AFTER is a command line
  $DEMO_AFTER "$DIR"
fi
say "Done. Everything ran on this machine; $( [[ -n "${DEMO_DIR:-}${DEMO_KEEP:-}" ]] && echo "files are in $DIR" || echo "cleaning up")."
