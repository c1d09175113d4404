"""The Hub seen from attnlab: ``import-hf org/name`` from the local Hugging Face cache (a fake cache in a temporary
folder), and ``export --push REPO`` through huggingface_hub's own HTTP calls to a fake Hub on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.models.registry import from_pretrained
from tests.helpers import train_tiny_run
from tests.interop.test_hub_fakes import SHA, FakeHub, cached_snapshot

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
hub_constants = pytest.importorskip("huggingface_hub.constants")
TOKEN = "hf_attnlab_test_token"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, named by HF_HUB_CACHE (HF_HOME points elsewhere: the cache wins)."""
    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return folder


def test_a_model_id_in_the_local_cache_imports_with_its_logits(tmp_path, cache, capsys):
    """A random-weights GPT-2 saved by transformers, laid out as `hf download` leaves it, imports by its id; its
    imported.json names the id and the snapshot's commit."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1,
                                                              n_head=2)).eval()
    hf.save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "README.md").write_text("---\nlicense: mit\n---\n# tiny-gpt2\n")
    cached_snapshot(cache, "tiny-org/tiny-gpt2", tmp_path / "saved")
    assert main(["import-hf", "tiny-org/tiny-gpt2", "--out", str(tmp_path / "ours")]) == 0
    assert "imported tiny-org/tiny-gpt2 (the cached" in capsys.readouterr().out
    idx = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert (from_pretrained(tmp_path / "ours")(idx).logits - hf(input_ids=idx).logits).abs().max().item() < 1e-4
    record = json.loads((tmp_path / "ours" / "imported.json").read_text())
    assert (record["repo_id"], record["revision"], record["license"]) == ("tiny-org/tiny-gpt2", SHA, "mit")


def test_an_id_absent_from_the_cache_is_one_line_and_writes_nothing(tmp_path, cache, capsys):
    assert main(["import-hf", "tiny-org/not-downloaded", "--out", str(tmp_path / "ours")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"not-downloaded is neither a folder nor in the local Hugging Face cache ({cache}" in err
    assert "hf download tiny-org/not-downloaded" in err and "Traceback" not in err
    assert not (tmp_path / "ours").exists()
    assert main(["import-hf", str(tmp_path / "no-such-folder"), "--out", str(tmp_path / "ours")]) == 2
    assert "Hugging Face model folder not found" in capsys.readouterr().err


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("push"), max_iters=2)


@pytest.fixture
def hub(monkeypatch):
    """A fake Hub named by HF_ENDPOINT with HF_TOKEN set; huggingface_hub online and on its plain LFS path (its Xet
    upload talks to a storage service this fake does not imitate)."""
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with FakeHub(TOKEN) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        yield fake


def test_export_push_uploads_every_file_through_the_hub_api(gpt_run, tmp_path, hub, capsys):
    out = tmp_path / "my-gpt"
    assert main(["export", str(gpt_run), "--out", str(out), "--push", "someone/my-gpt"]) == 0
    assert f"pushed to someone/my-gpt: {hub.endpoint}/someone/my-gpt/commit/" in capsys.readouterr().out
    sent = hub.repos["someone/my-gpt"]
    assert set(sent) == {p.name for p in out.iterdir()}
    assert all(sent[name] == (out / name).read_bytes() for name in sent)
    assert ("POST", "/api/validate-yaml") in hub.calls  # the card's metadata passed the Hub's check first
    assert ("POST", "/someone/my-gpt.git/info/lfs/objects/batch") in hub.calls  # the weights went by LFS
    assert hub.commits[0]["header"]["summary"] == "Upload my-gpt (attnlab export)"
    card = huggingface_hub.ModelCard((out / "README.md").read_text())
    assert 'from_pretrained("someone/my-gpt")' in card.text  # the card on the Hub loads the repo
    # a second push to the same repo: create_repo finds it (409, exist_ok) and the commit replaces the files
    assert main(["export", str(gpt_run), "--out", str(tmp_path / "again"), "--push", "someone/my-gpt"]) == 0
    assert len(hub.commits) == 2


def test_a_push_the_hub_refuses_is_one_line_and_keeps_the_folder(gpt_run, tmp_path, hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    out = tmp_path / "kept"
    assert main(["export", str(gpt_run), "--out", str(out), "--push", "someone/my-gpt"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the push to someone/my-gpt failed" in err
    assert f"hf upload someone/my-gpt {out}" in err
    assert (out / "model.safetensors").is_file() and hub.repos == {}


@pytest.mark.parametrize("repo, token, message", [
    ("not a repo id", TOKEN, "is not a model id"),
    ("someone/my-gpt", None, "--push needs a Hugging Face token"),
])
def test_push_refusals_come_before_any_work(gpt_run, tmp_path, monkeypatch, capsys, repo, token, message):
    monkeypatch.setattr(hub_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    assert main(["export", str(gpt_run), "--out", str(tmp_path / "out"), "--push", repo]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
