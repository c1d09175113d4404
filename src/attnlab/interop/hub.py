"""The Hugging Face Hub seen from attnlab: a model id found in the local Hugging Face cache (nothing is
downloaded), what an imported model is and under which licence (``imported.json``), and ``export --push``.

    import-hf org/name    the snapshot in the local cache (HF_HUB_CACHE, else HF_HOME/hub, else
                          ~/.cache/huggingface/hub), as ``hf download org/name`` leaves it:
                          models--org--name/refs/main -> models--org--name/snapshots/<sha>/
    imported.json         {"source", "repo_id", "revision", "license", ...}: the model card of a
                          fine-tune or an export credits the model it started from
    export --push REPO    ``HfApi.create_repo`` (exist_ok) + ``HfApi.upload_folder`` to the endpoint
                          HF_ENDPOINT names (the Hub by default), with the token of HF_TOKEN or ``hf auth login``

The environment is read when each function runs, so a variable set after import counts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from attnlab.core.errors import AttnlabError, CheckpointError, ConfigError

# what a model id looks like: "name" or "org/name" (letters, digits, - _ .), never a path that starts with . or /
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# a snapshot folder inside the cache: .../models--org--name/snapshots/<sha>
CACHED_SNAPSHOT = re.compile(r"models--(?P<id>.+)$")
CARD_KEYS = ("license", "license_name", "license_link", "datasets")  # what imported.json keeps of the source's card
MAX_CARD_BYTES = 1 << 20


class HubError(AttnlabError):
    """The Hub (or the endpoint HF_ENDPOINT names) refused or could not be reached (one line)."""


def cache_dir() -> Path:
    """The Hugging Face cache folder as huggingface_hub finds it, from the environment as it is now."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def resolve_source(source: str | Path) -> tuple[Path, str | None]:
    """(the folder to import, its model id or None): ``source`` itself where it is a folder, else the snapshot of
    the model id ``source`` in the local cache. HubError (one line) when it is neither."""
    folder = Path(source)
    if folder.is_dir():
        return folder, None
    text = str(source)
    if not REPO_ID.fullmatch(text):
        raise CheckpointError(f"Hugging Face model folder not found: {source}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = cache_dir()
    try:
        return Path(snapshot_download(text, cache_dir=cache, local_files_only=True)), text
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        raise HubError(f"{text} is neither a folder nor in the local Hugging Face cache ({cache}, from HF_HUB_CACHE "
                       f"or HF_HOME): download it with `hf download {text}`, or give a folder") from None


def _card_metadata(directory: Path) -> tuple[dict, str]:
    """(the YAML header of the folder's README.md, its text); ({}, "") without a readable card."""
    from huggingface_hub import ModelCard

    readme = directory / "README.md"
    if not readme.is_file() or readme.stat().st_size > MAX_CARD_BYTES:
        return {}, ""
    try:
        card = ModelCard.load(readme, ignore_metadata_errors=True)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}, ""
    return card.data.to_dict(), card.text


def _id_named_in_card(text: str) -> str | None:
    """The "org/name" a card quotes for itself: its title (the first ``# `` heading) with an organisation in front,
    as in ``from_pretrained('org/title')``; None when the card quotes no such id."""
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), "")
    if not REPO_ID.fullmatch(title):
        return None
    found = re.search(r"""["']([A-Za-z0-9][\w.-]*/""" + re.escape(title) + r""")["']""", text, flags=re.IGNORECASE)
    return found.group(1) if found else None


def source_record(directory: Path, repo_id: str | None = None) -> dict:
    """What an import came from, for ``imported.json``: {"source": the folder, "repo_id": its model id where one is
    known (given, read from a cache path, or quoted by the source's own card), "revision": the snapshot's commit,
    "license"/"license_name"/"license_link"/"datasets": from the source's card}; keys without a value are left out."""
    revision = None
    if repo_id is None and directory.parent.name == "snapshots":
        cached = CACHED_SNAPSHOT.fullmatch(directory.parent.parent.name)
        if cached:
            repo_id, revision = cached.group("id").replace("--", "/"), directory.name
    elif repo_id is not None:
        revision = directory.name if directory.parent.name == "snapshots" else None
    metadata, text = _card_metadata(directory)
    repo_id = repo_id or _id_named_in_card(text)
    if isinstance(metadata.get("datasets"), str):
        metadata["datasets"] = [metadata["datasets"]]
    record = {"source": str(directory), "repo_id": repo_id, "revision": revision,
              **{k: metadata.get(k) for k in CARD_KEYS}}
    return {k: v for k, v in record.items() if v is not None}


def check_push(repo_id: str) -> None:
    """Refuse, before any export work, a ``--push`` id the Hub cannot take or a push without a token."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ConfigError(f"--push {repo_id!r} is not a model id (name or org/name: letters, digits, - _ .)") from None
    if not get_token():
        raise ConfigError("--push needs a Hugging Face token: set HF_TOKEN or run `hf auth login`")


def push(folder: Path, repo_id: str) -> str:
    """Upload ``folder`` as the model repo ``repo_id`` (created if new) in one commit; the commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                                   commit_message=f"Upload {folder.name} (attnlab export)")
    except Exception as e:  # the Hub's refusal, the network, offline mode (each HTTP client has its own errors)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubError(f"the push to {repo_id} failed ({first}); {folder} is written: push it again with "
                       f"`hf upload {repo_id} {folder}`") from None
    return commit.commit_url
