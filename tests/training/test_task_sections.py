"""Task options (images.*, mlm.*, classify.*, seq2seq.*, continuous.*) are refused in one line where the run's
task never reads them: ``train shakespeare-char min_len=1`` (an alias of seq2seq.min_len) used to train a
language model without it and exit 0."""

from __future__ import annotations

import dataclasses

import pytest

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.training.config import TrainConfig
from attnlab.training.runs import load_train_config
from attnlab.training.tasks.names import DEFAULT_TASK, SECTIONS, TASK_FAMILIES, TASK_SECTIONS, TASKS


def test_every_task_and_section_is_in_the_table():
    assert set(TASK_SECTIONS) == set(TASKS) == set(TASK_FAMILIES)
    assert {s for secs in TASK_SECTIONS.values() for s in secs} == set(SECTIONS)
    sections = {f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(f.default_factory)}
    assert sections - {"model"} == set(SECTIONS)


@pytest.mark.parametrize("override, section", [
    ("min_len=1", "seq2seq"), ("seq2seq.max_len=9", "seq2seq"), ("mlm.mask_prob=0.3", "mlm"),
    ("classify.test_fraction=0.3", "classify"), ("images.shift=3", "images"), ("continuous.n_mels=20", "continuous"),
])
def test_an_option_the_task_does_not_read_is_refused(override, section):
    with pytest.raises(ConfigError, match=rf"'{section}\.\w+' is not used: task lm reads no {section} options"):
        load_train_config(None, [override])


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_sections_a_task_reads_are_accepted(task):
    family = next((f for f, t in DEFAULT_TASK.items() if t == task), "bert")  # classify and regress: a bert
    for section in TASK_SECTIONS[task]:
        key = {"images": "images.split_seed=3", "mlm": "mlm.mask_prob=0.2", "classify": "classify.split_seed=3",
               "seq2seq": "seq2seq.n_train=100", "continuous": "continuous.split_seed=3"}[section]
        load_train_config(None, [f"family={family}", f"task={task}", key])


def test_the_cli_refuses_it_before_any_work(tmp_path, capsys):
    assert main(["train", "shakespeare-char", "min_len=1", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attnlab: error: 'seq2seq.min_len' is not used: task lm reads no seq2seq options "
                   "(task seq2seq does)")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("override, said", [
    ("tokenizer=bpe", "'tokenizer' is not used: task image-classification reads no text"),
    ("bpe_vocab_size=500", "'bpe_vocab_size' is not used"),
])
def test_text_options_are_refused_where_the_task_reads_no_text(override, said):
    from attnlab import presets

    with pytest.raises(ConfigError, match=said):
        load_train_config(presets.resolve("vit-digits"), [override])


@pytest.mark.parametrize("preset, overrides, said", [
    ("caption-micrographs", ["task=image-classification"], "task image-classification trains the vit or cnn family, "
                                                            "not model.family=captioner"),
    ("shakespeare-char", ["task=mlm"], "task mlm trains a bert encoder, not model.family=gpt"),
    # these two ended in "AttributeError: 'BertConfig' object has no attribute 'layer_mixer'"
    ("bert-mlm", ["task=lm"], "task lm trains the gpt family, not model.family=bert"),
    ("seq2seq-reverse", ["task=lm"], "task lm trains the gpt family, not model.family=seq2seq"),
    ("shakespeare-char", ["task=seq2seq"], "task seq2seq trains the seq2seq family, not model.family=gpt"),
    ("vit-digits", ["task=continuous"], "task continuous trains the encoder, recurrent or mlp family, not "
                                        "model.family=vit"),
])
def test_a_family_the_task_does_not_train_is_named_first_and_before_any_data(preset, overrides, said):
    """The caption preset's BPE options would otherwise be refused first, which is true but beside the point."""
    from attnlab import presets

    with pytest.raises(ConfigError, match=said):
        load_train_config(presets.resolve(preset), overrides)
