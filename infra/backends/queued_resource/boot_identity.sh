# The queued-resource backend's identity phase of the boot: this VM's worker and slice.
# Sourced by boot.sh (infra/startup/boot.sh.in), whose functions (read_metadata, log, die) and
# settings it uses; it sets worker and slice (identity_env stays empty: the trainer reads Cloud
# TPU's keys itself). Rendered into the release as identity.sh by infra/startup/script.py from
# infra/backends/queued_resource/boot_identity.sh; docs/vm-boot.md.
#
# Cloud TPU sets agent-worker-number (the worker in its slice) and tpu-env (MEGASCALE_SLICE_ID for
# a multislice queued resource) on every VM of a queued resource; JAX reads the same keys
# (jax/_src/clusters/cloud_tpu_cluster.py). An absent worker number is worker 0 (a single-VM
# slice made by hand), an absent tpu-env slice 0.
# shellcheck shell=bash disable=SC2034,SC2154
readonly SLICE_LINE="^MEGASCALE_SLICE_ID:[[:space:]]*'?([0-9]{1,6})'?[[:space:]]*$"
is_tpu_env() { # every MEGASCALE_SLICE_ID line holds a number
  local line
  while IFS= read -r line; do
    line=${line%$'\r'}
    if [[ $line == MEGASCALE_SLICE_ID:* && ! $line =~ $SLICE_LINE ]]; then return 1; fi
  done <<<"$1"
}
status=0
read_metadata worker instance/attributes/agent-worker-number is_count || status=$?
case $status in
  0) worker=$((10#$worker)) ;;
  *) log "warning: metadata key agent-worker-number is absent; assuming worker 0; no action needed: Cloud TPU sets it on every VM of a queued resource, so only a single-VM slice made by hand lacks it"; worker=0 ;;
esac
tpu_env=''
read_metadata tpu_env instance/attributes/tpu-env is_tpu_env || true
slice=0
while IFS= read -r line; do
  line=${line%$'\r'}
  if [[ $line =~ $SLICE_LINE ]]; then slice=$((10#${BASH_REMATCH[1]})); fi
done <<<"$tpu_env"
