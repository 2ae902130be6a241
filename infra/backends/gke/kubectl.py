"""How the operator commands reach a gke stack's cluster: the installed ``kubectl``, with the
kubeconfig context ``gcloud container clusters get-credentials`` writes
(:func:`~infra.backends.gke.operate.credentials_command`; the commands never write the user's
kubeconfig themselves, they say which command does).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from infra.backends.gke import names, operate

#: Seconds one kubectl command may take (a listing; an exec is not run through here).
KUBECTL_TIMEOUT_S = 60


class KubectlError(RuntimeError):
    """kubectl is missing, the context is missing, or kubectl failed; one line, with its exit
    status for the command (2: set-up the user must do; 1: the cluster answered an error)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def credentials_hint(config) -> str:
    """The command that writes the cluster's kubeconfig context."""
    return " ".join(
        operate.credentials_command(
            project=config.project, location=names.cluster_location(config), cluster=names.cluster_name(config)
        )
    )


def kubectl_executable() -> str:
    """kubectl's path (``$MULTISLICE_KUBECTL`` when set, else ``kubectl`` on ``PATH``).

    Raises:
      KubectlError: not found (exit status 2).
    """
    found = os.environ.get("MULTISLICE_KUBECTL") or shutil.which("kubectl")
    if not found:
        raise KubectlError(
            "kubectl is not on PATH: install it (`gcloud components install kubectl`, or the Cloud SDK's packages), "
            "then run this command again",
            2,
        )
    return found


def run(config, argv: list[str]) -> str:
    """Run kubectl ``argv`` (from :mod:`~infra.backends.gke.operate`; its first word is replaced by
    the executable) and return its standard output.

    Raises:
      KubectlError: kubectl missing (2), the stack's context missing (2, naming the command that
        writes it), a failure (1, with kubectl's last line), or no answer in
        :data:`KUBECTL_TIMEOUT_S`.
    """
    args = [kubectl_executable(), *argv[1:]]
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=KUBECTL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise KubectlError(f"kubectl did not answer in {KUBECTL_TIMEOUT_S} s: {' '.join(argv)}") from None
    except OSError as err:
        raise KubectlError(f"cannot run kubectl: {err.strerror or err}", 2) from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {done.returncode}"
        # kubectl 1.32: 'error: context "C" does not exist' (no such context in the kubeconfig), or
        # "context was not found for specified context: C" (a kubeconfig with other contexts).
        if context_missing(last, names.kube_context(config)):
            raise KubectlError(
                f"kubectl has no context {names.kube_context(config)} for the stack's cluster: run "
                f"`{credentials_hint(config)}` first ({last})",
                2,
            )
        raise KubectlError(f"kubectl failed: {last}")
    return done.stdout


def context_missing(line: str, context: str) -> bool:
    """Whether kubectl's last error line says the kubeconfig has no context ``context``."""
    return (
        f'context "{context}" does not exist' in line
        or f"context was not found for specified context: {context}" in line
    )


def list_pods(config) -> str:
    """kubectl's JSON listing of the run's Pods."""
    return run(
        config,
        operate.pods_command(
            context=names.kube_context(config), namespace=config.gke.namespace, jobset=names.jobset_name(config)
        ),
    )
