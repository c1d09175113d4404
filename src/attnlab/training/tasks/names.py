"""Task names: which tasks exist, and which one a model family trains on by default.

A table only (no task code is imported), so a config can check a name without pulling in the tasks.
"""

from __future__ import annotations

from attnlab.core.errors import ConfigError
from attnlab.core.schema import did_you_mean

# task -> "module:Class"; imported lazily (the modules pull in torch and the data loaders)
TASKS: dict[str, str] = {
    "lm": "attnlab.training.tasks.lm:LanguageModelTask",
    "image-classification": "attnlab.training.tasks.images:ImageClassificationTask",
    "mlm": "attnlab.training.tasks.mlm:MaskedLanguageModelTask",
    "classify": "attnlab.training.tasks.classify:ClassifyTask",
    "regress": "attnlab.training.tasks.regress:RegressTask",
    "token-classification": "attnlab.training.tasks.tokens:TokenClassificationTask",
    "question-answering": "attnlab.training.tasks.qa:QuestionAnsweringTask",
    "seq2seq": "attnlab.training.tasks.seq2seq:Seq2SeqTask",
    "continuous": "attnlab.training.tasks.continuous:ContinuousTask",
    "mae": "attnlab.training.tasks.mae:MaskedImageTask",
    "caption": "attnlab.training.tasks.caption:CaptionTask",
    "dino": "attnlab.training.tasks.dino:SelfDistillationTask",
}

# the sections of task options (TrainConfig.images, .mlm, ...) each task reads; a section set away from its
# defaults for a task that reads none of it is refused (seq2seq.min_len on a language model did nothing)
TASK_SECTIONS: dict[str, tuple[str, ...]] = {
    "lm": (),
    "image-classification": ("images",),
    "mae": ("images",),
    "caption": ("images",),
    "dino": ("images",),
    "mlm": ("mlm",),
    "classify": ("classify",),
    "regress": ("classify",),
    "token-classification": ("classify",),
    "question-answering": ("classify",),
    "seq2seq": ("seq2seq",),
    "continuous": ("continuous",),
}
SECTIONS = ("images", "mlm", "classify", "seq2seq", "continuous")
# the tasks that build a tokenizer (tokenizer=, bpe_vocab_size=)
TOKENIZED = ("lm", "caption", "classify", "regress", "mlm", "seq2seq", "token-classification", "question-answering")

# the model families a task trains; checked before any other task option
TASK_FAMILIES: dict[str, tuple[str, ...]] = {
    "lm": ("gpt",),
    "seq2seq": ("seq2seq",),
    "image-classification": ("vit", "cnn"),
    "mae": ("mae",),
    "caption": ("captioner",),
    "dino": ("dino",),
    "continuous": ("encoder", "recurrent", "mlp"),
    "mlm": ("bert",),
    "classify": ("bert",),
    "regress": ("bert",),
    "token-classification": ("bert",),
    "question-answering": ("bert",),
}


def check_family(task: str, family: str) -> None:
    """ConfigError where ``task`` does not train model family ``family``."""
    families = TASK_FAMILIES[task]
    if family not in families:
        what = ("a bert encoder" if families == ("bert",) else
                f"the {', '.join(families[:-1]) + ' or ' if len(families) > 1 else ''}{families[-1]} family")
        raise ConfigError(f"task {task} trains {what}, not model.family={family}")


# the BERT heads (model.head_type) a task trains; tasks not listed read no head
TASK_HEADS: dict[str, tuple[str, ...]] = {
    "classify": ("sequence",),
    "regress": ("sequence",),
    "token-classification": ("token", "sequence"),  # the task sets its own: token
    "question-answering": ("span", "sequence"),  # span
}


def check_head(task: str, model) -> None:
    """ConfigError where ``model`` (a model config) has a BERT head (model.head_type) that ``task`` does not train."""
    head = getattr(model, "head_type", None)
    if head is not None and task in TASK_HEADS and head not in TASK_HEADS[task]:
        raise ConfigError(f"task {task} trains model.head_type={TASK_HEADS[task][0]}, not model.head_type={head}")


# the task a family trains on when the config names none
DEFAULT_TASK: dict[str, str] = {
    "gpt": "lm",
    "vit": "image-classification",
    "cnn": "image-classification",
    "bert": "mlm",
    "seq2seq": "seq2seq",
    "encoder": "continuous",
    "mae": "mae",
    "recurrent": "continuous",
    "captioner": "caption",
    "dino": "dino",
    "mlp": "continuous",
}


def task_name(task: str | None, family: str) -> str:
    """The task a run trains on: ``task``, else the default of the model ``family``."""
    name = task or DEFAULT_TASK.get(family)
    if name is None:
        raise ConfigError(f"model family '{family}' has no default task; set task= to one of {sorted(TASKS)}")
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}'{did_you_mean(name, TASKS) or f'; choose one of {sorted(TASKS)}'}")
    return name
