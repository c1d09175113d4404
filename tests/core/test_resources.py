"""Work that cannot fit is refused in one line before it starts (core/resources.py): the generators of
`attnlab data` with an absurd --n ran into a MemoryError (exit 1) or for minutes towards a full disk."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.core import resources
from attnlab.core.errors import ConfigError, DataError
from tests.helpers import train_tiny_run, write_corpus


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny trained GPT run and its corpus, shared by the tests that only read them."""
    tmp = tmp_path_factory.mktemp("resources")
    return train_tiny_run(tmp), write_corpus(tmp / "c.txt")


def test_check_room_refuses_memory_and_disk_beyond_what_is_free(monkeypatch, tmp_path):
    monkeypatch.setattr(resources, "available_memory", lambda: 2**30)
    monkeypatch.setattr(resources, "free_disk", lambda path: 3 * 2**30)
    resources.check_room("fits", memory=2**30, disk=3 * 2**30, where=tmp_path)  # exactly what is free: fine
    with pytest.raises(ConfigError, match=r"^too big would take about 2\.0 GiB of memory, and this machine has "
                                          r"1\.0 GiB available; smaller$"):
        resources.check_room("too big", memory=2**31, advice="smaller")
    with pytest.raises(DataError, match=r"would take about 4\.0 GiB of disk, and .* has 3\.0 GiB free"):
        resources.check_room("files", disk=4 * 2**30, where=tmp_path, error=DataError)


def test_free_disk_of_a_path_not_yet_made_is_its_parents(tmp_path):
    assert resources.free_disk(tmp_path / "a" / "b") == resources.free_disk(tmp_path) > 0


@pytest.mark.parametrize("argv, need", [
    (["data", "micrographs", "--n", "1000000000"], "of memory"),
    (["data", "spoken-words", "--n", "100000000"], "of disk"),  # 1 s WAVs: 3 TB, refused before any synthesis
])
def test_an_absurd_generated_data_set_is_one_line_before_any_work(tmp_path, capsys, argv, need):
    out = tmp_path / "out"
    try:
        code = main([*argv, "--out", str(out)])
    except SystemExit as e:  # the spoken words' optional packages missing: refused too, also in one line
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    if "not installed" not in err and "pip install" not in err:
        assert need in err and "use a smaller --n" in err
    assert not out.exists() or not any(out.iterdir())


def test_heads_refuses_more_batches_than_memory_holds(tiny, tmp_path, capsys):
    """The batches are kept (the ablation pass reuses them): 10^9 of them grew until killed. Such a count is
    refused as a count; the most batches allowed, of a batch size far beyond memory, by their memory."""
    run, corpus = tiny
    capsys.readouterr()
    for n, size, says in (("1000000000", "16", "--n-batches 1,000,000,000 is more than 10,000"),
                          ("10000", "100000", "10,000 batches of 100000 x")):
        assert main(["heads", str(run), "--data", str(corpus), "--n-batches", n, "--batch-size", size,
                     "--out", str(tmp_path / "h")]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "h").exists()


def test_sample_refuses_more_beams_than_memory_holds_and_the_lens_more_tokens_than_the_vocabulary(tiny, capsys):
    """--num-beams 10^6 ran for minutes (10^8: an allocation error, exit 1); --k past the vocabulary: exit 1."""
    run, _ = tiny
    capsys.readouterr()
    assert main(["sample", str(run), "--num-beams", "100000000", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "use a smaller --num-beams" in err and len(err.splitlines()) == 1
    assert main(["lens", "logit-lens", str(run), "--text", "the cat", "--k", "100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "more than the" in err and "vocabulary" in err and len(err.splitlines()) == 1
