#!/bin/bash
# The slice watch of a compute-engine TPU VM whose group does not repair a VM by itself (per-VM
# repair off: a multi-host slice, or flex-start; infra/backends/compute_engine/provisioning.py).
# Part of the release as slice-watch.sh (rendered by infra/startup/script.py from
# infra/backends/compute_engine/slice_watch.sh); the release watch (release-watch.sh) runs it
# once per poll:
#
#   slice-watch.sh HOME
#
# A multi-host slice's VMs are recovered together or not at all ("Multi-host slices require all
# instances in the slice to be recovered or rescheduled together … you can't reschedule individual
# instances within a slice", Google's "Failure recovery of TPU instances"), and a Spot VM's
# preemption is not recovered by Compute Engine ("delete and then recreate"). So every VM of the
# stack watches every slice's group (instanceGroupManagers.listManagedInstances): a VM that is
# TERMINATED, STOPPED or SUSPENDED with no action of its group on it (currentAction NONE) is lost,
# and a group with a lost VM on two polls in a row is recreated whole, by one VM: the first VM
# that is up (RUNNING, no action), in slice order and then name order, outside that group, else
# inside it. It sends instanceGroupManagers.recreateInstances with every VM of the group ("Flags
# the specified VM instances in the managed instance group to be immediately recreated. Each
# instance is recreated using the group's current configuration"; the method needs
# compute.instanceGroupManagers.update: Compute API v1 reference). The group's VMs then carry
# the action RECREATING, so no VM asks again; the recreated VMs boot, find their place and join
# the job, whose other trainers resume from the newest checkpoint with them.
#
# One attempt per call (the next poll tries again); one line when it acts or cannot read the
# groups. Exit status 0, or 1 when the groups could not be read or the request failed.
# Environment variables: GCE_METADATA_IP, MULTISLICE_COMPUTE_API_ENDPOINT (default
# @@DEFAULT_COMPUTE_API_ENDPOINT@@), MULTISLICE_SLICE / MULTISLICE_WORKER (the line prefix).
set -uo pipefail

readonly METADATA="http://${GCE_METADATA_IP:-@@DEFAULT_METADATA_HOST@@}/computeMetadata/v1"
compute_api=${MULTISLICE_COMPUTE_API_ENDPOINT:-@@DEFAULT_COMPUTE_API_ENDPOINT@@}
say() { printf '[slice %s worker %s] slice watch: %s\n' "${MULTISLICE_SLICE:-?}" "${MULTISLICE_WORKER:-?}" "$*"; }
# A managed instance's line: name, instanceStatus (- when it does not exist), currentAction; read
# with `python3 -I -S`, the standard library only, as boot-identity.sh reads the same answers.
readonly LIST='import json, sys
page = json.load(sys.stdin)
print(page.get("nextPageToken", ""))
for m in page.get("managedInstances", []):
    if m.get("instance"):
        print(m["instance"].rsplit("/", 1)[-1], m.get("instanceStatus") or "-", m.get("currentAction") or "NONE")'

metadata() { curl -sS --connect-timeout 5 --max-time 10 -f -H 'Metadata-Flavor: Google' "$METADATA/$1" 2>/dev/null; }

# call METHOD PATH [BODY]: the Compute API's answer in $answer (under projects/<p>/zones/<z>/).
call() {
  local code
  answer=$(curl -sS --connect-timeout 5 --max-time 30 -X "$1" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' --data "${3:-}" -w '\n%{http_code}' \
    "$compute_api/compute/v1/projects/$project/zones/$zone/$2" 2>/dev/null) || return 1
  code=${answer##*$'\n'}
  answer=${answer%$'\n'*}
  [[ $code == 200 ]] || {
    answer="HTTP $code ${answer:0:200}"
    return 1
  }
}

home=${1:?usage: slice-watch.sh HOME}
seen_file="$home/slice-watch.lost"
groups=$(metadata instance/attributes/multislice-instance-groups) || { say "warning: no metadata key multislice-instance-groups"; exit 1; }
own=$(metadata instance/name) || exit 1
zone=$(metadata instance/zone) || exit 1
zone=${zone##*/}
project=$(metadata project/project-id) || exit 1
token=$(metadata instance/service-accounts/default/token) || exit 1
[[ $token =~ \"access_token\":[[:space:]]*\"([^\"]+)\" ]] || exit 1
token=${BASH_REMATCH[1]}

IFS=, read -r -a group_list <<<"$groups"
declare -A lost=() members=()
up=() # "group name" of every VM up, in slice order and then name order
for group in "${group_list[@]}"; do
  page_token='' lines=()
  while true; do
    call POST "instanceGroupManagers/$group/listManagedInstances${page_token:+?pageToken=$page_token}" || {
      say "warning: group $group could not be listed ($answer); asking again at the next poll"
      exit 1
    }
    page=$(python3 -I -S -c "$LIST" <<<"$answer") || {
      say "warning: group $group: malformed answer"
      exit 1
    }
    page_token=${page%%$'\n'*}
    if [[ $page == *$'\n'* ]]; then mapfile -t -O "${#lines[@]}" lines <<<"${page#*$'\n'}"; fi
    [[ -n $page_token ]] || break
  done
  mapfile -t lines < <(printf '%s\n' "${lines[@]}" | LC_ALL=C sort)
  for line in "${lines[@]}"; do
    read -r name status action <<<"$line"
    [[ -n ${name:-} ]] || continue
    members[$group]+="${members[$group]:+ }$name"
    if [[ $action == NONE ]]; then
      case $status in
        RUNNING) up+=("$group $name") ;;
        TERMINATED | STOPPED | SUSPENDED) lost[$group]+="${lost[$group]:+, }$name ($status)" ;;
      esac
    fi
  done
done

previous=$(cat "$seen_file" 2>/dev/null) || previous=''
: >"$seen_file.new"
status=0
for group in "${group_list[@]}"; do
  [[ -n ${lost[$group]:-} ]] || continue
  echo "$group" >>"$seen_file.new"
  actor=''
  for entry in "${up[@]}"; do # the first VM up outside the group, else inside it
    if [[ ${entry% *} != "$group" ]]; then
      actor=${entry#* }
      break
    fi
  done
  if [[ -z $actor && ${#up[@]} -gt 0 ]]; then actor=${up[0]#* }; fi
  [[ $actor == "$own" ]] || continue
  if ! grep -qxF "$group" <<<"$previous"; then
    say "group $group: lost VM ${lost[$group]}; a VM recreated alone cannot rejoin its slice, so the whole group is recreated if it is still lost at the next poll"
    continue
  fi
  urls=()
  read -r -a names <<<"${members[$group]}"
  for name in "${names[@]}"; do urls+=("\"zones/$zone/instances/$name\""); done
  body="{\"instances\": [$(
    IFS=,
    printf '%s' "${urls[*]}"
  )]}"
  if call POST "instanceGroupManagers/$group/recreateInstances" "$body"; then
    say "group $group: recreating all ${#urls[@]} of its VMs together (instanceGroupManagers.recreateInstances; lost: ${lost[$group]})"
  else
    say "warning: group $group: recreateInstances failed ($answer); trying again at the next poll"
    status=1
  fi
done
mv -f "$seen_file.new" "$seen_file"
exit "$status"
