#!/bin/bash
# The slice watch of a compute-engine TPU VM whose group does not repair a VM by itself (per-VM
# repair off: a multi-host slice, or flex-start; infra/backends/compute_engine/provisioning.py).
# Part of the release as slice-watch.sh (rendered by infra/startup/script.py from
# infra/backends/compute_engine/slice_watch.sh); the release watch (release-watch.sh) runs it
# once per poll:
#
#   slice-watch.sh HOME
#
# A multi-host slice's VMs are recovered together or not at all ("Multi-host TPU slices require
# all instances in the slice to be recovered or rescheduled together", Google's "Failure recovery
# of TPU instances", https://cloud.google.com/tpu/docs/failure-recovery). Every VM of the stack
# reads every slice's group (instanceGroupManagers.listManagedInstances): a VM TERMINATED, STOPPED
# or SUSPENDED with no action of its group on it (currentAction NONE) is lost. What then depends
# on the stack's capacity (LOST_SLICE_ACTION, rendered in):
#
#  * report (on-demand, flex-start, reserved: Compute Engine's managed capacity modes, in which
#    "Compute Engine automatically recovers TPU instances and slices", same page): the first VM up,
#    outside the group if any, says so once; nothing is asked of the API.
#  * recreate (Spot: "Compute Engine doesn't automatically recover … Spot VM preemption", same page):
#    a group with a lost VM on two polls in a row, first seen at least MULTISLICE_SLICE_WATCH_GRACE_S
#    seconds ago, is resized to 0 by the first VM up outside it (instanceGroupManagers.resize, size
#    0: every VM of the group is deleted), and a group that lists no VM is resized back to the slice's
#    VMs (multislice-workers-per-slice), which bulk mode creates all at once, in the workload
#    policy's topology. Bulk mode adds VMs only while the target size is 0 and removes them only by a
#    target size of 0 ("About bulk mode", https://cloud.google.com/compute/docs/instance-groups/
#    about-bulk-mode), so this is the way to make a slice's VMs again without deleting the group,
#    which pulumi up owns (Google's Cluster Toolkit deletes and recreates the group instead:
#    docs/compute-engine.md, section 5). A VM of the lost group cannot do both steps (the first
#    deletes it): with no VM up outside the group, the first VM up inside it says once how to do it
#    by hand. The method "resizes the managed instance group … If you decrease the size, the group
#    deletes instances" and needs compute.instanceGroupManagers.update (Compute API v1 reference).
#
# One attempt per call (the next poll tries again); one line when it acts, reports or cannot read
# the groups. Exit status 0, or 1 when the groups could not be read or a request failed.
# Environment variables: GCE_METADATA_IP, MULTISLICE_COMPUTE_API_ENDPOINT (default
# @@DEFAULT_COMPUTE_API_ENDPOINT@@), MULTISLICE_SLICE_WATCH_GRACE_S (default @@LOST_GRACE_S@@),
# MULTISLICE_SLICE / MULTISLICE_WORKER (the line prefix).
set -uo pipefail

readonly METADATA="http://${GCE_METADATA_IP:-@@DEFAULT_METADATA_HOST@@}/computeMetadata/v1"
readonly ACTION=@@LOST_SLICE_ACTION@@
compute_api=${MULTISLICE_COMPUTE_API_ENDPOINT:-@@DEFAULT_COMPUTE_API_ENDPOINT@@}
grace=${MULTISLICE_SLICE_WATCH_GRACE_S:-@@LOST_GRACE_S@@}
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

# call METHOD PATH: the Compute API's answer in $answer (under projects/<p>/zones/<z>/).
call() {
  local code
  answer=$(curl -sS --connect-timeout 5 --max-time 30 -X "$1" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' --data '' -w '\n%{http_code}' \
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
[[ $grace =~ ^[0-9]+$ ]] || { say "warning: MULTISLICE_SLICE_WATCH_GRACE_S='${grace:0:40}' is not a whole number of seconds; action needed: set it to one, or unset it (the slice watch does nothing until then)"; exit 1; }
groups=$(metadata instance/attributes/multislice-instance-groups) || { say "warning: no metadata key multislice-instance-groups; action needed: run pulumi up, whose instance template sets it (the slice watch does nothing until then)"; exit 1; }
vms=$(metadata instance/attributes/multislice-workers-per-slice) || { say "warning: no metadata key multislice-workers-per-slice; action needed: run pulumi up, whose instance template sets it (the slice watch does nothing until then)"; exit 1; }
[[ $vms =~ ^[1-9][0-9]*$ ]] || { say "warning: metadata key multislice-workers-per-slice is '${vms:0:40}'; action needed: run pulumi up, whose instance template sets it (the slice watch does nothing until then)"; exit 1; }
own=$(metadata instance/name) || exit 1
zone=$(metadata instance/zone) || exit 1
zone=${zone##*/}
project=$(metadata project/project-id) || exit 1
token=$(metadata instance/service-accounts/default/token) || exit 1
[[ $token =~ \"access_token\":[[:space:]]*\"([^\"]+)\" ]] || exit 1
token=${BASH_REMATCH[1]}

IFS=, read -r -a group_list <<<"$groups"
declare -A lost=() listed=()
up=() # "group name" of every VM up, in slice order and then name order
for group in "${group_list[@]}"; do
  page_token='' lines=()
  while true; do
    call POST "instanceGroupManagers/$group/listManagedInstances${page_token:+?pageToken=$page_token}" || {
      say "warning: group $group could not be listed ($answer); asking again at the next poll; action needed if it persists: fix the cause the answer names"
      exit 1
    }
    page=$(python3 -I -S -c "$LIST" <<<"$answer") || {
      say "warning: group $group: malformed answer; no action needed: the slice watch asks again at the next poll"
      exit 1
    }
    page_token=${page%%$'\n'*}
    if [[ $page == *$'\n'* ]]; then mapfile -t -O "${#lines[@]}" lines <<<"${page#*$'\n'}"; fi
    [[ -n $page_token ]] || break
  done
  mapfile -t lines < <(printf '%s\n' "${lines[@]}" | LC_ALL=C sort)
  listed[$group]=0
  for line in "${lines[@]}"; do
    read -r name status action <<<"$line"
    [[ -n ${name:-} ]] || continue
    listed[$group]=$((listed[$group] + 1))
    if [[ $action == NONE ]]; then
      case $status in
        RUNNING) up+=("$group $name") ;;
        TERMINATED | STOPPED | SUSPENDED) lost[$group]+="${lost[$group]:+, }$name ($status)" ;;
      esac
    fi
  done
done

# first_up GROUP: the first VM up outside GROUP in $actor, else (inside=1) the first up inside it.
first_up() {
  local entry
  actor='' inside=0
  for entry in "${up[@]}"; do
    if [[ ${entry% *} != "$1" ]]; then
      actor=${entry#* }
      return
    fi
  done
  if ((${#up[@]} > 0)); then actor=${up[0]#* } inside=1; fi
}

# The groups seen lost at earlier polls, each with the time it was first seen (epoch seconds).
declare -A first_seen=()
while read -r group since; do
  if [[ -n ${group:-} && ${since:-} =~ ^[0-9]+$ ]]; then first_seen[$group]=$since; fi
done < <(cat "$seen_file" 2>/dev/null)
now=$(date +%s)
: >"$seen_file.new"
status=0
for group in "${group_list[@]}"; do
  if [[ -z ${lost[$group]:-} ]]; then
    # A group that lists no VM (resized to 0 for a lost Spot slice) gets the slice's VMs back.
    [[ $ACTION == recreate && ${listed[$group]} == 0 ]] || continue
    first_up "$group"
    [[ $actor == "$own" ]] || continue
    if call POST "instanceGroupManagers/$group/resize?size=$vms"; then
      say "group $group lists no VM: resizing it to its slice's $vms VMs, created all at once (instanceGroupManagers.resize)"
    else
      say "warning: group $group: resize to $vms failed ($answer); trying again at the next poll; action needed if it persists: fix the cause the answer names"
      status=1
    fi
    continue
  fi
  since=${first_seen[$group]:-$now}
  echo "$group $since" >>"$seen_file.new"
  first_up "$group"
  [[ $actor == "$own" ]] || continue
  if [[ $ACTION == report ]]; then
    [[ -z ${first_seen[$group]:-} ]] || continue
    say "group $group: lost VM ${lost[$group]}; Compute Engine recovers a slice in this capacity mode itself (managed capacity), so the slice watch only reports it"
    continue
  fi
  if ((inside)); then
    [[ -z ${first_seen[$group]:-} ]] || continue
    say "group $group: lost VM ${lost[$group]}, and no VM outside it is up to recreate its VMs (Compute Engine does not recover a Spot slice): gcloud compute instance-groups managed resize $group --size=0 --zone=$zone --project=$project, then the same with --size=$vms"
    continue
  fi
  if [[ -z ${first_seen[$group]:-} ]]; then
    say "group $group: lost VM ${lost[$group]}; a VM recreated alone cannot rejoin its slice, so the slice's $vms VMs are recreated together if it is still lost in ${grace}s"
    continue
  fi
  ((now - since >= grace)) || continue
  if call POST "instanceGroupManagers/$group/resize?size=0"; then
    say "group $group: resizing it to 0 to recreate all $vms of its VMs together (instanceGroupManagers.resize; lost: ${lost[$group]}); then back to $vms"
  else
    say "warning: group $group: resize to 0 failed ($answer); trying again at the next poll; action needed if it persists: fix the cause the answer names"
    status=1
  fi
done
mv -f "$seen_file.new" "$seen_file"
exit "$status"
