"""Hub ids, `Org/Name` or `Org/Name@revision` (a branch, a tag or a commit sha): the cached snapshot,
else downloaded on first use, unless HF_HUB_OFFLINE forbids it.

huggingface_hub reads HF_HUB_OFFLINE, HF_ENDPOINT and HF_HUB_CACHE once, at import, into
`huggingface_hub.constants`; they are read from there at each call (tests patch them), and
HF_HUB_OFFLINE from the environment too, since a process may set it after the import (the `rao`
command does, before its stages run). Nothing here imports huggingface_hub before it is needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def split_revision(name: str) -> tuple[str, str | None]:
    """`Org/Name@rev` as ("Org/Name", "rev"); without `@`, the default branch (None)."""
    repo, _, revision = name.partition("@")
    return repo, revision or None


def offline() -> bool:
    """Whether downloads are forbidden now: HF_HUB_OFFLINE set to a true value in the environment,
    or as huggingface_hub read it at import (it then refuses every request itself)."""
    from huggingface_hub import constants

    return (
        os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES
        or constants.HF_HUB_OFFLINE
    )


def cached(name: str) -> Path | None:
    """The complete cached snapshot of `name`'s revision, or None; never makes a request."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, revision = split_revision(name)
    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError):  # not cached, partly cached, or not a valid repo id
        return None


def on_hub(name: str) -> str | None:
    """None when `name`'s repo and revision exist on the hub (one metadata request, nothing
    downloaded); else why it cannot be had from there, in one line."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    repo, revision = split_revision(name)
    hub = constants.ENDPOINT
    try:
        HfApi(endpoint=hub).model_info(repo, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except RevisionNotFoundError:
        return f"{repo!r} has no revision {revision!r} on {hub} (name a branch, a tag or a commit sha)"
    except RepositoryNotFoundError:
        return f"{repo!r}: no such model on {hub} (a private or gated one needs `hf auth login`)"
    except HfHubHTTPError as e:
        return f"{name!r}: {hub} answered HTTP {e.response.status_code}; try again later"
    except Exception as e:  # httpx2's ConnectError, TimeoutException, ProxyError...: no answer at all
        return (
            f"{name!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the hub at {hub} "
            f"cannot be reached ({type(e).__name__}): check the network and HF_ENDPOINT"
        )
    return None


def fetch_command(name: str) -> str:
    """The command that puts `name` into the cache."""
    repo, revision = split_revision(name)
    return f"hf download {repo}" + (f" --revision {revision}" if revision else "")


def available(name: str) -> bool:
    """Cached, or (downloads allowed) on the hub: usable without downloading anything yet."""
    return cached(name) is not None or (not offline() and on_hub(name) is None)


def why_missing(name: str) -> str:
    """Why `name` cannot be used here, and what to do, in one line."""
    from huggingface_hub import constants

    if offline():
        return (
            f"{name!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 "
            f"forbids downloading it: fetch it first (`{fetch_command(name)}`) or unset HF_HUB_OFFLINE"
        )
    return on_hub(name) or f"{name!r} is on {constants.ENDPOINT}: it downloads on first use"


def fetch(name: str) -> Path:
    """The local snapshot folder of `name`: the cached one, else downloaded now (the hub's own
    progress bars on stderr). A download cut off part-way resumes where it stopped (HTTP Range,
    huggingface_hub's own retries); the files already fetched are kept for the next try."""
    from huggingface_hub import constants, snapshot_download

    snapshot = cached(name)
    if snapshot is not None:
        return snapshot
    if offline():
        raise FileNotFoundError(why_missing(name))
    why = on_hub(name)
    if why is not None:
        raise FileNotFoundError(why)
    repo, revision = split_revision(name)
    print(
        f"{name!r} is not in the Hugging Face cache: downloading it from {constants.ENDPOINT} into "
        f"{constants.HF_HUB_CACHE} (once; later runs read the cache)",
        file=sys.stderr,
    )
    try:
        return Path(snapshot_download(repo, revision=revision))
    except Exception as e:  # the hub went away, or a file failed its retries: one line, no chain
        first = str(e).strip().partition("\n")[0]
        raise FileNotFoundError(
            f"downloading {name!r} from {constants.ENDPOINT} failed ({type(e).__name__}: {first}); "
            f"run again to resume, or fetch it with `{fetch_command(name)}`"
        ) from None
