"""The compute-engine backend (``multislice:backend: compute-engine``): TPU VMs in one managed
instance group per slice, instead of a multislice queued resource.

Modules: :mod:`~infra.backends.compute_engine.spec` (its keys, capacity and VM contract),
:mod:`~infra.backends.compute_engine.backend` (the operations behind the seam),
:mod:`~infra.backends.compute_engine.inputs` (what the component takes, built by the program),
:mod:`~infra.backends.compute_engine.scheduling` (capacity → the template's scheduling and reservation
affinity), :mod:`~infra.backends.compute_engine.images` (the boot image family per generation) and
:mod:`~infra.backends.compute_engine.slices` (the component: workload policy, instance template, groups).

Sources (docs/compute-engine.md holds the facts with their quotes and its open questions):

* a multi-host slice is a MIG whose VMs come from an instance template of the TPU machine type,
  with the slice's topology in a workload policy: "Multi-host TPU slices are created as a MIG
  with an accelerator topology specified in a workload policy"
  (https://docs.cloud.google.com/compute/docs/tpus/tpu-resources-in-compute-engine); the same
  workload policy may serve several MIGs, placed per MIG
  (https://docs.cloud.google.com/compute/docs/instance-groups/about-workload-policies);
* the gcloud equivalents, read in the installed Google Cloud SDK:
  ``compute resource-policies create workload-policy --type=HIGH_THROUGHPUT
  --accelerator-topology``, ``compute instance-templates create --machine-type
  --image-family --image-project --maintenance-policy=TERMINATE --provisioning-model
  --instance-termination-action --max-run-duration --reservation-affinity --reservation``,
  ``compute instance-groups managed create --zone --template --size --workload-policy``,
  ``--update-policy-type=opportunistic`` (``lib/surface/compute/...`` and
  ``command_lib/compute/instance_groups/managed/flags.py``);
* the pulumi-gcp argument names, read in the installed ``pulumi_gcp/compute/`` (``resource_policy.py``,
  ``instance_template.py``, ``instance_group_manager.py``, ``_inputs.py``).

Not on this backend: ``deleteOnComplete`` and a live restart (the queued resource's
``ResetQueuedResource`` has no documented equivalent for a multi-host slice:
docs/compute-engine.md, section 5).
"""
