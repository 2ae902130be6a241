"""One shardings benchmark (:class:`BenchSpec`) and the options of ``bench shardings``,
declared once for ``multislice bench shardings`` and ``python -m training bench shardings``:
each field's metadata holds its help, :func:`with_bench_options` makes the typer options.

``training.config`` (pydantic) is imported only where a spec is checked: both command lines
import this module, and ``--help`` should stay quick.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # an annotation only: see the module docstring
    from training.config import ParallelismConfig


class BenchConfigError(ValueError):
    """Benchmark options that cannot work; the message names the option."""


#: The largest values the options take. Past them JAX cannot hold the arrays (an array's byte size
#: past 2**63 aborts XLA, a random array past 2**64 bits is refused) or the run never ends; within
#: them the largest arrays stay under 2**60 bytes, and what does not fit in memory is refused by
#: JAX as out of memory (``multislice bench shardings`` says which options to reduce).
MAX_DEVICES_PER_SLICE = 16_384  # the ici product: more chips than any TPU slice (v5p: 8,960)
MAX_SLICES = 1_024  # the dcn product
MAX_BATCH_SIZE = 65_536  # rows per device
MAX_EMBEDDING_DIMENSION = 65_536  # the feed-forward width is 4 times it
MAX_LAYERS = 1_024
MAX_STEPS = 10_000  # --steps and --warmup


def _unit_axes() -> dict[str, int]:
    return {"data": 1, "fsdp": 1, "tensor": 1}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _shown(value: Any) -> str:
    """``value`` as a message shows it: its repr, cut short past 30 characters (an integer past
    4,300 digits, which ``repr`` refuses, by its size)."""
    if isinstance(value, int) and value.bit_length() > 14_000:
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value)
    unit = "digits" if isinstance(value, int) else "characters"
    return text if len(text) <= 30 else f"{text[:20]}… ({len(text):,} {unit})"


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """One shardings benchmark.

    Attributes:
      ici, dcn: mesh axis sizes (``data``, ``fsdp``, ``tensor``) inside and across slices.
      batch_size: rows per device (the global batch is this × devices, as in shardings.py).
      embedding_dimension: E; the feed-forward width is 4E.
      layers: MLP blocks.
      steps: timed steps (and timed reference matmuls); the median is used.
      warmup: untimed steps first (the first one compiles).
      dtype: "float32", "bfloat16", or "auto" (bfloat16 on TPU/GPU, float32 on CPU, where
        XLA's bfloat16 matmuls are slow).

    Raises (constructor):
      BenchConfigError: the values cannot form a benchmark (the message names the option).
    """

    ici: dict[str, int] = dataclasses.field(
        default_factory=_unit_axes,
        metadata={
            "help": {
                "data": "Data parallelism inside a slice.",
                "fsdp": "FSDP inside a slice.",
                "tensor": "Tensor parallelism inside a slice.",
            }
        },
    )
    dcn: dict[str, int] = dataclasses.field(
        default_factory=_unit_axes,
        metadata={
            "help": {
                "data": "Data parallelism across slices.",
                "fsdp": "FSDP across slices.",
                "tensor": "Tensor parallelism across slices (must be 1).",
            }
        },
    )
    batch_size: int = dataclasses.field(
        default=1024, metadata={"help": "Rows per device; the global batch is this × devices. At most 65,536."}
    )
    embedding_dimension: int = dataclasses.field(
        default=512, metadata={"help": "E; the feed-forward width is 4E. At most 65,536."}
    )
    layers: int = dataclasses.field(default=4, metadata={"help": "MLP blocks. At most 1,024."})
    steps: int = dataclasses.field(
        default=5, metadata={"help": "Timed steps (the median is reported). At most 10,000."}
    )
    warmup: int = dataclasses.field(
        default=2, metadata={"help": "Untimed steps first (the first one compiles). At most 10,000."}
    )
    dtype: str = dataclasses.field(
        default="auto", metadata={"help": "auto (bfloat16 on TPU/GPU, float32 on CPU), float32 or bfloat16."}
    )

    def __post_init__(self) -> None:
        from training.config import MESH_AXES

        problems = []
        for net in ("ici", "dcn"):
            sizes = getattr(self, net)
            if set(sizes) != set(MESH_AXES):
                problems.append(f"--{net}-*: expected the axes {', '.join(MESH_AXES)}; got {sorted(sizes)}")
                continue
            for axis in MESH_AXES:
                if not _positive_int(sizes[axis]):
                    problems.append(f"--{net}-{axis}: must be a positive integer; got {_shown(sizes[axis])}")
        for name, most in (
            ("batch_size", MAX_BATCH_SIZE),
            ("embedding_dimension", MAX_EMBEDDING_DIMENSION),
            ("layers", MAX_LAYERS),
            ("steps", MAX_STEPS),
        ):
            value = getattr(self, name)
            if not _positive_int(value):
                problems.append(f"--{name.replace('_', '-')}: must be a positive integer; got {_shown(value)}")
            elif value > most:
                problems.append(f"--{name.replace('_', '-')}: at most {most:,}; got {_shown(value)}")
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 1:
            problems.append(f"--warmup: must be at least 1 (the first step compiles); got {_shown(self.warmup)}")
        elif self.warmup > MAX_STEPS:
            problems.append(f"--warmup: at most {MAX_STEPS:,}; got {_shown(self.warmup)}")
        if not problems:
            for net, what, most in (("ici", "devices per slice", MAX_DEVICES_PER_SLICE), ("dcn", "slices", MAX_SLICES)):
                sizes = getattr(self, net)
                if (product := math.prod(sizes.values())) > most:
                    factors = " × ".join(f"{axis} {_shown(size)}" for axis, size in sizes.items())
                    problems.append(f"--{net}-*: {_shown(product)} {what} ({factors}); at most {most:,}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            problems.append(f"--dtype: allowed: auto, float32, bfloat16; got {self.dtype!r}")
        if problems:
            raise BenchConfigError("; ".join(problems))
        if self.dcn["tensor"] != 1:
            raise BenchConfigError(
                f"--dcn-tensor: must be 1 (tensor parallelism never crosses DCN); got {self.dcn['tensor']}"
            )
        shape = self.parallelism.mesh_shape
        if self.embedding_dimension % shape["fsdp"]:
            raise BenchConfigError(
                f"--embedding-dimension {self.embedding_dimension} is not divisible by the fsdp axis "
                f"(ici × dcn = {shape['fsdp']})"
            )
        if (4 * self.embedding_dimension) % shape["tensor"]:
            raise BenchConfigError(
                f"--embedding-dimension: the feed-forward width {4 * self.embedding_dimension} is not divisible by "
                f"the tensor axis {shape['tensor']}"
            )
        if self.global_batch % self.parallelism.batch_shards:
            raise BenchConfigError(
                f"--batch-size: the global batch {self.global_batch} (= batch size × {self.devices} devices) is not "
                f"divisible by data × fsdp = {self.parallelism.batch_shards}"
            )

    @property
    def parallelism(self) -> ParallelismConfig:
        from training.config import AxisSizes, ParallelismConfig

        return ParallelismConfig(ici=AxisSizes(**self.ici), dcn=AxisSizes(**self.dcn))

    @property
    def slices(self) -> int:
        return self.parallelism.dcn.product

    @property
    def devices_per_slice(self) -> int:
        return self.parallelism.ici.product

    @property
    def devices(self) -> int:
        return self.slices * self.devices_per_slice

    @property
    def ff_width(self) -> int:
        return 4 * self.embedding_dimension

    @property
    def parameters(self) -> int:
        """2 · E · 4E per layer (shardings.py's ``2 * D_FF * D_EMB * NUM_LAYERS``)."""
        return 2 * self.embedding_dimension * self.ff_width * self.layers

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.devices

    @property
    def flops_per_step(self) -> float:
        """6 · parameters · global batch rows (forward 2, backward 4 per parameter per row)."""
        return 6.0 * self.parameters * self.global_batch

    def resolved_dtype(self, platform: str) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "float32" if platform == "cpu" else "bfloat16"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchSpec:
        return cls(**data)


# --- the command line ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CommandLineOption:
    """One option of ``bench shardings``: ``flag`` on the command line, ``name`` in Python."""

    name: str
    flag: str
    default: int | str | bool
    help: str


JSON_OPTION = CommandLineOption(
    "json_output", "--json", False, "Print the result as JSON (tflops_per_device, efficiency, ...)."
)


def _default(field: dataclasses.Field) -> Any:
    """A :class:`BenchSpec` field's default value (its factory's product for a mesh)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def spec_options() -> tuple[CommandLineOption, ...]:
    """The options that make a :class:`BenchSpec` (``--ici-data`` … ``--dtype``), in field
    order, one per mesh axis for ``ici``/``dcn``."""
    options = []
    for field in dataclasses.fields(BenchSpec):
        help_text = field.metadata["help"]
        if isinstance(help_text, dict):  # a mesh: one option per axis
            defaults = _default(field)
            names = [(f"{field.name}_{axis}", defaults[axis], help_text[axis]) for axis in help_text]
        else:
            names = [(field.name, _default(field), help_text)]
        options += [
            CommandLineOption(name, "--" + name.replace("_", "-"), default, text) for name, default, text in names
        ]
    return tuple(options)


def spec_from_options(**options: Any) -> BenchSpec:
    """A :class:`BenchSpec` from option values (``--ici-fsdp 4`` → ``ici_fsdp=4``).

    Raises:
      BenchConfigError: they cannot form a benchmark (the message names the option).
      TypeError: a keyword that is not a :func:`spec_options` name.
    """
    unknown = sorted(set(options) - {option.name for option in spec_options()})
    if unknown:
        raise TypeError(f"spec_from_options() got unknown options {unknown}")
    values: dict[str, Any] = {}
    for field in dataclasses.fields(BenchSpec):
        if isinstance(field.metadata["help"], dict):
            sizes = _default(field)
            values[field.name] = {axis: options.get(f"{field.name}_{axis}", size) for axis, size in sizes.items()}
        elif field.name in options:
            values[field.name] = options[field.name]
    return BenchSpec(**values)


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """The shared options' values: :func:`spec_options` by name, and ``--json``."""

    spec_options: dict[str, Any]
    json_output: bool

    def spec(self) -> BenchSpec:
        """Raises BenchConfigError (naming the option) if the values cannot form one."""
        return spec_from_options(**self.spec_options)


def with_bench_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Typer sees, in place of ``command``'s one :class:`BenchOptions` parameter, the
    :func:`spec_options` and, after its other options, ``--json``; ``command`` gets their values
    as that one argument and builds the spec in its own error handling.

    Raises:
      TypeError: ``command`` has no or several :class:`BenchOptions` parameters.
    """
    import typer

    signature = inspect.signature(command)
    hints = typing.get_type_hints(command)
    targets = [name for name in signature.parameters if hints.get(name) is BenchOptions]
    if len(targets) != 1:
        raise TypeError(f"{command.__name__} needs exactly one parameter annotated BenchOptions; got {targets}")
    (target,) = targets
    spec_names = [option.name for option in spec_options()]

    def parameter(option: CommandLineOption) -> inspect.Parameter:
        return inspect.Parameter(
            option.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=typer.Option(option.default, option.flag, help=option.help),
            annotation=type(option.default),
        )

    parameters = []
    for name, param in signature.parameters.items():
        if name == target:
            parameters += [parameter(option) for option in spec_options()]
        else:
            parameters.append(param.replace(annotation=hints.get(name, param.annotation)))
    parameters.append(parameter(JSON_OPTION))

    @functools.wraps(command)
    def with_options(**values: Any) -> Any:
        options = BenchOptions({name: values.pop(name) for name in spec_names}, values.pop(JSON_OPTION.name))
        return command(**{target: options}, **values)

    with_options.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": hints.get("return")}
    return with_options
