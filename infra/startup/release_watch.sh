#!/bin/bash
# The release watch of a compute-engine TPU VM (part of the release as release-watch.sh;
# docs/vm-boot.md, "The release watch"). A queued resource's update resets its VMs, so every
# boot reads the release record; a managed instance group's VMs are not rebooted by a new
# instance template, so on that backend this watch reads the record instead.
#
#   release-watch.sh current gs://BUCKET/OBJECT
#       Print the release id that the record names. Status 3: there is no record; 2: it could not
#       be read or names no release (one attempt; the reason on stdout).
#   release-watch.sh watch RELEASE_ID HOME gs://BUCKET/OBJECT
#       ExecStart= of multislice-release-watch.service (written by boot.sh), for as long as the
#       VM runs: every MULTISLICE_RELEASE_POLL_S seconds (default 60), when the record names
#       another release, run this release's boot.sh under the boot lock with
#       MULTISLICE_RELEASE_WATCHING=1. That boot fetches and verifies the recorded release and
#       runs its boot.sh, which rewrites the trainer unit and restarts it: systemd's SIGTERM makes
#       every process of the job save a checkpoint at the agreed step
#       (docs/vm-boot.md, "The trainer service"). Then this watch becomes that of the release the
#       boot left running (the only one left on the disk). A boot that fails leaves the trainer as it was and is
#       tried again next time. As a queued resource's reset does, a new release also restarts a
#       trainer that completed its run (raising training.steps continues it) or stopped on a
#       configuration error. Each poll first runs this release's slice-watch.sh, if it has one.
#
# Environment variables: GCE_METADATA_IP, STORAGE_EMULATOR_HOST, MULTISLICE_RELEASE_POLL_S.
set -uo pipefail

readonly METADATA="http://${GCE_METADATA_IP:-metadata.google.internal}/computeMetadata/v1/instance"
storage=${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}
[[ $storage == *://* ]] || storage="http://$storage"
release=$(cd "${0%/*}" && pwd -P)
say() { printf '[slice %s worker %s] %s\n' "${MULTISLICE_SLICE:-?}" "${MULTISLICE_WORKER:-?}" "$*"; }

# current gs://BUCKET/OBJECT: the record's release id on stdout (statuses as above).
current() {
  local path=${1#gs://} body code token
  [[ $1 == gs://*/* ]] || { echo "not a gs:// object: $1"; return 2; }
  body=$(mktemp) || return 2
  code=$(curl -sS --connect-timeout 5 --max-time 20 -o "$body" -w '%{http_code}' \
    -H 'Metadata-Flavor: Google' "$METADATA/service-accounts/default/token" 2>/dev/null) || code=000
  if [[ $code != 200 || ! $(<"$body") =~ \"access_token\":[[:space:]]*\"([^\"]+)\" ]]; then
    echo "metadata token: HTTP $code"
    rm -f "$body"
    return 2
  fi
  token=${BASH_REMATCH[1]}
  local object=${path#*/}
  code=$(curl -sS --connect-timeout 5 --max-time 20 -o "$body" -w '%{http_code}' \
    -H "Authorization: Bearer $token" "$storage/storage/v1/b/${path%%/*}/o/${object//\//%2F}?alt=media" 2>/dev/null) || code=000
  if [[ $code == 404 ]]; then
    echo "no release record at $1"
    rm -f "$body"
    return 3
  fi
  if [[ $code == 200 && $(<"$body") =~ \"release\":[[:space:]]*\"([0-9a-f]{64})\" ]]; then
    echo "${BASH_REMATCH[1]}"
    rm -f "$body"
    return 0
  fi
  echo "release record $1: HTTP $code$([[ $code == 200 ]] && echo ', no release id in it')"
  rm -f "$body"
  return 2
}

watch() {
  local release_id=$1 home=$2 record=$3 poll=${MULTISLICE_RELEASE_POLL_S:-60} now status reported='' running
  [[ $release_id =~ ^[0-9a-f]{64}$ && -d $home ]] || { say "release watch: usage: release-watch.sh watch RELEASE_ID HOME gs://BUCKET/OBJECT"; return 2; }
  [[ $poll =~ ^[0-9]+([.][0-9]+)?$ ]] || { say "release watch: MULTISLICE_RELEASE_POLL_S='$poll' is not a number of seconds"; return 2; }
  say "release watch: release ${release_id:0:12}; the record $record is read every ${poll}s"
  while true; do
    sleep "$poll"
    # The backend's slice watch, where the release carries one (slice-watch.sh: a compute-engine
    # group that does not repair a VM by itself); it says what it does, and fails only this poll.
    if [[ -f $release/slice-watch.sh ]]; then bash "$release/slice-watch.sh" "$home" || true; fi
    status=0
    now=$(current "$record") || status=$?
    if ((status != 0)); then
      # One line per new problem, not one a minute.
      [[ $now == "$reported" ]] || say "release watch: warning: $now; this VM keeps release ${release_id:0:12} and reads the record again every ${poll}s; action needed if it persists: fix the cause it names"
      reported=$now
      continue
    fi
    reported=''
    [[ $now != "$release_id" ]] || continue
    say "release: the record names release ${now:0:12}, not this VM's ${release_id:0:12}: booting it (the trainer saves a checkpoint at the agreed step first)"
    status=0
    (
      exec 9>"$home/.boot.lock"
      flock 9
      MULTISLICE_RELEASE_ID=$release_id MULTISLICE_RELEASE_WATCHING=1 exec bash "$release/boot.sh"
    ) || status=$?
    # A boot that succeeded leaves one release on the disk, the one it runs (the record's, or a
    # newer one if the record changed again meanwhile): this watch becomes that release's.
    running=("$home"/releases/*/release-watch.sh)
    if ((status == 0 && ${#running[@]} == 1)) && [[ -f ${running[0]} ]]; then
      now=${running[0]%/release-watch.sh}
      exec bash "${running[0]}" watch "${now##*/}" "$home" "$record"
    fi
    say "release watch: warning: the boot of release ${now:0:12} failed (status $status); this VM keeps release ${release_id:0:12} and tries again in ${poll}s; action needed if it fails again: find the cause in the boot's lines above"
  done
}

case ${1:-}:$# in
  current:2) current "$2" ;;
  watch:4) watch "$2" "$3" "$4" ;;
  *)
    say "usage: release-watch.sh current gs://BUCKET/OBJECT | release-watch.sh watch RELEASE_ID HOME gs://BUCKET/OBJECT"
    exit 2
    ;;
esac
