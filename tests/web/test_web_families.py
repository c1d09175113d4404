"""The explorer for BERT (masked-token guesses) and ViT (image upload): what it computes, checked against
the models themselves, and every bound on an upload."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from attnlab.data.images import normalize
from attnlab.inspect.saliency import saliency_maps
from attnlab.models.registry import from_pretrained
from attnlab.training.runs import load_model_and_tokenizer
from attnlab.training.tasks.images import load_labels
from attnlab.web.model_adapter import MAX_IMAGE_SIDE, MAX_UPLOAD_BYTES
from attnlab.web.server import IMAGE_MAX_BODY_BYTES, create_app
from tests.helpers import with_patterns
from tests.web_helpers import train_tiny_bert, train_tiny_vit


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    return train_tiny_bert(tmp_path_factory.mktemp("explorer-bert"))


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    return train_tiny_vit(tmp_path_factory.mktemp("explorer-vit"))


@pytest.fixture(scope="module")
def bert(bert_run):
    with TestClient(create_app(bert_run)) as c:
        yield c


@pytest.fixture(scope="module")
def vit(vit_run):
    with TestClient(create_app(vit_run)) as c:
        yield c


def one_line_400(r, *fragments: str, status: int = 400) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert "\n" not in error and all(f in error for f in fragments), error


def png(size=(8, 8), mode="L", value=128, fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, value).save(buf, fmt)
    return buf.getvalue()


def noise_png() -> bytes:
    """An 8x8 PNG of random grey pixels (so its compressed data is long enough to cut in the middle)."""
    buf = io.BytesIO()
    Image.fromarray(torch.randint(0, 256, (8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
                    .numpy()).save(buf, "PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# ---------------------------------------------------------------- bert


def test_bert_maps_are_the_models_bidirectional_probabilities(bert, bert_run):
    text = "the quick brown fox"
    data = bert.post("/api/attention", json={"text": text}).json()
    model, tok = load_model_and_tokenizer(bert_run)
    ids = [tok.cls_id, *tok.encode(text), tok.sep_id]
    assert data["tokens"] == ["[CLS]", "the", "quick", "brown", "fox", "[SEP]"] and data["masked"] == []
    probs = torch.tensor(data["layers"])  # (L, H, T, T)
    with torch.no_grad():
        _, maps = with_patterns(model, torch.tensor([ids]))
    reference = torch.stack([m[0] for m in maps])
    assert probs.shape == (2, 2, 6, 6) and data["layer_index"] == [0, 1]
    assert torch.allclose(probs, reference, atol=1e-5)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 2, 6), atol=1e-4)
    later = torch.triu_indices(6, 6, offset=1)  # (query, key) pairs with the key after the query
    assert probs[:, :, later[0], later[1]].min() > 0  # bidirectional: every query sees the later keys too


def test_bert_mask_guesses_are_the_top10_of_the_mlm_head(bert, bert_run):
    typed = bert.post("/api/attention", json={"text": "the quick [MASK] fox"}).json()
    model, tok = load_model_and_tokenizer(bert_run)
    ids = [tok.cls_id, *tok.encode("the quick"), tok.mask_id, *tok.encode("fox"), tok.sep_id]
    assert typed["tokens"][3] == "[MASK]" and [m["position"] for m in typed["masked"]] == [3]
    with torch.no_grad():
        p = model(torch.tensor([ids]), with_mlm=True).mlm_logits[0, 3].softmax(-1)  # (V,)
    top = torch.topk(p, 10)
    guesses = typed["masked"][0]["guesses"]
    assert [g["id"] for g in guesses] == top.indices.tolist()
    assert torch.allclose(torch.tensor([g["p"] for g in guesses]), top.values, atol=1e-5)
    assert [g["token"] for g in guesses] == [tok.decode([i]) for i in top.indices.tolist()]
    # clicking a token (mask=[position]) is the same as typing [MASK] there
    clicked = bert.post("/api/attention", json={"text": "the quick brown fox", "mask": [3]}).json()
    assert clicked["masked"] == typed["masked"] and clicked["layers"] == typed["layers"]
    two = bert.post("/api/attention", json={"text": "[MASK] quick brown fox", "mask": [4]}).json()
    assert [m["position"] for m in two["masked"]] == [1, 4]


@pytest.mark.parametrize("body, message", [
    ({"text": ""}, "the text is empty"),
    ({"text": "fox " * 200}, "the explorer takes at most 256"),
    ({"text": "fox " * 40}, "more than the limit of 32"),
    ({"text": "the fox", "mask": [0]}, "cannot mask position 0"),
    ({"text": "the fox", "mask": [3]}, "positions 1 to 2"),
    ({"text": "the fox", "mask": ["1"]}, "bad request: mask"),
    ({"text": "the fox", "path": "/etc/passwd"}, "bad request: path"),
])
def test_bert_bad_input_is_a_one_line_400(bert, body, message):
    one_line_400(bert.post("/api/attention", json=body), message)


def test_bert_info_and_wrong_endpoint(bert):
    info = bert.get("/api/info").json()
    assert info["family"] == "bert" and info["input"] == "text" and info["mask_token"] == "[MASK]"
    assert "[MASK]" in info["example"] and info["max_body_bytes"] == 16 * 1024
    one_line_400(bert.post("/api/image", json={"image": b64(png())}), "takes text, not an image")


# ---------------------------------------------------------------- vit


def test_vit_maps_match_inspect_saliency(vit, vit_run):
    image = torch.arange(64, dtype=torch.uint8).reshape(8, 8) * 4  # a gradient
    buf = io.BytesIO()
    Image.fromarray(image.numpy()).save(buf, "PNG")
    data = vit.post("/api/image", json={"image": b64(buf.getvalue())}).json()
    model, labels = from_pretrained(vit_run), load_labels(vit_run)
    maps = saliency_maps(model, normalize(image[None, None], labels["mean"], labels["std"]))
    assert data["pixels"] == image.tolist() and data["grid"] == [2, 2] and data["layer_index"] == [0, 1]
    assert torch.allclose(torch.tensor(data["layers"]), maps.per_head, atol=1e-5)  # (L, H, gh, gw)
    assert torch.allclose(torch.tensor(data["rollout"]), maps.rollout, atol=1e-5)
    assert 0 < sum(map(sum, data["rollout"])) < 1  # [CLS]'s row of the rollout: the rest stays on [CLS]
    top = torch.topk(maps.probs, 5)
    assert [g["id"] for g in data["top5"]] == top.indices.tolist()
    assert [g["token"] for g in data["top5"]] == [labels["classes"][i] for i in top.indices.tolist()]
    assert torch.allclose(torch.tensor([g["p"] for g in data["top5"]]), top.values, atol=1e-5)


def test_vit_accepts_a_data_url_and_resizes_only_when_asked(vit):
    rgb = png(size=(16, 16), mode="RGB", value=(200, 10, 10))
    one_line_400(vit.post("/api/image", json={"image": b64(rgb)}), "16x16 pixels but the model takes 8x8",
                 "tick 'resize'")
    r = vit.post("/api/image", json={"image": "data:image/png;base64," + b64(rgb), "resize": True})
    assert r.status_code == 200
    grey = round(0.299 * 200 + 0.587 * 10 + 0.114 * 10)  # converted to the model's one channel (Pillow's L)
    assert r.json()["pixels"] == [[grey] * 8] * 8
    jpeg = vit.post("/api/image", json={"image": b64(png(mode="RGB", fmt="JPEG"))})
    assert jpeg.status_code == 200 and len(jpeg.json()["top5"]) == 5


@pytest.mark.parametrize("body, status, message", [
    ({"image": b64(b"this is not an image at all")}, 400, "not an image Pillow can read"),
    ({"image": b64(noise_png()[:70])}, 400, "corrupt or truncated"),
    ({"image": b64(png(size=(MAX_IMAGE_SIDE + 1, 1)))}, 400, f"at most {MAX_IMAGE_SIDE}x{MAX_IMAGE_SIDE}"),
    ({"image": ""}, 400, "the upload is empty"),
    ({"image": "not base64!"}, 400, "not valid base64"),
    ({"image": "data:image/png," + b64(png())}, 400, "base64-encoded"),
    ({"image": b64(bytes(MAX_UPLOAD_BYTES + 1))}, 413, f"limit of {MAX_UPLOAD_BYTES}"),
    ({"image": b64(png()), "path": "/etc/passwd"}, 400, "bad request: path"),
    ({"image": b64(png()), "resize": "yes"}, 400, "bad request: resize"),
    ({"path": "/etc/passwd"}, 400, "bad request"),
])
def test_vit_bad_uploads_are_one_line_errors(vit, body, status, message):
    one_line_400(vit.post("/api/image", json=body), message, status=status)


def test_vit_body_limit_and_text_endpoint(vit):
    info = vit.get("/api/info").json()
    assert info["input"] == "image" and info["image_size"] == 8 and info["in_channels"] == 1
    assert info["max_upload_bytes"] == MAX_UPLOAD_BYTES and info["max_body_bytes"] == IMAGE_MAX_BODY_BYTES
    big = json.dumps({"image": "A" * IMAGE_MAX_BODY_BYTES})
    r = vit.post("/api/image", content=big, headers={"content-type": "application/json"})
    one_line_400(r, "request body too large", status=413)
    one_line_400(vit.post("/api/attention", json={"text": "hello"}), "takes an image")
    assert vit.get("/").status_code == 200
