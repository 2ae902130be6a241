# The compute-engine backend's identity phase of the boot: this VM's worker and slice, and the
# identity its trainer's unit gets in its environment. Sourced by boot.sh (infra/startup/boot.sh.in),
# whose functions (read_metadata, log, die, sample, doubled) and settings (ATTEMPTS, retry_delay)
# it uses; it sets worker, slice and identity_env. Rendered into the release as identity.sh by
# infra/startup/script.py from infra/backends/compute_engine/boot_identity.sh; docs/vm-boot.md.
#
# Environment variables (optional): MULTISLICE_COMPUTE_API_ENDPOINT (Compute API, default
# @@DEFAULT_COMPUTE_API_ENDPOINT@@) and MULTISLICE_GROUP_WAIT_S (how long this VM waits for the
# groups, default @@GROUP_WAIT_S@@ s).
# shellcheck shell=bash disable=SC2034,SC2154
# The compute-engine backend: Compute Engine sets none of Cloud TPU's identity keys on its TPU VMs,
# so this VM finds its place from the slices' managed instance groups (docs/compute-engine.md,
# "How a VM learns its place"). Compute API v1, the VM's token
# (https://cloud.google.com/compute/docs/reference/rest/v1; gcloud's own client,
# googlecloudsdk/generated_clients/apis/compute/v1/compute_v1_client.py):
#  * instanceGroupManagers.listManagedInstances: POST .../zones/Z/instanceGroupManagers/G/listManagedInstances
#    -> managedInstances[].instance (the instance's URL, which "can exist even if the instance has not
#    yet been created"), .currentAction, and nextPageToken (query parameter pageToken);
#  * instances.get: GET .../zones/Z/instances/NAME -> networkInterfaces[].networkIP (internal IPv4).
# The worker is the index of this VM's name among its group's sorted names, the slice's hosts
# are their internal IPs in that order, and the coordinator is slice 0's first host: exported to
# the trainer's unit as GKE gives them to a TPU Pod (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES and, with
# more than one slice, MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID),
# which the trainer and JAX's GkeTpuCluster read (jax/_src/clusters/cloud_tpu_cluster.py).
compute_api=${MULTISLICE_COMPUTE_API_ENDPOINT:-@@DEFAULT_COMPUTE_API_ENDPOINT@@}
group_wait=${MULTISLICE_GROUP_WAIT_S:-@@GROUP_WAIT_S@@}
readonly NAME_RE='[a-z]([-a-z0-9]*[a-z0-9])?'
is_name() { [[ $1 =~ ^$NAME_RE$ ]]; }
is_groups() { [[ $1 =~ ^$NAME_RE(,$NAME_RE)*$ ]]; }
is_zone() { [[ $1 =~ ^projects/[^/[:space:]]+/zones/[a-z0-9-]+$ ]]; }
is_project() { [[ $1 =~ ^[a-z][-a-z0-9.:]*[a-z0-9]$ ]]; }
is_ipv4() { [[ $1 =~ ^[0-9]{1,3}([.][0-9]{1,3}){3}$ ]]; }
# The JSON of the Compute API's answers, read with the VM's python3 (the bootstrap decodes the
# release with it too), isolated and without site-packages (`-I -S`: no PYTHON* variable, user
# site or .pth file changes what the standard library's json reads, and it starts on less CPU).
# Names of a listManagedInstances page (not those being deleted or abandoned), after a first line
# with its nextPageToken (empty on the last page):
readonly LIST_NAMES='import json, sys
page = json.load(sys.stdin)
print(page.get("nextPageToken", ""))
for m in page.get("managedInstances", []):
    if m.get("instance") and m.get("currentAction") not in ("DELETING", "ABANDONING"):
        print(m["instance"].rsplit("/", 1)[-1])'
# instances.get: the first network interface's internal IP (or nothing) and, on a second line, the
# VM's agent-worker-number metadata item where Compute Engine set one (or nothing).
readonly NETWORK_IP='import json, sys
vm = json.load(sys.stdin)
nics = vm.get("networkInterfaces") or [{}]
print(nics[0].get("networkIP", ""))
items = (vm.get("metadata") or {}).get("items") or []
print(next((str(i.get("value", "")) for i in items if i.get("key") == "agent-worker-number"), ""))'

# compute_call METHOD PATH: the Compute API's JSON answer for PATH (under compute/v1/projects/<project>/
# zones/<zone>/) in $answer; status 3 if it does not exist (HTTP 404: a group or VM not created yet).
# Connection errors, 429 and 5xx are retried (ATTEMPTS in all); a refusal (401, 403) stops the boot.
compute_call() {
  local method=$1 url="$compute_api/compute/v1/projects/$project/zones/$zone/$2" attempt=1 delay=$retry_delay code why
  local body=()
  if [[ $method == POST ]]; then body=(-H 'Content-Type: application/json' --data ''); fi
  while true; do
    code=0
    answer=$(curl -sS --connect-timeout 5 --max-time 30 -X "$method" -H "Authorization: Bearer $token" \
      "${body[@]}" -w '\n%{http_code}' "$url" 2>/dev/null) || code=$?
    if ((code != 0)); then
      why="no answer (curl status $code)"
    else
      code=${answer##*$'\n'}
      answer=${answer%$'\n'*}
      case $code in
        200) return 0 ;;
        404) return 3 ;;
        401 | 403) die "compute engine: $method $url: HTTP $code '$(sample "$answer")': the VMs' service account needs compute.instanceGroupManagers.get and compute.instances.get" ;;
        *) why="HTTP $code '$(sample "$answer")'" ;;
      esac
    fi
    ((attempt < ATTEMPTS)) || die "compute engine: $method $url: $why after $attempt attempts"
    log "compute engine: $method $url: $why; retry $attempt/$((ATTEMPTS - 1)) in ${delay}s"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$(doubled "$delay")
  done
}

# group_members GROUP: the group's VMs, sorted by name, in the array $members; status 3 while it
# does not exist.
group_members() {
  local page_token='' path names status
  members=()
  while true; do
    path="instanceGroupManagers/$1/listManagedInstances${page_token:+?pageToken=$page_token}"
    status=0
    compute_call POST "$path" || status=$?
    ((status == 0)) || return "$status"
    names=$(python3 -I -S -c "$LIST_NAMES" <<<"$answer") || die "compute engine: group $1: malformed answer '$(sample "$answer")'"
    page_token=${names%%$'\n'*}
    if [[ $names == *$'\n'* ]]; then mapfile -t -O "${#members[@]}" members <<<"${names#*$'\n'}"; fi
    [[ -n $page_token ]] || break
  done
  mapfile -t members < <(printf '%s\n' "${members[@]}" | LC_ALL=C sort)
  if [[ -z ${members[0]:-} ]]; then members=(); fi
}

# wait_for_group GROUP COUNT: wait (until the deadline; delays doubling to 10 s) for GROUP to list
# COUNT VMs, each with an internal IP; then $members holds their names (sorted), $hosts their IPs
# and $numbers the agent-worker-number Compute Engine gave each ('' where none), in the same order.
wait_for_group() {
  local group=$1 want=$2 delay=$retry_delay why status name ip_number
  while true; do
    hosts=() numbers=()
    status=0
    group_members "$group" || status=$?
    if ((status == 3)); then
      why="does not exist yet"
    elif ((${#members[@]} != want)); then
      why="lists ${#members[@]} of its $want VMs"
    else
      why=''
      for name in "${members[@]}"; do
        is_name "$name" || die "compute engine: group $group lists a VM named '$(sample "$name")'"
        status=0
        compute_call GET "instances/$name" || status=$?
        ip_number=()
        if ((status == 0)); then mapfile -t ip_number < <(python3 -I -S -c "$NETWORK_IP" <<<"$answer" || true); fi
        if ! is_ipv4 "${ip_number[0]:-}"; then
          why="lists VM $name, which has no internal IP yet"
          break
        fi
        hosts+=("${ip_number[0]}")
        numbers+=("${ip_number[1]:-}")
      done
      [[ -n $why ]] || return 0
    fi
    ((SECONDS < deadline)) || die "compute engine: group $group $why after ${group_wait}s; not starting the trainer (this VM's boot stops here; a reboot tries again)"
    log "compute engine: group $group $why; asking again in ${delay}s"
    sleep "$delay"
    delay=$(awk -v d="$delay" 'BEGIN { d *= 2; print (d < 10) ? d : 10 }') # a late VM is seen within 10 s
  done
}

# order_group GROUP: the worker order of GROUP's VMs ($members, $hosts, $numbers of wait_for_group)
# in $order (indexes into them), and what decided it in $order_source. Google's numbering decides
# where Compute Engine gave every VM an agent-worker-number (they must be 0..COUNT-1, each once);
# where it gave none, the sorted names do. Some VMs numbered and others not, or numbers that are
# not a permutation, stop the boot: no format explains them.
order_group() {
  local group=$1 i numbered=0 number
  order=()
  for i in "${!members[@]}"; do
    if [[ -n ${numbers[i]} ]]; then numbered=$((numbered + 1)); fi
  done
  if ((numbered == 0)); then
    order=("${!members[@]}")
    order_source="sorted names"
    return 0
  fi
  local listed=''
  for i in "${!members[@]}"; do listed+="${listed:+, }${members[i]}=${numbers[i]:-none}"; done
  ((numbered == ${#members[@]})) || die "compute engine: Compute Engine numbered only some of group $group's VMs (agent-worker-number: $listed); not starting the trainer"
  for i in "${!members[@]}"; do
    number=${numbers[i]}
    if ! [[ $number =~ ^[0-9]{1,6}$ ]] || ((10#$number >= ${#members[@]})) || [[ -n ${order[10#$number]:-} ]]; then
      die "compute engine: the agent-worker-number of group $group's VMs ($listed) are not 0..$((${#members[@]} - 1)) each once; not starting the trainer"
    fi
    order[10#$number]=$i
  done
  order_source="Compute Engine's agent-worker-number"
}

# ordered ARRAY [ORDER]: the elements of ARRAY (members or hosts) in the order of the indexes in the
# array ORDER (default: order), comma-separated.
ordered() {
  local -n values=$1 indexes=${2:-order}
  local i out=''
  for i in "${indexes[@]}"; do out+="${out:+,}${values[i]}"; done
  printf '%s' "$out"
}

# The program's own metadata first: the instance template says this VM belongs to a compute-engine
# stack (metadata multislice-backend), whatever else Compute Engine sets on a TPU VM.
backend='' coordinator='' status=0
read_metadata backend instance/attributes/multislice-backend is_name || status=$?
((status != 3)) || die "metadata key multislice-backend is missing: this release is for the compute-engine backend, whose instance template sets it"
[[ $backend == compute-engine ]] || die "metadata key multislice-backend is '$(sample "$backend")', but this release is for the compute-engine backend"
is_count "$group_wait" || die "group_wait=$group_wait (MULTISLICE_GROUP_WAIT_S) is not a whole number of seconds"
command -v python3 >/dev/null 2>&1 || die "compute engine: python3 is needed to read the Compute API's answers and is not on PATH"
read_metadata slice instance/attributes/multislice-slice-id is_count
slice=$((10#$slice))
log_prefix="[slice $slice worker ?] "
read_metadata groups instance/attributes/multislice-instance-groups is_groups
read_metadata workers_per_slice instance/attributes/multislice-workers-per-slice is_count
workers_per_slice=$((10#$workers_per_slice))
((workers_per_slice > 0)) || die "metadata key multislice-workers-per-slice is 0"
read_metadata own_name instance/name is_name
read_metadata zone instance/zone is_zone
zone=${zone##*/}
read_metadata project project/project-id is_project
read_metadata token instance/service-accounts/default/token is_token
[[ $token =~ \"access_token\":[[:space:]]*\"([^\"]+)\" ]]
token=${BASH_REMATCH[1]}
IFS=, read -r -a group_list <<<"$groups"
((slice < ${#group_list[@]})) || die "metadata key multislice-slice-id $slice is outside the ${#group_list[@]} groups of multislice-instance-groups ($groups)"
deadline=$((SECONDS + group_wait))
log "compute engine: VM $own_name of group ${group_list[slice]} in $project/$zone; waiting up to ${group_wait}s for the groups' $workers_per_slice VMs"
wait_for_group "${group_list[slice]}" "$workers_per_slice"
order_group "${group_list[slice]}"
sorted_order=$(
  IFS=,
  printf '%s' "${members[*]}"
)
# worker-network-endpoints, where Compute Engine sets it (the third-party vllm-project/ci-infra TPU7x
# module says it does: docs/compute-engine.md, section 4): every format jax's cloud_tpu_cluster.py
# reads ("In the new format, it is just a list of hostnames. In the old format, it is a list of
# name:id:ip triples"), compared like with like: an IP with the VMs' internal IPs, a host name (its
# first label: a name or name.zone.c.project.internal) with their names. It must list each VM of the
# group once; it decides the order where the VMs carry no agent-worker-number, and must agree with
# them where they do.
is_endpoints() { [[ $1 =~ ^[^,[:space:]]+(,[^,[:space:]]+)*$ ]]; }
status=0
read_metadata ce_endpoints instance/attributes/worker-network-endpoints is_endpoints || status=$?
if ((status == 0)); then
  IFS=, read -r -a entries <<<"$ce_endpoints"
  endpoint_order=()
  declare -A seen_entry=()
  for entry in "${entries[@]}"; do
    IFS=: read -r -a parts <<<"$entry"
    case ${#parts[@]} in
      1) host=${parts[0]} ;;
      3) host=${parts[2]} ;;
      *) die "compute engine: metadata key worker-network-endpoints has the entry '$(sample "$entry")', neither a host nor name:id:ip (the forms jax's cloud_tpu_cluster.py reads); not starting the trainer" ;;
    esac
    found=''
    for i in "${!members[@]}"; do
      if is_ipv4 "$host"; then
        if [[ ${hosts[i]} == "$host" ]]; then found=$i; fi
      elif [[ ${members[i]} == "${host%%.*}" ]]; then
        found=$i
      fi
    done
    [[ -n $found && -z ${seen_entry[$found]:-} ]] ||
      die "compute engine: metadata key worker-network-endpoints ($(sample "$ce_endpoints")) does not list each VM of group ${group_list[slice]} once (names ${members[*]}, IPs ${hosts[*]}); not starting the trainer"
    seen_entry[$found]=1
    endpoint_order+=("$found")
  done
  ((${#endpoint_order[@]} == ${#members[@]})) ||
    die "compute engine: metadata key worker-network-endpoints ($(sample "$ce_endpoints")) lists ${#endpoint_order[@]} VMs; group ${group_list[slice]} has ${#members[@]}; not starting the trainer"
  if [[ $order_source == "sorted names" ]]; then
    order=("${endpoint_order[@]}")
    order_source="worker-network-endpoints"
  elif [[ ${endpoint_order[*]} != "${order[*]}" ]]; then
    die "compute engine: metadata key worker-network-endpoints orders group ${group_list[slice]}'s VMs $(ordered members endpoint_order), but their agent-worker-number orders them $(ordered members); not starting the trainer"
  fi
fi
worker=''
for position in "${!order[@]}"; do
  if [[ ${members[order[position]]} == "$own_name" ]]; then worker=$position; fi
done
[[ -n $worker ]] || die "compute engine: this VM ($own_name) is not among the VMs of its group ${group_list[slice]} (${members[*]}); not starting the trainer"
status=0 ce_worker=''
read_metadata ce_worker instance/attributes/agent-worker-number is_count || status=$?
if [[ $status == 0 ]] && ((10#$ce_worker != worker)); then
  die "compute engine: metadata key agent-worker-number says this VM ($own_name) is worker $((10#$ce_worker)), but $order_source make it worker $worker of group ${group_list[slice]} ($(ordered members)); not starting the trainer"
fi
worker_order=$(ordered members)
if [[ $worker_order != "$sorted_order" ]]; then
  log "compute engine: group ${group_list[slice]}'s workers in $order_source order are $worker_order, not their sorted names $sorted_order: Google's numbering decides"
fi
worker_hosts=$(ordered hosts)
# The TPU environment of Google's sample for TPU VMs of instance groups (gke-labs/tpu-operator's
# README; infra/backends/compute_engine/tpu_env.py): the slice's addresses in worker order, the
# TPU runtime's port on each (TPU_PROCESS_ADDRESSES) and the sample's port of TPU_WORKER_HOSTNAMES,
# and the values the instance template carries (topology, bounds, ports, and JAX_PLATFORMS=tpu):
# names TPU_* or JAX_PLATFORMS, values of letters, digits, ',', '.' and '-'.
process_addresses=${worker_hosts//,/:@@PROCESS_PORT@@,}:@@PROCESS_PORT@@
worker_hostnames=${worker_hosts//,/:@@WORKER_HOSTNAME_PORT@@,}:@@WORKER_HOSTNAME_PORT@@
tpu_entry='(TPU_[A-Z_]+|JAX_PLATFORMS)=[A-Za-z0-9,.-]+'
is_tpu_env() { [[ $1 =~ ^$tpu_entry( $tpu_entry)*$ ]]; }
status=0 tpu_env=''
read_metadata tpu_env instance/attributes/multislice-tpu-env is_tpu_env || status=$?
if ((status == 3)); then
  log "compute engine: metadata key multislice-tpu-env is absent (a VM created from an older instance template): the trainer gets no TPU topology environment until the VM is recreated"
fi
identity_env="TPU_WORKER_ID=$worker TPU_WORKER_HOSTNAMES=$worker_hostnames TPU_PROCESS_ADDRESSES=$process_addresses${tpu_env:+ $tpu_env}"
own_order_source=$order_source
if ((${#group_list[@]} > 1)); then
  coordinator=${hosts[order[0]]}
  if ((slice != 0)); then
    wait_for_group "${group_list[0]}" "$workers_per_slice"
    order_group "${group_list[0]}"
    coordinator=${hosts[order[0]]}
  fi
  identity_env+=" MEGASCALE_COORDINATOR_ADDRESS=$coordinator MEGASCALE_NUM_SLICES=${#group_list[@]} MEGASCALE_SLICE_ID=$slice"
fi
log "compute engine: worker $worker of slice $slice ($own_order_source), hosts $worker_hosts${coordinator:+, coordinator $coordinator}"
