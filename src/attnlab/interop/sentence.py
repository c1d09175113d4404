"""sentence-transformers folders in and out: a BERT encoder plus the settings that make it a sentence
encoder.

    modules.json                 [Transformer (path ""), Pooling ("1_Pooling"), Normalize ("2_Normalize")]
    sentence_bert_config.json    {"max_seq_length": tokens per sentence, [CLS] and [SEP] included}
    1_Pooling/config.json        pooling_mode_mean_tokens or pooling_mode_cls_token
    config.json, model.safetensors, tokenizer files   the BERT itself, as ``transformers`` reads it

attnlab keeps the same settings in its model folder as ``sentence.json`` (``SentenceSettings``), which
``attnlab embed`` follows. Modules attnlab has no equivalent for (Dense layers, max or weighted pooling)
are refused in one line naming them, rather than dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.core.errors import CheckpointError
from attnlab.core.fileio import atomic_write_text
from attnlab.inspect.encoders import SentenceSettings
from attnlab.interop.bert import save_bert
from attnlab.interop.checks import JSON_LIMIT, file_present, read_json
from attnlab.interop.tokenizer_files import write_tokenizer_files

POOLING_MODES = {"mean": "pooling_mode_mean_tokens", "cls_token": "pooling_mode_cls_token"}
ALL_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
             "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


def is_sentence_transformers(directory: Path) -> bool:
    """Whether ``directory`` is a sentence-transformers folder (it has a modules.json: anything by that name
    that is not a regular file is refused, not skipped)."""
    return file_present(directory / "modules.json", "sentence-transformers modules file", JSON_LIMIT)


def _json(path: Path) -> object:
    """A sentence-transformers JSON file: a regular file of at most 16 MB (``checks.read_json``)."""
    return read_json(path, "sentence-transformers file")


def read_sentence_settings(directory: Path) -> SentenceSettings:
    """The max sequence length, pooling and normalisation of a sentence-transformers folder."""
    modules = _json(directory / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) and "type" in m for m in modules):
        raise CheckpointError(f"{directory / 'modules.json'} must list modules with a type")
    kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if kinds[:1] != ["Transformer"] or unknown or kinds.count("Pooling") != 1:
        raise CheckpointError(f"{directory / 'modules.json'}: modules {kinds}; attnlab reads Transformer, "
                              f"Pooling and an optional Normalize" + (f" (no equivalent for {unknown[0]})"
                                                                    if unknown else ""))
    if any(m.get("path") for m in modules if str(m["type"]).endswith("Transformer")):
        raise CheckpointError(f"{directory / 'modules.json'}: the Transformer module is in a sub-folder; "
                              "attnlab reads it from the folder itself")
    pooling_path = next(m.get("path", "") for m in modules if str(m["type"]).endswith("Pooling"))
    if not isinstance(pooling_path, str) or Path(pooling_path).is_absolute() or ".." in Path(pooling_path).parts:
        raise CheckpointError(f"{directory / 'modules.json'}: the Pooling module's path {pooling_path!r} is not a "
                              "sub-folder of the model folder")
    pooling_dir = directory / pooling_path
    pool = _json(pooling_dir / "config.json")
    on = [k for k in ALL_MODES if isinstance(pool, dict) and pool.get(k)]
    if len(on) != 1 or on[0] not in POOLING_MODES.values():
        raise CheckpointError(f"{pooling_dir / 'config.json'}: pooling {on or 'none'}; attnlab pools by mean "
                              "or the [CLS] token")
    pooling = next(k for k, v in POOLING_MODES.items() if v == on[0])
    max_len = None
    if file_present(directory / "sentence_bert_config.json", "sentence-transformers file", JSON_LIMIT):
        cfg = _json(directory / "sentence_bert_config.json")
        max_len = cfg.get("max_seq_length") if isinstance(cfg, dict) else None
    if max_len is not None and (not isinstance(max_len, int) or max_len < 3):
        raise CheckpointError(f"{directory / 'sentence_bert_config.json'}: max_seq_length {max_len!r} is not a "
                              "count of tokens >= 3")
    return SentenceSettings(max_seq_length=max_len, pooling=pooling, normalize="Normalize" in kinds)


def save_sentence_transformers(model, tokenizer, settings: SentenceSettings, directory: Path) -> list[str]:
    """Write a folder ``SentenceTransformer(directory)`` loads with attnlab's embeddings; return what it wrote."""
    if settings.pooling not in POOLING_MODES:
        raise CheckpointError(f"pooling={settings.pooling!r} (BERT's tanh pooler) has no sentence-transformers "
                              f"module; export with pooling {' or '.join(POOLING_MODES)}")
    max_len = min(settings.max_seq_length or model.config.block_size, model.config.block_size)
    save_bert(model, directory)
    written = ["config.json", "model.safetensors", *write_tokenizer_files(tokenizer, directory, max_len)]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if settings.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir()
    (directory / "1_Pooling").mkdir()
    pool = {"word_embedding_dimension": model.config.d_model, **{k: False for k in ALL_MODES}}
    pool[POOLING_MODES[settings.pooling]] = True
    files = {"modules.json": modules, "1_Pooling/config.json": pool,
             "sentence_bert_config.json": {"max_seq_length": max_len, "do_lower_case": False}}
    for name, content in files.items():
        atomic_write_text(directory / name, json.dumps(content, indent=2) + "\n")
    return written + list(files)
