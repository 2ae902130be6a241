"""How the Pulumi CLI starts a Python dynamic provider, restated from its sources.

The CLI cannot be installed here, so its three steps are restated (not copied) from
pulumi/pulumi at tag ``v3.146.0`` (7d4fe48315994738bb7a41f38393ce909859a13b, the README's
minimum) and at 1b5949891b3cefcb9974752b24a5ecef0acc86c8 (master, 2026-08-21), where they
are the same; docs/deploying.md, "How the Pulumi CLI starts the provider", has the links:

1. :func:`program_directory` — the working directory of every plugin the engine starts
   (``plugin.Context.Pwd``) is the program's directory: ``getPwdMain`` in
   ``pkg/engine/project.go`` (lines 45-71) returns Pulumi.yaml's ``main`` when it is a
   directory (its parent when it is a file), else the project root; ``ProjectInfoContext``
   in ``pkg/engine/deployment.go`` passes it to the plugin context (lines 57 and 68 on
   master, 51 and 57 at v3.146.0).
2. :func:`provider_environment` — ``NewProvider`` starts the provider with the CLI's own
   environment plus ``PULUMI_RUNTIME_<OPTION>=<value>`` for each of Pulumi.yaml's
   ``runtime.options`` (the key upper-cased, the value formatted by Go's ``%v``),
   ``PULUMI_PROJECT`` and ``PULUMI_CONFIG`` (the provider's config namespace as JSON):
   ``pkg/resource/plugin/provider_plugin.go`` lines 243-262 on master
   (``sdk/go/common/resource/plugin/provider_plugin.go`` lines 216-233 at v3.146.0), the
   options being ``ctx.RuntimeOptions()`` (``pkg/host/host.go`` lines 369-371), i.e.
   ``projinfo.Proj.Runtime.Options()``. It runs the plugin in ``ctx.Pwd`` (``newPlugin(ctx,
   ctx.Pwd, ...)``, line 288; 247 at v3.146.0), which ``ExecPlugin`` makes the process's
   working directory (``cmd.Dir = pwd``: ``pkg/resource/plugin/plugin.go`` line 599;
   ``sdk/go/common/resource/plugin/plugin.go`` line 479 at v3.146.0), with the engine's
   address as its one argument.
3. :func:`launcher_command` — the plugin is ``pulumi-resource-pulumi-python``, a shell script
   shipped beside the CLI (``sdk/python/dist/pulumi-resource-pulumi-python``, unchanged since
   #18126, first released in v3.145.0): when ``PULUMI_RUNTIME_VIRTUALENV`` is empty it takes
   ``.venv`` for ``PULUMI_RUNTIME_TOOLCHAIN=uv`` (lines 5-11); it drops one trailing ``/``
   and prefixes a relative path with ``$PWD/`` — the working directory, not the project root
   (lines 13-21; pulumi/pulumi#7061, open); if ``<venv>/bin/python`` is a file it puts
   ``<venv>/bin`` first on ``PATH`` and runs ``<venv>/bin/python -u -m pulumi.dynamic "$@"``
   (lines 23-33), else it prints that the virtualenv "doesn't exist" (or is not one) and
   exits 1 (lines 34-45); with no virtualenv at all it runs ``${PULUMI_PYTHON_CMD:-python3}
   -u -m pulumi.dynamic "$@"`` (line 49).

:func:`start_provider` does the three. With the Pulumi CLI installed (the script on ``PATH``)
or ``MULTISLICE_PULUMI_PYTHON_LAUNCHER`` naming the script, :func:`shipped_launcher` finds it
and the tests run the script itself as well.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

#: The plugin the CLI starts for a Python dynamic provider (package ``pulumi-python``).
LAUNCHER = "pulumi-resource-pulumi-python"
#: What a test passes as the engine's address (``pulumi.dynamic`` does not read its arguments).
ENGINE_ADDRESS = "127.0.0.1:1"


class LauncherExit(Exception):
    """The launcher exited before starting Python: its message, as it prints it on stderr."""


def project_file(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / "Pulumi.yaml").read_text())


def program_directory(root: Path, main: str | None) -> Path:
    """``getPwdMain``: the working directory of the program and of every plugin."""
    if not main:
        return root
    path = Path(os.path.normpath(main if os.path.isabs(main) else root / main))
    if not path.exists():
        raise FileNotFoundError(f"project 'main' could not be read: {path}")
    return path if path.is_dir() else path.parent


def go_value(value: Any) -> str:
    """A YAML scalar as Go's ``fmt.Sprintf("%v", v)`` prints it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def runtime_options(project: Mapping[str, Any]) -> dict[str, Any]:
    runtime = project.get("runtime")
    return dict(runtime.get("options") or {}) if isinstance(runtime, dict) else {}


def provider_environment(project: Mapping[str, Any], ambient: Mapping[str, str]) -> dict[str, str]:
    """``NewProvider``'s environment: the CLI's own, then the runtime options, project, config."""
    env = dict(ambient)
    for key, value in runtime_options(project).items():
        env[f"PULUMI_RUNTIME_{key.upper()}"] = go_value(value)
    env["PULUMI_PROJECT"] = str(project["name"])
    env["PULUMI_CONFIG"] = json.dumps({})  # config keys of the pulumi-python namespace: none
    return env


def launcher_virtualenv(cwd: Path, env: Mapping[str, str]) -> str | None:
    """The virtualenv the launcher resolves in ``cwd`` (``None``: it runs ``python3``)."""
    virtualenv = env.get("PULUMI_RUNTIME_VIRTUALENV", "")
    if not virtualenv and env.get("PULUMI_RUNTIME_TOOLCHAIN") == "uv":
        virtualenv = ".venv"
    elif not virtualenv and env.get("PULUMI_RUNTIME_TOOLCHAIN") == "poetry":
        raise NotImplementedError("the poetry toolchain asks `poetry env info --path`")
    if not virtualenv:
        return None
    virtualenv = virtualenv.removesuffix("/")
    return virtualenv if virtualenv.startswith("/") else f"{cwd}/{virtualenv}"


def uv_toolchain_virtualenv(start: Path) -> Path:
    """The virtualenv the Python language host's uv toolchain uses for the program when no
    ``virtualenv`` option is set: ``.venv`` beside the nearest ``uv.lock`` above ``start``, else
    beside the nearest ``pyproject.toml``, else in ``start`` (``newUv`` in
    ``sdk/python/toolchain/uv.go``, lines 57-99 on master, 48-82 at v3.146.0; ``start`` is the
    program directory on master, the project root at v3.146.0; master also honours
    ``UV_PROJECT_ENVIRONMENT``, which this restatement leaves out)."""
    for marker in ("uv.lock", "pyproject.toml"):
        for directory in (start, *start.parents):
            if (directory / marker).exists():
                return directory / ".venv"
    return start / ".venv"


def launcher_command(cwd: Path, env: Mapping[str, str], args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The launcher's rule: the command it runs in ``cwd`` and that command's environment.

    Raises:
      LauncherExit: the virtualenv it resolved is missing (it exits 1).
    """
    env = dict(env)
    virtualenv = launcher_virtualenv(cwd, env)
    if virtualenv is None:
        return [env.get("PULUMI_PYTHON_CMD", "python3"), "-u", "-m", "pulumi.dynamic", *args], env
    python = Path(virtualenv) / "bin" / "python"
    if not python.is_file():
        problem = "doesn't appear to be a virtual environment" if Path(virtualenv).is_dir() else "doesn't exist"
        raise LauncherExit(
            f'The \'virtualenv\' option in Pulumi.yaml is set to "{virtualenv}", but "{virtualenv}" {problem}.'
        )
    env["PATH"] = f"{virtualenv}/bin:{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    return [str(python), "-u", "-m", "pulumi.dynamic", *args], env


def shipped_launcher() -> Path | None:
    """The CLI's own launcher script, when this machine has it."""
    named = os.environ.get("MULTISLICE_PULUMI_PYTHON_LAUNCHER")
    found = named or shutil.which(LAUNCHER)
    return Path(found) if found else None


def cli_environment(ambient: Mapping[str, str]) -> dict[str, str]:
    """The environment of a shell that runs ``pulumi up``: this one without the variables the
    CLI itself sets for plugins, and without an activated virtualenv."""
    return {k: v for k, v in ambient.items() if not k.startswith("PULUMI_") and k != "VIRTUAL_ENV"}


def start_provider(
    root: Path, *, ambient: Mapping[str, str], main: str | None = None, launcher: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start the dynamic provider of the project at ``root`` as the CLI does; ``main``
    overrides Pulumi.yaml's, ``launcher`` runs that script instead of :func:`launcher_command`.

    Raises:
      LauncherExit: the launcher (restated) refuses to start, with its message.
    """
    project = project_file(root)
    cwd = program_directory(root, main if main is not None else project.get("main"))
    env = provider_environment(project, cli_environment(ambient))
    if launcher is not None:
        command = [str(launcher), ENGINE_ADDRESS]
    else:
        command, env = launcher_command(cwd, env, [ENGINE_ADDRESS])
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
