#!/bin/bash
# Delete the queued resource once the run is complete (multislice:queuedResource.deleteOnComplete;
# part of the release as delete-on-complete.sh; docs/deploying.md). trainer.sh runs it from
# ExecStopPost= when the trainer exited 0 (it wrote, or found, <run dir>/COMPLETE).
# On worker 0 of slice MULTISLICE_COMPLETION_SLICE only (default 0; trainer.sh sets the slice that
# wrote the completion marker: an elastic run may finish without slice 0), when the metadata
# attribute multislice-delete-queued-resource
# names the queued resource: DELETE <api>/v2/<name>?force=true (its nodes are deleted first,
# then the QR: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/delete)
# with the VM's service-account token (its User-Agent names the sender's slice and worker, which the
# emulation reports; the API ignores it). No answer, 429 and 5xx are retried (doubling delays
# from MULTISLICE_RETRY_DELAY_S, default 1 s, to 30 s) until MULTISLICE_DELETE_DEADLINE_S
# (default 60 s; the unit's TimeoutStopSec is 120 s); 401/403 and other answers end it at
# once. One "capacity:" line per outcome; always exits 0 (the run is complete either way).
# Environment variables: GCE_METADATA_IP, MULTISLICE_TPU_API_ENDPOINT (default https://tpu.googleapis.com).
set -uo pipefail

# MULTISLICE_LINE_PREFIX: set (possibly empty) by trainer.sh when its log shipper adds the prefix.
readonly PREFIX=${MULTISLICE_LINE_PREFIX-"[slice ${MULTISLICE_SLICE:-?} worker ${MULTISLICE_WORKER:-?}] "}
say() { printf '%scapacity: %s\n' "$PREFIX" "$*"; }
[[ ${MULTISLICE_SLICE:-} == "${MULTISLICE_COMPLETION_SLICE:-0}" && ${MULTISLICE_WORKER:-} == 0 ]] || exit 0
readonly METADATA="http://${GCE_METADATA_IP:-metadata.google.internal}/computeMetadata/v1/instance"
readonly API=${MULTISLICE_TPU_API_ENDPOINT:-https://tpu.googleapis.com}
readonly DEADLINE=${MULTISLICE_DELETE_DEADLINE_S:-60}
readonly NAME_SHAPE='^projects/[a-z0-9-]+/locations/[a-z0-9-]+/queuedResources/[a-z0-9-]+$'
delay=${MULTISLICE_RETRY_DELAY_S:-1}
body=$(mktemp)
trap 'rm -f "$body"' EXIT

# fetch URL [CURL ARGS...]: the answer in $body, the HTTP status (000: no answer) on stdout.
fetch() {
  local url=$1
  shift
  curl -sS --connect-timeout 5 --max-time 20 -o "$body" -w '%{http_code}' "$@" "$url" 2>/dev/null || true
}
short() { tr -s '\n\t ' ' ' <"$body" | cut -c1-160; }
retryable() { [[ $1 == 000 || $1 == 429 || $1 == 5?? ]]; }
# pause CODE WHAT: wait before the next attempt, or give up (status 1) past the deadline.
attempt=1
pause() {
  if ((SECONDS + ${delay%.*} >= DEADLINE)); then
    say "error: $2: HTTP $1 after $attempt attempts in ${SECONDS}s; the queued resource is KEPT (and billed): delete it with pulumi destroy"
    return 1
  fi
  say "$2: HTTP $1; retry $attempt in ${delay}s"
  sleep "$delay"
  attempt=$((attempt + 1))
  delay=$(awk -v d="$delay" 'BEGIN { d *= 2; print (d < 30) ? d : 30 }')
}

while true; do
  code=$(fetch "$METADATA/attributes/multislice-delete-queued-resource" -H 'Metadata-Flavor: Google')
  case $code in
    200) name=$(<"$body") && break ;;
    404) say "kept: no queued resource to delete in the metadata (deleteOnComplete off)" && exit 0 ;;
  esac
  pause "$code" "metadata key multislice-delete-queued-resource" || exit 0
done
[[ $name =~ $NAME_SHAPE ]] || { say "error: metadata key multislice-delete-queued-resource is not a queued resource name: '${name:0:80}'"; exit 0; }

say "the run is complete: deleting queued resource $name (force: its nodes first)"
while true; do
  code=$(fetch "$METADATA/service-accounts/default/token" -H 'Metadata-Flavor: Google')
  if [[ $code == 200 && $(<"$body") =~ \"access_token\":[[:space:]]*\"([^\"]+)\" ]]; then
    code=$(fetch "$API/v2/$name?force=true" -X DELETE -H "Authorization: Bearer ${BASH_REMATCH[1]}" \
      -A "multislice-delete-on-complete slice/${MULTISLICE_SLICE} worker/${MULTISLICE_WORKER}")
    case $code in
      200) say "deleted: the TPU API accepted the delete of $name" && exit 0 ;;
      404) say "deleted: $name is already gone" && exit 0 ;;
      401 | 403)
        say "error: HTTP $code from the TPU API deleting $name ($(short)): the VM's service account needs tpu.nodes.delete (the stack's custom role multisliceDeleteOnComplete_<stack>); the queued resource is KEPT (and billed)"
        exit 0
        ;;
    esac
    retryable "$code" || { say "error: HTTP $code from the TPU API deleting $name ($(short)); the queued resource is KEPT (and billed)"; exit 0; }
    pause "$code" "DELETE $name" || exit 0
  else
    pause "$code" "metadata token" || exit 0
  fi
done
