"""One TPU generation (:class:`Generation`) and one accelerator type of it (:class:`AcceleratorType`):
the catalog's record types and their arithmetic, with no data (:mod:`infra.accelerators.catalog`
holds the generations, :mod:`infra.accelerators` parses names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: The names of the backends the catalog's records say offer a generation (``multislice:backend``
#: values): the Cloud TPU API's queued resources, Compute Engine instances in managed instance groups
#: (docs/compute-engine.md, section 1), or GKE TPU node pools running a JobSet (docs/gke.md, section
#: 2). The backends themselves are listed once, in :mod:`infra.backends.registry`, which refuses a
#: generation that names a backend it does not list.
QUEUED_RESOURCE = "queued-resource"
COMPUTE_ENGINE = "compute-engine"
GKE = "gke"


def topology_chips(topology: str) -> int:
    """Chips in a topology string such as ``"2x2x1"`` or ``"16x16"``: the product of its dims."""
    return math.prod(int(dim) for dim in topology.split("x"))


@dataclass(frozen=True)
class Generation:
    """One TPU generation and the facts the environment model needs about it.

    Units: FLOP/s, bytes, bits per second. ``sources`` maps each field name to the public
    document (URL + table row) it came from, and says when a value is a proxy.

    Attributes:
        name: generation name used in configs: "v4", "v5e", "v5p", "v6e", "tpu7x".
        type_prefix: accelerator-type prefix: "v4", "v5litepod", "v5p", "v6e", "tpu7x".
        tensorcores_per_chip: TensorCores on one chip (2 for v4/v5p/TPU7x, 1 for v5e/v6e).
        suffix_counts: what N in ``f"{type_prefix}-{N}"`` counts: "tensorcores" or "chips".
        sizes: every valid N, ascending.
        default_runtime_version: TPU software (runtime) version the docs recommend for JAX;
            None for a generation the Cloud TPU API does not offer (TPU7x): a runtime version
            is a queued resource's setting, and such a generation has none.
        peak_bf16_flops_per_chip: peak dense bf16 compute of one chip, FLOP/s.
        hbm_bytes_per_chip: HBM capacity of one chip in bytes, converted with the unit the
            doc prints (GiB -> 2**30, GB -> 10**9); ``sources`` says which.
        dcn_bits_per_second_per_host: data-center-network bandwidth of one *physical* TPU
            host of ``chips_per_physical_host`` chips, bits/s, as the docs state it. This is
            not per TPU VM: a multi-host v5e/v6e VM holds 4 of a host's 8 chips. For a VM use
            ``AcceleratorType.dcn_bits_per_second_per_host`` or
            ``dcn_bits_per_second_per_chip * chips_per_host``.
        supports_multislice: whether Multislice is supported (v4 and later).
        sources: field name -> source string.
        chips_per_physical_host: chips on the physical machine the DCN figure refers to.
        max_single_vm_chips: largest slice (in chips) served by one VM holding all its chips.
        multi_host_chips_per_vm: chips per VM in slices larger than ``max_single_vm_chips``.
        zones: zones that offer the generation (see the module docstring for what is listed).
        runtime_versions: TPU software versions known to work for JAX on the generation;
            ``default_runtime_version`` is always among them (added first when missing).
        topologies: the chip topology of each listed size, index for index with ``sizes``,
            as the docs' tables write it (v4, v5p, TPU7x: 3-D "2x2x1"; v5e, v6e: 2-D "4x4");
            the product of its dims is the slice's chips.
        backends: the backends that offer the generation (``multislice:backend`` values, each once).
        compute_engine_zones: zones where Compute Engine offers the generation's TPU
            machine types (empty when it does not offer the generation).
        compute_engine_machine_types: chips per VM -> the Compute Engine machine type of such
            a VM (``ct5p-hightpu-4t``); empty when Compute Engine does not offer the generation.
    """

    name: str
    type_prefix: str
    tensorcores_per_chip: int
    suffix_counts: str
    sizes: tuple[int, ...]
    default_runtime_version: str | None
    peak_bf16_flops_per_chip: float
    hbm_bytes_per_chip: int
    dcn_bits_per_second_per_host: float
    supports_multislice: bool
    sources: dict[str, str] = field(compare=False, hash=False, repr=False)
    chips_per_physical_host: int = 4
    max_single_vm_chips: int = 4
    multi_host_chips_per_vm: int = 4
    zones: tuple[str, ...] = ()
    runtime_versions: tuple[str, ...] = ()
    topologies: tuple[str, ...] = ()
    backends: tuple[str, ...] = (QUEUED_RESOURCE,)
    compute_engine_zones: tuple[str, ...] = ()
    compute_engine_machine_types: dict[int, str] = field(default_factory=dict[int, str], hash=False)

    def __post_init__(self) -> None:
        default = self.default_runtime_version
        if default is not None and default not in self.runtime_versions:  # the default is always known
            object.__setattr__(self, "runtime_versions", (default, *self.runtime_versions))
        self._check_backends()
        if self.suffix_counts not in ("tensorcores", "chips"):
            raise ValueError(f"suffix_counts must be 'tensorcores' or 'chips', not {self.suffix_counts!r}")
        if list(self.sizes) != sorted(set(self.sizes)) or not self.sizes:
            raise ValueError(f"{self.name}: sizes must be non-empty, unique and ascending")
        if len(self.topologies) != len(self.sizes):
            raise ValueError(f"{self.name}: one topology per size ({len(self.sizes)}), not {len(self.topologies)}")
        for size, topology in zip(self.sizes, self.topologies, strict=True):
            # Raises if a listed size does not map to a whole number of chips and VMs.
            chips = self.chips_for_size(size)
            per_vm = self.chips_per_host(chips)
            if topology_chips(topology) != chips:
                raise ValueError(f"{self.type_name(size)}: topology {topology} does not hold {chips} chips")
            if COMPUTE_ENGINE in self.backends and per_vm not in self.compute_engine_machine_types:
                raise ValueError(f"{self.type_name(size)}: no Compute Engine machine type for {per_vm}-chip VMs")

    def _check_backends(self) -> None:
        if not self.backends or len(set(self.backends)) != len(self.backends):
            raise ValueError(f"{self.name}: backends must name each backend that offers it once, not {self.backends}")
        on_compute_engine = COMPUTE_ENGINE in self.backends
        if on_compute_engine != bool(self.compute_engine_zones) or on_compute_engine != bool(
            self.compute_engine_machine_types
        ):
            raise ValueError(
                f"{self.name}: Compute Engine zones and machine types are listed exactly when compute-engine "
                "is among its backends"
            )
        if (QUEUED_RESOURCE in self.backends) != (self.default_runtime_version is not None):
            raise ValueError(f"{self.name}: a runtime version exactly when the queued-resource backend offers it")

    # --- naming arithmetic -------------------------------------------------------------

    def chips_for_size(self, size: int) -> int:
        """Chips in a slice of type ``f"{type_prefix}-{size}"`` (size need not be listed).

        Raises:
            ValueError: when a TensorCore count is not a whole number of chips.
        """
        if self.suffix_counts == "chips":
            return size
        chips, rest = divmod(size, self.tensorcores_per_chip)
        if rest:
            raise ValueError(
                f"{self.type_prefix}-{size}: the suffix counts TensorCores and must be a "
                f"multiple of {self.tensorcores_per_chip} (TensorCores per chip)"
            )
        return chips

    def type_name(self, size: int) -> str:
        """Accelerator-type name for suffix ``size``, e.g. ``type_name(16) == "v4-16"``."""
        return f"{self.type_prefix}-{size}"

    @property
    def chip_counts(self) -> tuple[int, ...]:
        """Chips per slice of every listed size, ascending."""
        return tuple(self.chips_for_size(s) for s in self.sizes)

    def chips_per_host(self, chips: int) -> int:
        """Chips attached to each TPU VM (worker) of a slice with ``chips`` chips.

        A slice of at most ``max_single_vm_chips`` chips is one VM holding all of them
        (v4-8/v5p-8: 4 chips; v5litepod-8/v6e-8: 8 chips; v6e-1: 1 chip); larger slices use
        ``multi_host_chips_per_vm``-chip VMs (4 for every generation here). Sources: the
        "chips_per_host" entry of ``sources``.

        Raises:
            ValueError: ``chips`` is not a positive whole number of VMs for this generation.
        """
        if not isinstance(chips, int) or isinstance(chips, bool) or chips <= 0:
            raise ValueError(f"{self.name}: chips must be a positive int, not {chips!r}")
        if chips <= self.max_single_vm_chips:
            return chips
        if chips % self.multi_host_chips_per_vm:
            raise ValueError(
                f"{self.name}: a {chips}-chip slice does not split into {self.multi_host_chips_per_vm}-chip VMs"
            )
        return self.multi_host_chips_per_vm

    # --- derived hardware figures -----------------------------------------------------

    @property
    def dcn_bits_per_second_per_chip(self) -> float:
        """DCN bandwidth per chip, bits/s: the host figure shared evenly by its chips."""
        return self.dcn_bits_per_second_per_host / self.chips_per_physical_host

    @property
    def flops_per_dcn_bit(self) -> float:
        """Hardware arithmetic intensity over DCN, FLOP per bit: peak bf16 FLOP/s per chip
        divided by DCN bits/s per chip. v4: 275e12 / (50e9 / 4) = 22,000, the figure of the Cloud
        TPU Multislice overview (:data:`infra.accelerators.catalog.MULTISLICE_OVERVIEW`)."""
        return self.peak_bf16_flops_per_chip / self.dcn_bits_per_second_per_chip

    def topology_for_size(self, size: int) -> str:
        """The chip topology of the listed size ``size`` (``topology_for_size(8) == "2x2x1"`` for v4).

        Raises:
            ValueError: ``size`` is not listed.
        """
        if size not in self.sizes:
            raise ValueError(f"{self.type_name(size)} is not a listed {self.name} size")
        return self.topologies[self.sizes.index(size)]

    def size_for_chips(self, chips: int) -> int:
        """The accelerator-type suffix of a ``chips``-chip slice (the inverse of :meth:`chips_for_size`)."""
        return chips if self.suffix_counts == "chips" else chips * self.tensorcores_per_chip

    def offered_by(self, backend: str) -> bool:
        """Whether ``backend`` (``multislice:backend``) offers this generation."""
        return backend in self.backends

    def allowed_compact(self) -> str:
        """All valid type names of this generation, compactly: ``"v4-{8,16,...,4096}"``."""
        return f"{self.type_prefix}-{{{','.join(str(s) for s in self.sizes)}}}"


@dataclass(frozen=True)
class AcceleratorType:
    """One valid accelerator type (slice shape by count) and its arithmetic.

    Attributes:
        name: accelerator-type string as the TPU API takes it, e.g. "v4-16".
        generation: the :class:`Generation` it belongs to.
        chips: TPU chips per slice.
        tensorcores: TensorCores per slice (= chips * generation.tensorcores_per_chip).
        hosts: TPU VMs (workers, one JAX process each) per slice.
        chips_per_host: chips attached to each VM (= chips / hosts).
    """

    name: str
    generation: Generation
    chips: int
    tensorcores: int
    hosts: int
    chips_per_host: int

    def __post_init__(self) -> None:
        if self.tensorcores != self.chips * self.generation.tensorcores_per_chip:
            raise ValueError(f"{self.name}: tensorcores != chips * tensorcores_per_chip")
        if self.hosts * self.chips_per_host != self.chips:
            raise ValueError(f"{self.name}: hosts * chips_per_host != chips")

    @property
    def peak_bf16_flops_per_slice(self) -> float:
        """Peak bf16 compute of the whole slice, FLOP/s (chips * peak per chip)."""
        return self.chips * self.generation.peak_bf16_flops_per_chip

    @property
    def hbm_bytes_per_slice(self) -> int:
        """HBM of the whole slice in bytes (chips * HBM per chip)."""
        return self.chips * self.generation.hbm_bytes_per_chip

    @property
    def topology(self) -> str:
        """The slice's chip topology as the docs' tables write it ("2x2x1", "4x4"); the product
        of its dims is :attr:`chips`. Source: the "topologies" entry of the generation's sources."""
        return self.generation.topology_for_size(self.generation.size_for_chips(self.chips))

    @property
    def machine_type(self) -> str | None:
        """The Compute Engine machine type of the slice's VMs (``ct6e-standard-4t``), or None where
        Compute Engine does not offer the generation (v4, v5e). Source: the generation's
        "compute_engine_machine_types" entry."""
        return self.generation.compute_engine_machine_types.get(self.chips_per_host)

    @property
    def is_multi_host(self) -> bool:
        """True when the slice spans more than one TPU VM."""
        return self.hosts > 1

    @property
    def dcn_bits_per_second_per_host(self) -> float:
        """DCN bandwidth available to one VM of this slice, bits/s, assuming the physical
        host's bandwidth is shared evenly by its chips (exact for v4/v5p, whose VM is the
        whole 4-chip host; an even-share estimate for 4-chip v5e/v6e VMs)."""
        return self.generation.dcn_bits_per_second_per_chip * self.chips_per_host
