"""A stack's trainer log lines: from Cloud Logging (a deployed stack) or from the emulated VMs'
console logs (``multislice local up``), as ``[slice S worker W] <line>`` (``multislice logs``,
:mod:`infra.cli.logs`). Nothing here imports a Google library at module level."""
