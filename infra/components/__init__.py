"""The Pulumi components of a stack, each a ``ComponentResource`` over pulumi-gcp declared from
its own args object (built by the program, ``infra/__main__.py``, from the StackConfig):

* :mod:`~infra.components.services`: :class:`ProjectServices` (the project's APIs);
* :mod:`~infra.components.network`: :class:`Network` (VPC, subnetwork, Cloud NAT, firewall);
* :mod:`~infra.components.storage`: :class:`CheckpointBucket`;
* :mod:`~infra.components.service_account`: :class:`ServiceAccount` (the VMs' identity);
* :mod:`~infra.components.release`: :class:`ReleaseRecord` (the release every VM boot runs).

Beside them, :mod:`~infra.components.apis`: which APIs :class:`ProjectServices` enables, without
Pulumi (``multislice plan`` lists them).

The queued resource is a dynamic resource of its own package, :mod:`infra.queued_resource`.
"""
