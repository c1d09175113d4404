"""Stand-ins for the Hugging Face Hub that the hub and model-card tests share (no tests of its own):

- ``cached_snapshot``: a model folder laid out in a Hugging Face cache as ``hf download`` leaves it
  (``models--org--name/snapshots/<sha>/`` + ``refs/main``);
- ``FakeHub``: an HTTP server on 127.0.0.1 that answers the calls ``HfApi.create_repo`` and
  ``HfApi.upload_folder`` make (repo creation, README metadata validation, preupload, the LFS batch API with a
  basic PUT and a verify, the NDJSON commit) and keeps what was committed, so a test reads the files back.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


def cached_snapshot(cache: Path, repo_id: str, folder: Path, sha: str = SHA) -> Path:
    """Lay ``folder``'s files into the cache ``cache`` as the main revision of ``repo_id``, as huggingface_hub
    does: each file's content in ``blobs/<its sha256>``, a relative link to it in ``snapshots/<sha>/``, the
    revision in ``refs/main``; the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / sha
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    return snapshot


class FakeHub:
    """The Hub's model-repo API on 127.0.0.1: ``repos[repo_id][path]`` holds the committed bytes; ``token`` is the
    one bearer token accepted (401 otherwise); ``calls`` lists (method, path) in order."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, dict[str, bytes]] = {}
        self.lfs: dict[str, bytes] = {}
        self.commits: list[dict] = []
        self.calls: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- the routes: (method, pattern) -> handler(match, body) -> (status, JSON reply)
    def _create(self, m, body):
        payload = json.loads(body)
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.endpoint}/{repo_id}"}
        self.repos[repo_id] = {}
        return 200, {"url": f"{self.endpoint}/{repo_id}"}

    def _validate_yaml(self, m, body):
        """The card's header must be a YAML mapping with a licence and, where given, a base model id."""
        content = json.loads(body)["content"]
        header = re.match(r"---\n(.*?)\n---\n", content, flags=re.S)
        meta = yaml.safe_load(header.group(1)) if header else None
        errors = []
        if not isinstance(meta, dict):
            errors.append("README.md has no YAML metadata header")
        elif not isinstance(meta.get("license"), str):
            errors.append('"license" must be a string')
        elif "base_model" in meta and not re.fullmatch(r"[\w.-]+/[\w.-]+", str(meta["base_model"])):
            errors.append('"base_model" is not a model id')
        return (400, {"errors": [{"message": e} for e in errors]}) if errors else (200, {"errors": [], "warnings": []})

    def _preupload(self, m, body):
        if m["repo"] not in self.repos:
            return 404, {"error": "Repository not found"}
        files = json.loads(body)["files"]
        return 200, {"files": [{"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors")
                                else "regular", "shouldIgnore": False, "oid": None} for f in files]}

    def _lfs_batch(self, m, body):
        objects = json.loads(body)["objects"]
        return 200, {"transfer": "basic", "objects": [
            {"oid": o["oid"], "size": o["size"], "actions": {
                "upload": {"href": f"{self.endpoint}/lfs-upload/{o['oid']}"},
                "verify": {"href": f"{self.endpoint}/lfs-verify"}}} for o in objects]}

    def _lfs_upload(self, m, body):
        if hashlib.sha256(body).hexdigest() != m["oid"]:
            return 400, {"error": "the content does not match its oid"}
        self.lfs[m["oid"]] = body
        return 200, {}

    def _lfs_verify(self, m, body):
        obj = json.loads(body)
        ok = obj["oid"] in self.lfs and len(self.lfs[obj["oid"]]) == obj["size"]
        return (200, {}) if ok else (404, {"error": "object not uploaded"})

    def _commit(self, m, body):
        if m["repo"] not in self.repos:
            return 404, {"error": "Repository not found"}
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        files = {}
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self.lfs:
                    return 422, {"error": f"LFS object {value['oid']} of {value['path']} was never uploaded"}
                files[value["path"]] = self.lfs[value["oid"]]
        self.repos[m["repo"]].update(files)
        self.commits.append({"header": lines[0]["value"], "files": sorted(files)})
        oid = hashlib.sha1(json.dumps(self.commits).encode()).hexdigest()
        return 200, {"commitUrl": f"{self.endpoint}/{m['repo']}/commit/{oid}", "commitOid": oid,
                     "pullRequestUrl": None}

    def _routes(self):
        return [("POST", r"/api/repos/create", self._create), ("POST", r"/api/validate-yaml", self._validate_yaml),
                ("POST", rf"/api/models/{REPO}/preupload/main", self._preupload),
                ("POST", rf"/{REPO}\.git/info/lfs/objects/batch", self._lfs_batch),
                ("PUT", r"/lfs-upload/(?P<oid>[0-9a-f]{64})", self._lfs_upload),
                ("POST", r"/lfs-verify", self._lfs_verify), ("POST", rf"/api/models/{REPO}/commit/main", self._commit)]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    chunks = []
                    while (size := int(self.rfile.readline().strip(), 16)) > 0:
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self) -> None:
                path, body = self.path.split("?")[0], self._body()
                hub.calls.append((self.command, path))
                status, reply = 404, {"error": f"no route {self.command} {path}"}
                for method, pattern, route in hub._routes():
                    m = re.fullmatch(pattern, path)
                    if m and method == self.command:
                        auth = self.headers.get("Authorization")
                        lfs_data = path.startswith(("/lfs-upload/", "/lfs-verify"))
                        status, reply = ((401, {"error": "Invalid credentials"})
                                         if not lfs_data and auth != f"Bearer {hub.token}" else route(m, body))
                        break
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PUT = do_GET = _answer

            def log_message(self, *args) -> None:  # quiet
                pass

        return Handler
