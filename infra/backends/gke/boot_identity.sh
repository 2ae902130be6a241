# The gke backend's identity phase of the boot: this Pod's worker and slice, and the run directory.
# Sourced by boot.sh (infra/startup/boot.sh.in), whose functions (log, die, is_count, is_run_dir,
# sample) it uses; it sets worker, slice and run_dir (identity_env stays empty: the Pod's
# environment already holds what the trainer reads, and boot.sh passes it on). Rendered into the
# release as identity.sh from infra/backends/gke/boot_identity.sh; docs/gke.md, section 4.
#
# GKE's webhook sets TPU_WORKER_ID (0 to Pods − 1 of the slice) in every Pod of a TPU slice's
# Indexed Job; the JobSet's Pods set MEGASCALE_SLICE_ID from their child Job's index when the stack
# has several slices (infra/backends/gke/jobset.py), none with one slice (slice 0); and
# MULTISLICE_RUN_DIR, because the GKE metadata server serves no instance attributes of the stack's.
# shellcheck shell=bash disable=SC2034,SC2154
is_count "${TPU_WORKER_ID:-}" ||
  die "TPU_WORKER_ID='$(sample "${TPU_WORKER_ID:-}")' is not a worker number: GKE sets it in each Pod of a multi-host TPU slice (an Indexed Job with a subdomain and a google.com/tpu request)"
worker=$((10#$TPU_WORKER_ID))
slice=0
if [[ -n ${MEGASCALE_SLICE_ID+set} ]]; then
  is_count "$MEGASCALE_SLICE_ID" ||
    die "MEGASCALE_SLICE_ID='$(sample "$MEGASCALE_SLICE_ID")' is not a slice number (the JobSet sets it from the Pod's job-index label)"
  slice=$((10#$MEGASCALE_SLICE_ID))
fi
is_run_dir "${MULTISLICE_RUN_DIR:-}" ||
  die "MULTISLICE_RUN_DIR='$(sample "${MULTISLICE_RUN_DIR:-}")' is not a run directory (gs://bucket/path or a local path): the JobSet's Pods set it"
run_dir=$MULTISLICE_RUN_DIR
log "gke: worker $worker of slice $slice (TPU_WORKER_ID${MEGASCALE_SLICE_ID+, MEGASCALE_SLICE_ID}), run dir $run_dir"
