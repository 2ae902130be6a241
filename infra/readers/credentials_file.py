"""Credentials bytes: a credentials setting read as the gcp provider reads it (a file's path or the
contents themselves), bounded, and judged without a Google import or a network call.

The credentials the queued-resource provider and the CLI use come from stack config keys and
environment variables (:mod:`infra.credentials`); each value is either a path or the contents
(terraform-provider-google ``verify.PathOrContents``), and a file is read through
:func:`infra.readers.files.read_bounded`, its JSON through ``training.run_objects.json_record``
(docs/outside-bytes.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.readers.files import UnreadableFile, read_bounded

#: Credential file types google-auth loads, with the fields each needs
#: (google/auth/_default.py of https://github.com/googleapis/google-auth-library-python).
FILE_TYPES: dict[str, tuple[str, ...]] = {
    "service_account": ("client_email", "private_key", "token_uri"),
    "authorized_user": ("client_id", "client_secret", "refresh_token"),
    "external_account": ("audience", "subject_token_type", "token_url", "credential_source"),
    "external_account_authorized_user": ("audience", "refresh_token", "token_url"),
    "impersonated_service_account": ("service_account_impersonation_url", "source_credentials"),
    "gdch_service_account": ("project", "private_key_id", "private_key", "name", "token_uri"),
}

#: The most bytes of a credentials file read, and of credentials JSON decoded (``json_record``, which
#: bounds its nesting too): a service-account key is about 2.4 KB, and every type of
#: :data:`FILE_TYPES` a few KB; an access token is under 2 KB. A larger file is not credentials (a
#: device, a log or an archive named by mistake), and is refused unread.
MAX_CREDENTIALS_BYTES = 1 << 20


def path_or_contents(value: str) -> tuple[str, bool]:
    """``(contents, was_a_path)``: the file's text when ``value`` (``~`` expanded) names an
    existing file, else ``value`` itself (terraform-provider-google ``verify.PathOrContents``).
    The file is read by ``read_bounded``: a regular file of at most :data:`MAX_CREDENTIALS_BYTES`.

    Raises:
      UnreadableFile: ``value`` names a file that cannot be read as credentials (a FIFO or a
        device it was replaced by, over the limit, not UTF-8, or the OS refused it); the message
        names the file and why.
    """
    if value.lstrip().startswith("{") or "\n" in value:
        return value, False
    try:
        path = Path(value).expanduser()
        if not path.is_file():
            return value, False
    except (OSError, RuntimeError):  # not a usable path (too long, no home directory): contents
        return value, False
    return file_text(path), True


def file_text(path: Path) -> str:
    """The text of the credentials file ``path`` (see :func:`path_or_contents`).

    Raises:
      UnreadableFile: as :func:`path_or_contents` says (a file gone since it was found, too).
    """
    try:
        return read_bounded(path, MAX_CREDENTIALS_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFile(f"{path} is not UTF-8 text") from None
    except OSError as err:
        why = err.why if isinstance(err, UnreadableFile) else err.strerror or str(err)
        raise UnreadableFile(f"{path} cannot be read ({why})") from None


def check_credentials_json(text: str, origin: str) -> str | None:
    """Why ``text`` is not a credentials JSON google-auth can load (else None)."""
    try:
        info = credentials_json(text)
    except json.JSONDecodeError as exc:
        return f"{origin} is neither an existing file nor credentials JSON ({exc.msg} at line {exc.lineno})"
    except ValueError as exc:  # over the limit, nested past the parser, an integer past 4,300 digits
        return f"{origin} is not credentials JSON ({exc})"
    if not isinstance(info, dict):
        return f"{origin} is not a credentials JSON object"
    kind = info.get("type")
    if kind not in FILE_TYPES:
        return f"{origin} has credential type {kind!r}; expected one of {', '.join(FILE_TYPES)}"
    missing = [name for name in FILE_TYPES[kind] if not info.get(name)]
    if missing:
        return f"{origin} ({kind}) lacks {', '.join(missing)}"
    return None


def credentials_json(text: str) -> Any:
    """The JSON value of credentials ``text``, through ``training.run_objects.json_record`` (at most
    :data:`MAX_CREDENTIALS_BYTES`, nesting the parser takes).

    Raises:
      ValueError: not JSON (a ``json.JSONDecodeError`` for a syntax error), or past those bounds.
    """
    from training.run_objects import json_record  # jax-free; here, not above: the program never imports it

    return json_record(text.encode("utf-8", "surrogatepass"), MAX_CREDENTIALS_BYTES)
