"""A hub model's config.json, for planning it before its weights are downloaded.

`mpskit plan model_name_or_path=Qwen/Qwen2.5-7B` needs only the model's shapes: huggingface_hub
fetches its config.json (a few KB) into the usual cache, where the next plan finds it without the
network. Offline, a gated repository, or an unknown name end in one line. No torch.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from mpskit.errors import MpskitError

CONFIG = "config.json"


def looks_like_hub_id(model: str) -> bool:
    """`org/name`: what transformers would look up on the hub when no such local folder exists."""
    return model.count("/") == 1 and not model.startswith((".", "/", "~")) and all(model.split("/"))


def hub_cache_dir() -> Path:
    """The hub cache as the environment names it now (huggingface_hub reads it once, at import)."""
    home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()
    return Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, true, yes or on)."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub's host takes a connection (HF_ENDPOINT's; behind a proxy, the proxy decides)."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def hub_config(repo_id: str, revision: str | None = None) -> dict:
    """The model's config.json: from the local cache, else fetched once from the hub."""
    path = hub_config_path(repo_id, revision)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise MpskitError(f"{path} is not a readable config.json", "delete it: the next plan fetches it again") from err


def hub_cached_file(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """A file of a hub model where the local cache holds it; None otherwise (nothing is fetched)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, filename, cache_dir=str(hub_cache_dir()), revision=revision)
    except (OSError, ValueError):
        return None
    return Path(path) if isinstance(path, str) else None


def hub_config_path(repo_id: str, revision: str | None = None) -> Path:
    """Where the model's config.json lies in the cache (its snapshot's folder holds the rest)."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    fix = "use a model_preset, a local model directory, or plan once online (only config.json is fetched)"
    try:
        cache = str(hub_cache_dir())
        path = try_to_load_from_cache(repo_id, CONFIG, cache_dir=cache, revision=revision)
        if not isinstance(path, str):
            if hub_offline():
                raise MpskitError(f"{repo_id}: its config.json is not cached and HF_HUB_OFFLINE is set", fix)
            if not hub_reachable():  # huggingface_hub would retry for 24 s, a line each time
                raise MpskitError(f"{repo_id}: its config.json is not cached and the hub cannot be reached", fix)
            path = hf_hub_download(repo_id, CONFIG, cache_dir=cache, revision=revision)
    except GatedRepoError as err:
        raise MpskitError(
            f"{repo_id} is gated on the hub: its config.json needs an account that accepted its license",
            "accept the license on huggingface.co and run `hf auth login`, or use a model_preset",
        ) from err
    except RepositoryNotFoundError as err:
        raise MpskitError(f"{repo_id} is not a model on the hub (or it is private)", fix) from err
    except LocalEntryNotFoundError as err:
        raise MpskitError(f"{repo_id}: its config.json is not cached and the hub cannot be reached", fix) from err
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise MpskitError(f"cannot fetch {repo_id}'s config.json: {str(err).splitlines()[0]}", fix) from err
    return Path(path)
